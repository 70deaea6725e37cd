//! Which threads are on a CPU, from the kernel: a cpu-clock perf event on
//! each CPU ticks at the sampling rate, skipping the idle task, and writes
//! the thread it found running into that CPU's ring, waking the sampler.
//! The sampler then reads only those threads' stacks, so what it costs
//! follows the CPU the cluster uses, not its threads times the rate; and a
//! tick is an interrupt, so a busy machine delays the read, not the choice of
//! thread (polling /proc, a sampler waiting for a CPU finds threads off one).
//!
//! The period is drawn anew every PERIOD_TICKS ticks of a CPU, uniform within
//! half the mean either side: at a fixed period, a thread that wakes on a
//! timer of about that period (Dask's profiler, an event loop's callbacks,
//! every 10 ms) is found always or never. (A new period restarts the CPU's
//! timer from the call; drawing one per tick doubled what a tick cost the
//! sampler: the call interrupts that CPU.)
//!
//! Only the ticks of the processes being sampled reach the rings (filter.rs).

use crate::filter::{Filter, PERF_EVENT_IOC_SET_BPF};
use std::io::Error;
use std::time::Duration;

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const EXCLUDE_IDLE: u64 = 1 << 7;
const PERF_RECORD_SAMPLE: u32 = 9;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
const PERIOD_TICKS: u32 = 2;
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
    base: *mut u8,
    page: usize,
    /// ticks since its period was last drawn
    ticks: u32,
}

pub struct Ticks {
    rings: Vec<Ring>,
    /// the rings', then `wake`'s, then the timer's
    poll: Vec<libc::pollfd>,
    wake: libc::c_int,
    timer: libc::c_int,
    /// the mean period, ns
    period: u64,
    /// xorshift64 state, for the periods
    random: u64,
    /// None where BPF programs cannot be loaded: then every process's ticks wake the sampler
    filter: Option<Filter>,
}

impl Ticks {
    /// One event per online CPU, each ticking `rate` times a second of that CPU's busy time; `wake`, an
    /// eventfd, ends a wait too, and so does a timer every `every` (a timerfd: a timeout of each wait
    /// would set a timer at each tick, a trap to the hypervisor on a VM). Only the processes given to
    /// `watch` tick, unless the filter could not be loaded (said on stderr).
    pub fn open(rate: f64, wake: libc::c_int, every: Duration) -> Result<Ticks, String> {
        let filter = Filter::load()
            .map_err(|e| eprintln!("daskprobe-sampler: no tick filter ({e}): ticks of every process wake the sampler"))
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
        for cpu in online_cpus()? {
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
            rings.push(Ring { fd, base: base as *mut u8, page, ticks: 0 });
            if let Some(f) = &filter {
                if unsafe { libc::ioctl(fd, PERF_EVENT_IOC_SET_BPF, f.prog) } < 0 {
                    // its ticks all wake the sampler, which keeps those of its processes
                    eprintln!("daskprobe-sampler: no tick filter on CPU {cpu}: {}", Error::last_os_error());
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
        let random = daskprobe_clock::now_ns() | 1;
        Ok(Ticks { rings, poll, wake, timer, period: attr.sample_period, random, filter })
    }

    /// From now on, `pid`'s ticks wake the sampler.
    pub fn watch(&self, pid: i32) {
        if let Some(f) = &self.filter {
            f.add(pid);
        }
    }

    pub fn unwatch(&self, pid: i32) {
        if let Some(f) = &self.filter {
            f.remove(pid);
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

    /// (pid, tid) of every tick since the last drain, one entry per tick.
    pub fn drain(&mut self, into: &mut Vec<(i32, u64)>) {
        into.clear();
        for i in 0..self.rings.len() {
            let r = &mut self.rings[i];
            let before = into.len();
            r.drain(into);
            r.ticks += (into.len() - before) as u32;
            if r.ticks >= PERIOD_TICKS {
                r.ticks = 0;
                let period = self.next_period();
                unsafe { libc::ioctl(self.rings[i].fd, PERF_EVENT_IOC_PERIOD, &period as *const u64) };
            }
        }
    }

    fn next_period(&mut self) -> u64 {
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        self.period / 2 + x % self.period.max(1)
    }
}

impl Ring {
    fn drain(&self, into: &mut Vec<(i32, u64)>) {
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
            let kind = u32::from_ne_bytes(rec[0..4].try_into().unwrap());
            let len = u16::from_ne_bytes(rec[6..8].try_into().unwrap()) as u64;
            if kind == PERF_RECORD_SAMPLE && len >= 16 {
                let pid = u32::from_ne_bytes(rec[8..12].try_into().unwrap()) as i32;
                into.push((pid, u32::from_ne_bytes(rec[12..16].try_into().unwrap()) as u64));
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

    fn cpu_ns() -> u64 {
        let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
        s.split_whitespace().next().unwrap().parse().unwrap()
    }

    /// A spinning thread is ticked once per period of the CPU time the kernel counts for it
    /// (not of the wall time: on a busy machine it is off a CPU part of it).
    #[test]
    fn a_spinning_thread_is_ticked_once_per_period_of_its_cpu_time() {
        let Ok(mut t) = Ticks::open(100.0, -1, Duration::from_secs(1)) else { return }; // no perf events here (not root): nothing to test
        t.watch(std::process::id() as i32);
        let tid = unsafe { libc::gettid() } as u64;
        let (start, cpu0) = (std::time::Instant::now(), cpu_ns());
        let mut on = Vec::new();
        let mut seen = 0;
        while start.elapsed() < Duration::from_millis(600) {
            t.drain(&mut on);
            seen += on.iter().filter(|&&(_, x)| x == tid).count();
        }
        let expected = (cpu_ns() - cpu0) as f64 / 1e7;
        t.drain(&mut on);
        seen += on.iter().filter(|&&(_, x)| x == tid).count();
        // +-1 at each end (a period starts when the event is enabled), and, where the thread shares its
        // CPU, a tick finds it there by chance: three standard deviations of that
        assert!((seen as f64 - expected).abs() <= 2.0 + 3.0 * expected.sqrt(), "{seen} ticks for {expected:.1} periods of CPU");
    }

    fn spin_ticks(t: &mut Ticks, ms: u64) -> usize {
        let (start, mut on, mut seen) = (std::time::Instant::now(), Vec::new(), 0);
        let me = std::process::id() as i32;
        while start.elapsed() < Duration::from_millis(ms) {
            t.drain(&mut on);
            seen += on.iter().filter(|&&(pid, _)| pid == me).count();
        }
        seen
    }

    /// The ticks of a process not watched, or no longer, do not reach the rings.
    #[test]
    fn only_watched_processes_tick() {
        let Ok(mut t) = Ticks::open(100.0, -1, Duration::from_secs(1)) else { return };
        assert!(t.filter.is_some(), "perf events but no BPF filter, as root");
        assert_eq!(spin_ticks(&mut t, 300), 0, "ticks of a process not watched");
        t.watch(std::process::id() as i32);
        assert!(spin_ticks(&mut t, 300) >= 10, "too few ticks once watched");
        t.unwatch(std::process::id() as i32);
        spin_ticks(&mut t, 20); // a tick already in a ring when unwatched
        assert_eq!(spin_ticks(&mut t, 300), 0, "ticks after unwatch");
    }
}
