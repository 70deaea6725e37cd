//! Which threads are on a CPU, from the kernel: a cpu-clock perf event on
//! each CPU ticks at the sampling rate, skipping the idle task. At a tick
//! of a Python thread our reader knows, BPF copies its frames into a ring
//! the sampler drains every 200 ms (tickprog.rs); one of a thread known
//! not to be Python's is dropped; any other tick of a sampled process writes
//! the thread it found running into that CPU's ring, waking the sampler,
//! which then reads only that thread's stack. So what
//! sampling costs follows the CPU the cluster uses, not its threads times the
//! rate; and a tick is an interrupt, so a busy machine delays no copy and,
//! for a tick the sampler reads, the read, not the choice of thread
//! (polling /proc, a sampler waiting for a CPU finds threads off one).
//!
//! A CPU's period is drawn anew, uniform within half the mean either side,
//! once PERIOD_TICKS ticks have reached the sampler since the last draw, at a
//! wake-up within a tenth of a period after that CPU's last tick: at a fixed
//! period, a thread that wakes on a timer of about that period (Dask's
//! profiler, an event loop's callbacks, every 10 ms) is found always or
//! never. A new period restarts the CPU's timer from the call, so a call far
//! from the last tick would lose the time since (5% of the ticks, drawing at
//! every drain); with BPF copying the stacks, a busy CPU's period is drawn
//! about once a second. (Drawing one per tick doubled what a tick cost the
//! sampler: the call interrupts that CPU.) So each tick carries the period it
//! ended: a period held a second makes a thread's tick count over that second
//! its CPU time over that period, not over the mean (67 to 131 ticks for 93
//! mean periods of CPU, in one test's runs).

use crate::jitter::Jitter;
use crate::remote::{u32_at, u64_at};
use crate::tickprog::{TickProgram, Walk, AT_CPU, AT_TIME, PERF_EVENT_IOC_SET_BPF};
use std::io::Error;
use std::time::Duration;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const EXCLUDE_IDLE: u64 = 1 << 7;
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const PERIOD_TICKS: u32 = 2;
/// a period is drawn only within this fraction of a period after the CPU's last tick
const REDRAW_WITHIN: u64 = 10;
/// _IOW('$', 4, __u64)
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;
/// data pages per CPU: 2,048 ticks of 16 bytes, 20 s at 100 Hz without a read
const DATA_PAGES: usize = 8;
/// where perf_event_mmap_page keeps data_head and data_tail
const HEAD: usize = 1024;
const TAIL: usize = 1032;

/// perf_event_attr as of PERF_ATTR_SIZE_VER1, which every kernel since 2.6.33 takes.
#[repr(C)]
#[derive(Default)]
struct Attr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
}

struct Ring {
    fd: libc::c_int,
    cpu: u32,
    base: *mut u8,
    page: usize,
    /// ticks since its period was last drawn
    ticks: u32,
    /// when BPF last copied a stack at one of its ticks (0: never)
    copied_at: u64,
    /// its period (ns), and, until when its last draw returned, the one before
    period: u64,
    before: (u64, u64),
}

/// A tick that woke the sampler: the thread it found on its CPU, and the CPU time it stands for (ns).
#[derive(Clone, Copy)]
pub struct Tick {
    pub pid: i32,
    pub tid: u64,
    pub period: u64,
}

pub struct Ticks {
    rings: Vec<Ring>,
    /// the rings', then `wake`'s, then the timer's
    poll: Vec<libc::pollfd>,
    wake: libc::c_int,
    timer: libc::c_int,
    /// the mean period, ns
    period: u64,
    /// draws the periods
    jitter: Jitter,
    /// None where BPF programs cannot be loaded: then every process's ticks wake the sampler
    program: Option<TickProgram>,
    /// BPF's clock is the kernel's: in a time namespace, this much behind ours
    timens: i64,
}

