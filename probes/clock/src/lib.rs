//! The run's one clock: CLOCK_MONOTONIC in ns, the same clock as Python's
//! time.monotonic_ns() and eBPF's bpf_ktime_get_ns(), so every probe shares
//! one timeline (in a time namespace, BPF's is the kernel's: timens_ns).

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

const CLOCK_MONOTONIC: i32 = 1;

pub fn now_ns() -> u64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut ts) };
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

/// How far this process's CLOCK_MONOTONIC is ahead of the kernel's, which BPF stamps with: its time
/// namespace's offset (0 outside one, or where the kernel has none).
pub fn timens_ns() -> i64 {
    let text = std::fs::read_to_string("/proc/self/timens_offsets").unwrap_or_default();
    text.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        (f.next()? == "monotonic").then_some(())?;
        Some(f.next()?.parse::<i64>().ok()? * 1_000_000_000 + f.next()?.parse::<i64>().ok()?)
    }).unwrap_or(0)
}
