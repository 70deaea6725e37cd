//! Failures a peer or the OS can cause (resets, fd limits, a refused
//! upstream). None may end the proxy, and a peer misbehaving in a loop must
//! not flood the log: each kind is logged when its count reaches 1, 10,
//! 100, ..., so the log stays short and still tells how often.

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::sync::{Mutex, PoisonError};

#[derive(Default)]
pub struct Failures(Mutex<HashMap<String, u64>>);

impl Failures {
    pub fn note(&self, kind: &str) {
        let n = {
            // Poisoned only if a thread panicked holding it; the counts are still good.
            let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let n = counts.entry(kind.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        if is_power_of_ten(n) {
            log(format_args!("{kind} ({n} so far)"));
        }
    }
}

fn is_power_of_ten(n: u64) -> bool {
    let mut p = 1;
    while p < n {
        p *= 10;
    }
    p == n
}

/// To stderr (logs/proxy.log, logs/tap.log), under the program's name, ignoring errors:
/// eprintln! would panic when that disk is full, which is when there is most to say.
pub fn log(args: fmt::Arguments) {
    let argv0 = std::env::args().next().unwrap_or_default();
    let name = argv0.rsplit('/').next().unwrap_or("daskprobe");
    let _ = writeln!(std::io::stderr(), "{name}: {args}");
}