/// A stack BPF copied at a tick: its record (tickprog.rs), the tick's time on this process's clock and
/// the CPU time it stands for (ns).
pub struct Copied {
    pub pid: i32,
    pub time: u64,
    pub period: u64,
    pub record: Vec<u8>,
}

impl Ticks {
    /// One event per online CPU, each ticking `rate` times a second of that CPU's busy time; `wake`, an
    /// eventfd, ends a wait too, and so does a timer every `every` (a timerfd: a timeout of each wait
    /// would set a timer at each tick, a trap to the hypervisor on a VM). Only the processes given to
    /// `watch` tick, unless the filter could not be loaded (said on stderr).
    pub fn open(rate: f64, wake: libc::c_int, every: Duration) -> Result<Ticks, String> {
        let cpus = online_cpus()?;
        let program = TickProgram::load(cpus.len(), rate)
            .map_err(|e| log!("no tick filter ({e}): ticks of every process wake the sampler"))
            .ok();
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let attr = Attr {
            kind: PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<Attr>() as u32,
            config: PERF_COUNT_SW_CPU_CLOCK,
            sample_period: (1e9 / rate) as u64,
            sample_type: PERF_SAMPLE_TID,
            flags: EXCLUDE_IDLE,
            wakeup_events: 1,
            ..Attr::default()
        };
        let mut rings = Vec::new();
        for cpu in cpus {
            let fd = unsafe {
                libc::syscall(libc::SYS_perf_event_open, &attr as *const Attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC)
            } as libc::c_int;
            if fd < 0 {
                return Err(format!("perf_event_open on CPU {cpu}: {}", Error::last_os_error()));
            }
            let len = (1 + DATA_PAGES) * page;
            let base = unsafe {
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
            };
            if base == libc::MAP_FAILED {
                let e = Error::last_os_error();
                unsafe { libc::close(fd) };
                return Err(format!("mapping CPU {cpu}'s ring: {e}"));
            }
            let period = attr.sample_period;
            rings.push(Ring { fd, cpu: cpu as u32, base: base as *mut u8, page, ticks: 0, copied_at: 0, period,
                              before: (0, period) });
            if let Some(f) = &program {
                if unsafe { libc::ioctl(fd, PERF_EVENT_IOC_SET_BPF, f.prog) } < 0 {
                    // its ticks all wake the sampler, which keeps those of its processes
                    log!("no tick filter on CPU {cpu}: {}", Error::last_os_error());
                }
            }
        }
        let timer = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) };
        let interval = libc::timespec { tv_sec: every.as_secs() as _, tv_nsec: every.subsec_nanos() as _ };
        let spec = libc::itimerspec { it_interval: interval, it_value: interval };
        if timer < 0 || unsafe { libc::timerfd_settime(timer, 0, &spec, std::ptr::null_mut()) } < 0 {
            let e = Error::last_os_error();
            if timer >= 0 {
                unsafe { libc::close(timer) };
            }
            return Err(format!("timerfd: {e}"));
        }
        let poll = rings.iter().map(|r| r.fd).chain([wake, timer])
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
        Ok(Ticks { rings, poll, wake, timer, period: attr.sample_period, jitter: Jitter::new(), program,
                   timens: daskprobe_clock::timens_ns() })
    }

    /// From now on, `pid`'s ticks are kept: its Python threads' stacks copied as `walk` says (given
    /// with `thread`), the others' ticks waking the sampler.
    pub fn watch(&self, pid: i32, walk: Walk) {
        if let Some(p) = &self.program {
            p.watch(pid, walk);
        }
    }

    pub fn unwatch(&self, pid: i32) {
        if let Some(p) = &self.program {
            p.unwatch(pid);
        }
    }

    /// The PyThreadState of `pid`'s thread `tid` (None: no longer known), for BPF to read its stack at its
    /// ticks.
    pub fn thread(&self, pid: i32, tid: u64, tstate: Option<u64>) {
        if let Some(p) = &self.program {
            p.thread(pid, tid, tstate);
        }
    }

    /// Waits for a tick, `wake` or the timer (a signal ends the wait too); true when the timer went off.
    pub fn wait(&mut self) -> bool {
        let n = self.poll.len();
        unsafe { libc::ppoll(self.poll.as_mut_ptr(), n as libc::nfds_t, std::ptr::null(), std::ptr::null()) };
        let mut count = 0u64;
        if self.poll[n - 2].revents & libc::POLLIN != 0 {
            unsafe { libc::eventfd_read(self.wake, &mut count) };
        }
        let timer = self.poll[n - 1].revents & libc::POLLIN != 0;
        if timer {
            unsafe { libc::read(self.timer, &mut count as *mut u64 as *mut libc::c_void, 8) };
        }
        timer
    }

    /// Every tick since the last drain that the sampler is to read; and the stacks BPF copied at the others.
    pub fn drain(&mut self, into: &mut Vec<Tick>, copied: &mut Vec<Copied>) {
        into.clear();
        copied.clear();
        if let Some(copier) = self.program.as_ref().and_then(|p| p.copier.as_ref()) {
            let (rings, timens) = (&mut self.rings, self.timens);
            copier.ring.drain(|rec| {
                let (cpu, time) = (u32_at(rec, AT_CPU), u64_at(rec, AT_TIME).wrapping_add_signed(timens));
                let mut period = 0;
                if let Some(r) = rings.iter_mut().find(|r| r.cpu == cpu) {
                    r.ticks += 1;
                    r.copied_at = r.copied_at.max(time);
                    // a new period's first tick comes at least half a period after its draw returned
                    period = if time < r.before.0 { r.before.1 } else { r.period };
                }
                copied.push(Copied { pid: (u64_at(rec, 0) >> 32) as i32, time, period, record: rec.to_vec() });
            });
        }
        let now = daskprobe_clock::now_ns();
        for i in 0..self.rings.len() {
            let r = &mut self.rings[i];
            let before = into.len();
            r.drain(into);
            let woke = into.len() > before;
            r.ticks += (into.len() - before) as u32;
            // A new period restarts the CPU's timer: called far from its last tick, the time since
            // that tick would count for no tick (5% of the CPU time at a draw every 100 ms).
            let just_ticked = woke || now.saturating_sub(r.copied_at) < self.period / REDRAW_WITHIN;
            if r.ticks >= PERIOD_TICKS && just_ticked {
                r.ticks = 0;
                let period = self.jitter.around(self.period);
                let r = &mut self.rings[i];
                if unsafe { libc::ioctl(r.fd, PERF_EVENT_IOC_PERIOD, &period as *const u64) } == 0 {
                    // a tick in the ring now, not yet drained, ended the old period
                    (r.before, r.period) = ((daskprobe_clock::now_ns(), r.period), period);
                }
            }
        }
    }
}

