//! A thread's scheduler state from /proc, through files kept open: one pread
//! per file per sample instead of open, read and close.

use std::fs::File;
use std::os::unix::fs::FileExt;

pub struct ThreadStat {
    stat: File,
    schedstat: Option<File>,
}

#[derive(Clone, Copy, PartialEq)]
pub struct State {
    /// On a CPU or waiting for one ('R' in /proc/TID/stat).
    pub running: bool,
    /// CPU time and times switched in (schedstat's first and third fields); None without schedstats.
    pub ran: Option<(u64, u64)>,
}

impl ThreadStat {
    pub fn open(pid: i32, tid: u64) -> Option<ThreadStat> {
        let dir = format!("/proc/{pid}/task/{tid}");
        Some(ThreadStat {
            stat: File::open(format!("{dir}/stat")).ok()?,
            schedstat: File::open(format!("{dir}/schedstat")).ok(),
        })
    }

    /// None once the thread is gone. schedstat is read first, so a switch-in
    /// after it shows at the next read (see Reader::thread). When `was` says
    /// the thread was off a CPU and schedstat has not moved since, it has
    /// not run since: /proc/TID/stat, five times dearer to read, is skipped.
    /// A thread woken meanwhile but still waiting for a CPU then counts as
    /// not running until it gets one (it has not run, so its stack is the same).
    pub fn read(&self, was: Option<State>) -> Option<State> {
        let mut buf = [0u8; 512];
        let ran = match &self.schedstat {
            Some(f) => {
                let n = f.read_at(&mut buf, 0).ok()?;
                Some(schedstat(&buf[..n])?)
            }
            None => None,
        };
        if ran.is_some() && was.is_some_and(|w| !w.running && w.ran == ran) {
            return Some(State { running: false, ran });
        }
        let n = self.stat.read_at(&mut buf, 0).ok()?;
        let state = *after_comm(&buf[..n])?.get(1)?;
        Some(State { running: state == b'R', ran })
    }
}

/// A /proc stat line after its command name: " S ppid ...". The name ("pid (comm) S ...") may hold
/// spaces and parentheses: what follows the last ')' is the rest.
pub fn after_comm(stat: &[u8]) -> Option<&[u8]> {
    Some(&stat[stat.iter().rposition(|&b| b == b')')? + 1..])
}

fn schedstat(text: &[u8]) -> Option<(u64, u64)> {
    let mut fields = std::str::from_utf8(text).ok()?.split_whitespace().map(str::parse::<u64>);
    let runtime = fields.next()?.ok()?;
    Some((runtime, fields.nth(1)?.ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_cpu_time_and_switches() {
        assert_eq!(schedstat(b"123 456 7\n"), Some((123, 7)));
        assert_eq!(schedstat(b"123 456\n"), None);
    }
}
