//! CPU time and RSS of watched processes, and the kernel name of each of their
//! threads: the proc probe's captures, as COLUMNS and read_thread_names in
//! daskprobe/probes/procfs.py define them (docs/formats.md):
//!     proc.tsv     t_ns  pid  utime_ticks  stime_ticks  rss_pages  cpu_ns
//!     threads.tsv  pid  tid  comm
//! Read every PERIOD at the sampler's own wakes: a timed wait costs a VM
//! 60-110 µs of CPU, more than a reading of every process, and daskprobe's thread
//! that woke for them alone was a fifth of what measuring cost on 10 ms tasks.
//!
//! A reading is one pread of /proc/PID/stat per process, from a file kept
//! open, and its CPU clock (CPU time in ns, where stat counts 10 ms ticks: a
//! probe's few ms a second are read to the microsecond). Threads are listed
//! once a second in the processes whose thread count changed, every 10 s and
//! at the end in all (listing them all each second was a quarter of the cost).

use crate::procstat::after_comm;
use daskprobe_clock::now_ns;
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::{Duration, Instant};

pub const PERIOD: Duration = Duration::from_millis(200);
/// readings between listings of the threads of processes whose count changed: once a second
const NAMES_EVERY: u32 = 5;
/// and of every process's, for a thread that ended as another started
const ALL_NAMES_EVERY: u32 = 50;

struct Watched {
    stat: File,
    /// its thread count at the last reading
    threads: u64,
}

pub struct Procs {
    out: BufWriter<File>,
    names: BufWriter<File>,
    watched: HashMap<i32, Watched>,
    named: HashSet<(i32, u64)>,
    changed: HashSet<i32>,
    readings: u32,
    next: Instant,
    /// when the last reading was taken
    read_at: Option<Instant>,
    /// a write failed (a full disk): nothing more is read
    stopped: bool,
}

/// A capture opened for appending, never through a symlink planted where it goes (ELOOP instead).
pub fn append(path: &str) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o644).custom_flags(libc::O_NOFOLLOW).open(path)
}

impl Procs {
    pub fn open(proc_path: &str, threads_path: &str) -> io::Result<Procs> {
        Ok(Procs { out: BufWriter::new(append(proc_path)?), names: BufWriter::new(append(threads_path)?),
                   watched: HashMap::new(), named: HashSet::new(), changed: HashSet::new(), readings: 0,
                   next: Instant::now(), read_at: None, stopped: false })
    }

    pub fn watch(&mut self, pid: i32) {
        if let Ok(stat) = File::open(format!("/proc/{pid}/stat")) {
            self.watched.insert(pid, Watched { stat, threads: 0 });
        }
    }

    /// How long until the next reading is due.
    pub fn due_in(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }

    /// A reading if one is due, or nearly: wakes come every 200 ms, and one a little early must
    /// not push the reading to the next.
    pub fn maybe(&mut self) {
        let now = Instant::now();
        if self.stopped || now + PERIOD / 4 < self.next {
            return;
        }
        self.next = (self.next + PERIOD).max(now + PERIOD / 2); // fell behind: skip, don't burst
        self.read();
        if self.readings % ALL_NAMES_EVERY == 0 {
            self.changed = self.watched.keys().copied().collect();
        }
        if self.readings % NAMES_EVERY == 0 {
            self.name_threads();
        }
        self.readings += 1;
        self.flush();
    }

    /// The last reading (unless one was just taken), and every thread's name.
    pub fn finish(&mut self) {
        if self.stopped {
            return;
        }
        if self.read_at.is_none_or(|at| at.elapsed() >= PERIOD / 2) {
            self.read();
        }
        self.changed = self.watched.keys().copied().collect();
        self.name_threads();
        self.flush();
    }

    /// After a failed write (a full disk) nothing more is read; what was written stays readable.
    fn flush(&mut self) {
        if let Err(e) = self.out.flush().and_then(|_| self.names.flush()) {
            crate::capture_stopped("--proc or --threads", &e);
            self.stopped = true;
        }
    }

