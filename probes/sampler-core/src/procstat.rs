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
    /// Times the thread was switched in (schedstat's third field); None without schedstats.
    pub switches: Option<u64>,
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
    /// after it shows at the next read (see Reader::thread).
    pub fn read(&self) -> Option<State> {
        let mut buf = [0u8; 512];
        let switches = self.schedstat.as_ref().and_then(|f| {
            let n = f.read_at(&mut buf, 0).ok()?;
            std::str::from_utf8(&buf[..n]).ok()?.split_whitespace().nth(2)?.parse().ok()
        });
        let n = self.stat.read_at(&mut buf, 0).ok()?;
        // "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'
        let close = buf[..n].iter().rposition(|&b| b == b')')?;
        let state = *buf.get(close + 2)?;
        Some(State { running: state == b'R', switches })
    }
}