impl Ring {
    /// Its ticks since the last drain. One that came after this drain's read of the ring and before a
    /// new period was drawn (a few µs, once a second or so) is given the new period at the next drain.
    fn drain(&self, into: &mut Vec<Tick>) {
        let size = DATA_PAGES * self.page;
        let data = unsafe { std::slice::from_raw_parts(self.base.add(self.page), size) };
        let head = unsafe { std::ptr::read_volatile(self.base.add(HEAD) as *const u64) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let mut tail = unsafe { std::ptr::read_volatile(self.base.add(TAIL) as *const u64) };
        while tail < head {
            // a record may wrap around the ring's end
            let mut rec = [0u8; 16];
            for (i, b) in rec.iter_mut().enumerate() {
                *b = data[(tail as usize + i) % size];
            }
            let kind = u32_at(&rec, 0);
            let len = u16::from_ne_bytes(rec[6..8].try_into().unwrap()) as u64;
            if kind == PERF_RECORD_SAMPLE && len >= 16 {
                into.push(Tick { pid: u32_at(&rec, 8) as i32, tid: u32_at(&rec, 12) as u64, period: self.period });
            }
            tail += len.max(8);
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        unsafe { std::ptr::write_volatile(self.base.add(TAIL) as *mut u64, head) };
    }
}

impl Drop for Ticks {
    fn drop(&mut self) {
        unsafe { libc::close(self.timer) };
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, (1 + DATA_PAGES) * self.page);
            libc::close(self.fd);
        }
    }
}