    fn read(&mut self) {
        self.read_at = Some(Instant::now());
        let mut buf = [0u8; 1024];
        let mut gone = Vec::new();
        for (&pid, w) in self.watched.iter_mut() {
            let Some(f) = w.stat.read_at(&mut buf, 0).ok().and_then(|n| Stat::parse(&buf[..n])) else {
                gone.push(pid); // reaped (ESRCH): a new process may take its pid
                continue;
            };
            // exiting (its memory already gone) or exited: nothing left to measure
            let Some(cpu) = (!f.ended && f.rss > 0).then(|| cpu_ns(pid)).flatten() else { continue };
            let _ = writeln!(self.out, "{}\t{pid}\t{}\t{}\t{}\t{cpu}", now_ns(), f.utime, f.stime, f.rss);
            if w.threads != f.threads {
                w.threads = f.threads;
                self.changed.insert(pid);
            }
        }
        for pid in gone {
            self.watched.remove(&pid);
            self.changed.remove(&pid);
        }
    }

    fn name_threads(&mut self) {
        for pid in std::mem::take(&mut self.changed) {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
            for tid in tasks.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok()) {
                if self.named.contains(&(pid, tid)) {
                    continue;
                }
                let Ok(comm) = std::fs::read(format!("/proc/{pid}/task/{tid}/comm")) else { continue };
                self.named.insert((pid, tid));
                // 15 bytes, cut where they fall: a character cut short reads as U+FFFD
                let comm = String::from_utf8_lossy(&comm).trim_end_matches('\n').replace(['\t', '\n'], " ");
                let _ = writeln!(self.names, "{pid}\t{tid}\t{comm}");
            }
        }
    }
}

/// The fields of /proc/PID/stat a reading keeps.
#[derive(Debug, PartialEq)]
struct Stat {
    ended: bool,
    utime: u64,
    stime: u64,
    threads: u64,
    rss: u64,
}

impl Stat {
    /// After the command name, which may hold spaces and parentheses: [0] the state, [11] and [12]
    /// utime and stime in ticks, [17] the thread count, [21] RSS in pages.
    fn parse(text: &[u8]) -> Option<Stat> {
        let f: Vec<&str> = std::str::from_utf8(after_comm(text)?).ok()?.split_whitespace().collect();
        let n = |i: usize| f.get(i)?.parse::<u64>().ok();
        Some(Stat { ended: matches!(*f.first()?, "Z" | "X"), utime: n(11)?, stime: n(12)?, threads: n(17)?,
                    rss: n(21)? })
    }
}

/// CPU time (user + system, every thread's, ended ones' too) the process has used so far, in ns, from
/// its CPU clock (clock_getcpuclockid's); None once it is gone.
pub fn cpu_ns(pid: i32) -> Option<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let clock = ((!pid) << 3) | 2; // CPUCLOCK_SCHED of the whole process
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_follow_the_last_parenthesis() {
        let line = b"42 (a) b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 5 0 99 123456 789 18446744073709551615";
        assert_eq!(Stat::parse(line), Some(Stat { ended: false, utime: 7, stime: 3, threads: 5, rss: 789 }));
        assert_eq!(Stat::parse(b"42 (x) Z 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 99 0 0 0").unwrap().ended, true);
        assert_eq!(Stat::parse(b"42 (x) S 1 2"), None);
    }

    #[test]
    fn our_cpu_clock_is_what_the_process_counts() {
        let mine = |clock| {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            unsafe { libc::clock_gettime(clock, &mut ts) };
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        };
        let before = mine(libc::CLOCK_PROCESS_CPUTIME_ID);
        let read = cpu_ns(std::process::id() as i32).unwrap();
        assert!(before <= read && read <= mine(libc::CLOCK_PROCESS_CPUTIME_ID));
    }
}
