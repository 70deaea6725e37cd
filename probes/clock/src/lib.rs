//! The run's one clock: CLOCK_MONOTONIC in ns, the same clock as Python's
//! time.monotonic_ns() and eBPF's bpf_ktime_get_ns(), so every probe shares
//! one timeline.

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