/// "0-3,6" in /sys/devices/system/cpu/online
fn online_cpus() -> Result<Vec<i32>, String> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").map_err(|e| format!("online CPUs: {e}"))?;
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (i32, i32) = (a.parse().map_err(|_| format!("online CPUs: {text}"))?,
                                  b.parse().map_err(|_| format!("online CPUs: {text}"))?);
        cpus.extend(a..=b);
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's CPU time, ns: ticks follow it, not the wall clock (on a busy machine the thread
    /// is off a CPU much of the time).
    fn cpu_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// Calls `step` in a loop (at least once) until it returns true or this thread has had `cpu_ms`
    /// of CPU; a wall-clock minute bounds a machine so busy that the thread gets almost none.
    /// Returns whether `step` said done.
    fn spin_cpu(cpu_ms: u64, mut step: impl FnMut() -> bool) -> bool {
        let (start, cpu0) = (std::time::Instant::now(), cpu_ns());
        loop {
            if step() {
                return true;
            }
            if cpu_ns() - cpu0 >= cpu_ms * 1_000_000 {
                return false;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "{cpu_ms} ms of CPU not had in a minute");
        }
    }

    /// A spinning thread's ticks stand for the CPU time the kernel counts for it (not the wall time: on
    /// a busy machine it is off a CPU part of it).
    #[test]
    fn a_spinning_thread_s_ticks_add_up_to_its_cpu_time() {
        let Ok(mut t) = Ticks::open(100.0, -1, Duration::from_secs(1)) else { return }; // no perf events here (not root): nothing to test
        t.watch(std::process::id() as i32, Walk::default());
        let tid = unsafe { libc::gettid() } as u64;
        let cpu0 = cpu_ns();
        let (mut on, mut copied) = (Vec::new(), Vec::new());
        let mut seen = 0;
        let mine = |on: &[Tick]| on.iter().filter(|k| k.tid == tid).map(|k| k.period).sum::<u64>();
        spin_cpu(600, || {
            t.drain(&mut on, &mut copied);
            seen += mine(&on);
            false
        });
        let expected = (cpu_ns() - cpu0) as f64 / 1e7;
        t.drain(&mut on, &mut copied);
        let seen = (seen + mine(&on)) as f64 / 1e7;
        // +-1.5 periods at each end (a period starts when the event is enabled), and, where the thread
        // shares its CPU, a tick finds it there by chance: three standard deviations of that
        assert!((seen - expected).abs() <= 3.0 + 3.0 * expected.sqrt(), "ticks for {seen:.1} periods, {expected:.1} of CPU");
    }

    /// Ticks of this process that woke the sampler, while this thread has `cpu_ms` of CPU, or until
    /// `enough` of them (0: no limit).
    fn spin_ticks(t: &mut Ticks, cpu_ms: u64, enough: usize) -> usize {
        let (mut on, mut copied, mut seen) = (Vec::new(), Vec::new(), 0);
        let me = std::process::id() as i32;
        spin_cpu(cpu_ms, || {
            t.drain(&mut on, &mut copied);
            seen += on.iter().filter(|k| k.pid == me).count();
            enough > 0 && seen >= enough
        });
        seen
    }

    /// The ticks of a process not watched, or no longer, do not reach the rings. Once watched, this
    /// thread alone should have about 100 in a second of its CPU: 10 by then is the bar.
    #[test]
    fn only_watched_processes_tick() {
        let Ok(mut t) = Ticks::open(100.0, -1, Duration::from_secs(1)) else { return };
        assert!(t.program.is_some(), "perf events but no BPF filter, as root");
        assert_eq!(spin_ticks(&mut t, 300, 0), 0, "ticks of a process not watched");
        t.watch(std::process::id() as i32, Walk::default());
        let seen = spin_ticks(&mut t, 1000, 10);
        assert!(seen >= 10, "{seen} ticks in a second of this thread's CPU once watched");
        t.unwatch(std::process::id() as i32);
        spin_ticks(&mut t, 20, 0); // a tick already in a ring when unwatched
        assert_eq!(spin_ticks(&mut t, 300, 0), 0, "ticks after unwatch");
    }

    /// BPF copies the frames of a thread it was given, at its ticks, leaf first, each reached from
    /// the one before by its `back` field, from the thread state's pointer through a _PyCFrame (3.12's
    /// places), with the thread's ids (3.10's native id through its pthread) and the GIL's state; a
    /// chain deeper than it copies stops at MAX_DEPTH; a thread marked NOT_PYTHON is dropped. Its
    /// ground truth: chains built here. Counts are per second of this thread's CPU (about 100 ticks).
    #[test]
    fn a_known_thread_s_frames_are_copied_at_its_ticks() {
        use crate::tickprog::{AT_COUNT, AT_FIRST_LINE, AT_FRAMES, AT_GIL, AT_IDENT, AT_NATIVE_TID, AT_PRINT, AT_TSTATE,
                              MAX_DEPTH, NONE, NOT_PYTHON, SLOT};
        let Ok(mut t) = Ticks::open(100.0, -1, Duration::from_secs(1)) else { return };
        // each frame's code object: its first line at 4 (Walk.first_line), then the 3 words BPF copies of it (Walk.print 8)
        let codes: Vec<Box<[u64; 4]>> = (1..MAX_DEPTH as u64 + 6).map(|i| Box::new([(i + 7) << 32, i, i << 8, i << 16])).collect();
        let chain = |n: usize| -> Vec<Box<[u64; 9]>> {
            let mut frames: Vec<Box<[u64; 9]>> = (0..n).map(|i| Box::new([codes[i].as_ptr() as u64; 9])).collect();
            for i in 0..n {
                frames[i][1] = frames.get(i + 1).map_or(0, |f| f.as_ptr() as u64);
            }
            frames
        };
        let (short, deep) = (chain(3), chain(MAX_DEPTH + 5));
        let tid = unsafe { libc::gettid() } as u64;
        let pthread = Box::new([0u64, 0, tid]); // a struct pthread with the native id at 16
        let cframe = Box::new([short[0].as_ptr() as u64]);
        let mut tstate = Box::new([0u64; 32]);
        tstate[7] = cframe.as_ptr() as u64; // at 56
        tstate[19] = pthread.as_ptr() as u64; // the identifier, at 152
        tstate[20] = tid; // at 160
        let gil = Box::new([0, tstate.as_ptr() as u64, 1]);
        let walk = Walk { frame: 56, cframe_frame: 0, native_tid: 160, frame_size: 72, back: 8,
                          gil: gil.as_ptr() as u64, gil_len: 24, ident: 152, pthread_tid: NONE, code: 0, print: 8, first_line: 4 };
        t.watch(std::process::id() as i32, walk);
        t.thread(std::process::id() as i32, tid, Some(tstate.as_ptr() as u64));
        let word = u64_at;
        // this thread's copies, until 10 or a second of its CPU
        let spin = |t: &mut Ticks| {
            let (mut on, mut copied, mut records) = (Vec::new(), Vec::new(), Vec::new());
            spin_cpu(1000, || {
                t.drain(&mut on, &mut copied);
                assert!(!on.iter().any(|k| k.tid == tid), "a tick of the known thread woke the sampler");
                records.extend(copied.drain(..).map(|c| c.record).filter(|r| word(r, 0) & 0xffff_ffff == tid));
                records.len() >= 10
            });
            records
        };
        let code = |rec: &[u8], i: usize| word(rec, AT_FRAMES + i * SLOT);
        let print = |rec: &[u8], i: usize| {
            let line = u32_at(rec, AT_FRAMES + i * SLOT + AT_FIRST_LINE) as u64;
            std::iter::once(line << 32).chain((0..3).map(|k| word(rec, AT_FRAMES + i * SLOT + AT_PRINT + 8 * k))).collect::<Vec<_>>()
        };
        let records = spin(&mut t);
        assert!(records.len() >= 10, "{} copies in a second of this thread's CPU", records.len());
        for rec in &records {
            assert_eq!((u32_at(rec, AT_COUNT), rec.len()), (3, AT_FRAMES + 3 * SLOT));
            assert_eq!((0..3).map(|i| code(rec, i)).collect::<Vec<_>>(), (0..3).map(|i| codes[i].as_ptr() as u64).collect::<Vec<_>>());
            assert_eq!((0..3).map(|i| print(rec, i)).collect::<Vec<_>>(), (0..3).map(|i| codes[i].to_vec()).collect::<Vec<_>>());
            assert_eq!((word(rec, AT_NATIVE_TID), word(rec, AT_TSTATE)), (tid, tstate.as_ptr() as u64));
            assert_eq!(word(rec, AT_IDENT), pthread.as_ptr() as u64);
            assert_eq!((word(rec, AT_GIL + 8), word(rec, AT_GIL + 16)), (tstate.as_ptr() as u64, 1));
        }
        // 3.10's way: the frame straight from the thread state, its native id in the pthread
        let walk = Walk { frame: 56, cframe_frame: NONE, native_tid: NONE, pthread_tid: 16, ..walk };
        t.watch(std::process::id() as i32, walk);
        tstate[7] = deep[0].as_ptr() as u64;
        // copies taken before the change are of the short chain: only those after it count
        let records: Vec<_> = spin(&mut t).into_iter().filter(|rec| u32_at(rec, AT_COUNT) != 3).collect();
        let records = if records.len() >= 10 { records } else { [records, spin(&mut t)].concat() };
        assert!(records.len() >= 10, "{} copies of the deep chain in a second of this thread's CPU", records.len());
        for rec in &records {
            assert_eq!(word(rec, AT_NATIVE_TID), tid);
            assert_eq!(u32_at(rec, AT_COUNT) as usize, MAX_DEPTH);
            assert_eq!(code(rec, MAX_DEPTH - 1), codes[MAX_DEPTH - 1].as_ptr() as u64);
            assert_eq!(print(rec, MAX_DEPTH - 1), codes[MAX_DEPTH - 1][..]);
        }
        // this thread's ticks that woke the sampler, over 300 ms of its CPU, or until `enough`
        let woke = |t: &mut Ticks, cpu_ms: u64, enough: usize| {
            let (mut on, mut copied, mut seen) = (Vec::new(), Vec::new(), 0);
            spin_cpu(cpu_ms, || {
                t.drain(&mut on, &mut copied);
                assert!(!copied.iter().any(|c| word(&c.record, 0) & 0xffff_ffff == tid), "a copy after all");
                seen += on.iter().filter(|k| k.tid == tid).count();
                enough > 0 && seen >= enough
            });
            seen
        };
        t.thread(std::process::id() as i32, tid, Some(NOT_PYTHON));
        spin_ticks(&mut t, 20, 0); // a copy already in a ring when marked
        assert_eq!(woke(&mut t, 300, 0), 0, "ticks of a thread marked not Python's");
        t.thread(std::process::id() as i32, tid, None);
        let seen = woke(&mut t, 1000, 10);
        assert!(seen >= 10, "a thread no longer given: its ticks wake the sampler ({seen} in a second of its CPU)");
        std::hint::black_box((short, deep, cframe, gil, pthread, codes));
    }
}
