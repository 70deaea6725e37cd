//! When the sampler polls (no CPU ticks: no root), how far apart its reads are.
//!
//! A read of every thread costs about the same whether the cluster computes or
//! sleeps: at 100 a second, four Dask processes cost 1.2 ms of CPU a second,
//! 4.4% of the CPU of a cluster whose 10 ms tasks sleep. So every ADJUST the
//! interval is set for the sampler (all it does: its reads, its wakes, /proc's
//! readings, attaching) to cost at most SHARE of the CPU the watched processes
//! used over the last ADJUST, never shorter than the rate's period
//! nor longer than MAX_INTERVAL. A busy cluster is read at the rate; so is any,
//! when the rate is fixed (a rate the user chose).
//!
//! Each interval is drawn uniformly within half of it either side, as the
//! ticks' periods are (ticks.rs): at a fixed interval, a thread that wakes on
//! a timer of about that period (Dask's 10 ms profiler) would be read always
//! or never at its wake. An S line's period_ns is the mean interval at its
//! read: the time the read stands for.

use crate::jitter::Jitter;
use crate::procs::cpu_ns;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// the reads' CPU at most this share of the watched processes'
const SHARE: f64 = 0.015;
const ADJUST: Duration = Duration::from_millis(500);
/// ten reads a second at least, whatever they cost
const MAX_INTERVAL: Duration = Duration::from_millis(100);

pub struct Pace {
    period: Duration,
    fixed: bool,
    /// the mean interval now
    interval: Duration,
    since: Instant,
    /// each watched process's CPU at `since`, or when first seen since (ns)
    cpu: HashMap<i32, u64>,
    /// the reads since `since`, and the sampler's CPU then (ns)
    reads: u32,
    spent_at: u64,
    jitter: Jitter,
}

impl Pace {
    pub fn new(rate: f64, fixed: bool) -> Pace {
        let period = Duration::from_secs_f64(1.0 / rate);
        Pace { period, fixed, interval: period, since: Instant::now(), cpu: HashMap::new(), reads: 0,
               spent_at: process_cpu_ns(), jitter: Jitter::new() }
    }

    /// The mean interval in force, in ns: the period_ns of the reads made now.
    pub fn interval_ns(&self) -> u64 {
        self.interval.as_nanos() as u64
    }

    /// Counts a round of reads; every ADJUST, sets the interval from the CPU the sampler and `pids`
    /// used since the last.
    pub fn read(&mut self, pids: impl Iterator<Item = i32>) {
        self.reads += 1;
        if self.fixed || self.since.elapsed() < ADJUST {
            return;
        }
        let mut used = 0;
        let now: HashMap<i32, u64> = pids.filter_map(|pid| Some((pid, cpu_ns(pid)?))).collect();
        for (pid, ns) in &now {
            used += ns.saturating_sub(*self.cpu.get(pid).unwrap_or(ns));
        }
        let spent = process_cpu_ns();
        self.interval = interval(self.period, (self.reads, spent - self.spent_at), used, self.since.elapsed());
        (self.cpu, self.reads, self.spent_at, self.since) = (now, 0, spent, Instant::now());
    }

    /// The wait before the next read: the mean interval, drawn within half of it either side.
    pub fn next(&mut self) -> Duration {
        Duration::from_nanos(self.jitter.around(self.interval.as_nanos() as u64))
    }
}

/// CPU time the sampler has used, in ns.
fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The mean interval at which `reads`, for which the sampler spent `spent` ns over `elapsed`, would
/// have cost SHARE of the `used` ns of the cluster's CPU meanwhile, within [period, MAX_INTERVAL].
fn interval(period: Duration, (reads, spent): (u32, u64), used: u64, elapsed: Duration) -> Duration {
    let allowed = SHARE * used as f64;
    if reads == 0 {
        return period;
    }
    let per_read = spent as f64 / reads as f64;
    Duration::from_secs_f64(elapsed.as_secs_f64() * per_read / allowed.max(1.0)).clamp(period, MAX_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_busy_cluster_is_read_at_the_rate() {
        // 50 reads in 0.5 s cost 10 ms; the cluster used 1 s of CPU: 1% of it
        assert_eq!(interval(10 * MS, (50, 10_000_000), 1_000_000_000, 500 * MS), 10 * MS);
    }

    #[test]
    fn reads_that_would_cost_more_are_spread_out() {
        // 10 ms of reads against 0.2 s of the cluster's: 5% of it, so 3.3 times as far apart
        let got = interval(10 * MS, (50, 10_000_000), 200_000_000, 500 * MS);
        assert!((got.as_secs_f64() - 0.0333).abs() < 0.001, "{got:?}");
        // an idle cluster: ten reads a second
        assert_eq!(interval(10 * MS, (50, 10_000_000), 0, 500 * MS), MAX_INTERVAL);
    }

    #[test]
    fn intervals_are_drawn_within_half_the_mean_either_side() {
        let mut p = Pace::new(100.0, false);
        let drawn: Vec<Duration> = (0..1000).map(|_| p.next()).collect();
        assert!(drawn.iter().all(|d| (5 * MS..15 * MS).contains(d)));
        let mean = drawn.iter().sum::<Duration>() / 1000;
        assert!((mean.as_secs_f64() - 0.010).abs() < 0.0005, "{mean:?}");
    }
}
