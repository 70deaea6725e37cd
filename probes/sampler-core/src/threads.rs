//! Which of a sampled process's threads BPF copies the stacks of at their
//! ticks (tickprog.rs), and which it drops: the threads our reader lists are
//! given with their PyThreadState; one ticked that the reader has not listed
//! at NOT_PYTHON_AFTER reads is not a Python thread (a native pool's), and
//! BPF drops its ticks from then on, until it is listed or has ended (looked
//! for every RELIST_NATIVE), or the process has.

use crate::tickprog::NOT_PYTHON;
use crate::ticks::{Tick, Ticks};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// reads of a process that found a ticked thread not in its interpreter's list, before BPF drops its ticks
const NOT_PYTHON_AFTER: u32 = 3;
/// how often threads marked as not Python's are looked for, to forget those that ended
const RELIST_NATIVE: Duration = Duration::from_secs(1);

pub struct InBpf {
    /// PyThreadState by native id, as given to BPF
    given: HashMap<u64, u64>,
    /// threads ticked but not listed, and at how many reads
    unlisted: HashMap<u64, u32>,
    /// when those marked were last looked for
    pruned_at: Instant,
}

impl Default for InBpf {
    fn default() -> InBpf {
        InBpf { given: HashMap::new(), unlisted: HashMap::new(), pruned_at: Instant::now() }
    }
}

impl InBpf {
    /// After a round of reads of process `pid`: `listed`, its threads as the reader lists them (native
    /// id, PyThreadState; None once the process is gone), and the ticks that woke the sampler.
    pub fn update(&mut self, ticks: &Ticks, pid: i32, listed: Option<HashMap<u64, u64>>, ticked: &[Tick]) {
        let gone = listed.is_none();
        let listed = listed.unwrap_or_default();
        for (tid, tstate) in &listed {
            if self.given.get(tid) != Some(tstate) {
                ticks.thread(pid, *tid, Some(*tstate));
            }
        }
        for tid in self.given.keys().filter(|tid| !listed.contains_key(tid)) {
            ticks.thread(pid, *tid, None);
        }
        self.given = listed;
        self.mark_native(ticks, pid, gone, ticked);
    }

    fn mark_native(&mut self, ticks: &Ticks, pid: i32, gone: bool, ticked: &[Tick]) {
        let mut read: Vec<u64> = ticked.iter().filter(|k| k.pid == pid).map(|k| k.tid).collect();
        read.sort_unstable();
        read.dedup();
        for tid in read.into_iter().filter(|tid| !self.given.contains_key(tid) && !gone) {
            let n = self.unlisted.entry(tid).or_insert(0);
            *n += 1;
            if *n == NOT_PYTHON_AFTER {
                ticks.thread(pid, tid, Some(NOT_PYTHON));
            }
        }
        let prune = gone || self.pruned_at.elapsed() >= RELIST_NATIVE;
        if prune {
            self.pruned_at = Instant::now();
        }
        let given = &self.given;
        self.unlisted.retain(|tid, n| {
            let ended = prune && (gone || !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists());
            if ended && *n >= NOT_PYTHON_AFTER {
                ticks.thread(pid, *tid, None);
            }
            !ended && !given.contains_key(tid)
        });
    }
}
