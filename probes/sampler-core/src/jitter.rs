//! Waits drawn uniformly within half their mean either side (xorshift64): at a fixed period, a
//! thread that wakes on a timer of about that period (Dask's 10 ms profiler) would be read always
//! or never at its wake. The ticks' periods (ticks.rs) and the polling intervals (pace.rs) use it.

pub struct Jitter(u64);

impl Jitter {
    pub fn new() -> Jitter {
        Jitter(daskprobe_clock::now_ns() | 1)
    }

    /// A draw within [mean / 2, mean * 3 / 2).
    pub fn around(&mut self, mean: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        mean / 2 + x % mean.max(1)
    }
}
