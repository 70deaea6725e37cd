//! The capture file's one writer. Forwarding threads only queue records; a
//! failed write (a full disk) ends capturing, never forwarding, and leaves
//! the file ending on a whole record. Beside the capture, FILE.status says
//! whether its writer is capturing, ended, or stopped and why: it is written
//! whole when the capture opens and rewritten in place after, so that saying
//! "stopped: No space left on device" needs no new space on the full disk.
//! Its format is defined once, in STATUS of daskprobe/probes/proxy_capture.py.

use crate::failures::log;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::thread;
use std::time::Duration;

pub const FLUSH_EVERY: Duration = Duration::from_millis(100); // a write costs more than the records it holds
const WRITE_AT: usize = 1 << 20;

// <fcntl.h>'s O_NOFOLLOW (std has no libc constants, and it differs by architecture)
#[cfg(any(target_arch = "aarch64", target_arch = "arm"))]
const O_NOFOLLOW: i32 = 0o100000;
#[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
const O_NOFOLLOW: i32 = 0o400000;
#[cfg(not(any(target_arch = "aarch64", target_arch = "arm", target_arch = "x86_64", target_arch = "x86")))]
compile_error!("O_NOFOLLOW: add this architecture's value from <fcntl.h>");

/// The status file's length: its line is padded with spaces to it.
pub const STATUS_LEN: usize = 512;

pub struct Capture {
    file: File,
    end: u64, // file length after the last whole record written
    buf: Vec<u8>,
    status: File,
}

impl Capture {
    pub fn open(path: &str) -> io::Result<Capture> {
        // never through a symlink planted where the capture goes (ELOOP instead)
        let file = OpenOptions::new().create(true).append(true).custom_flags(O_NOFOLLOW).open(path)?;
        let end = file.metadata()?.len();
        let status = OpenOptions::new().create(true).write(true).truncate(true).custom_flags(O_NOFOLLOW)
            .open(format!("{path}.status"))?;
        let mut c = Capture { file, end, buf: Vec::with_capacity(WRITE_AT), status };
        c.say("capturing", "")?;
        Ok(c)
    }

    /// The status line: `STATE T_NS END_BYTES REASON`, padded to STATUS_LEN and written over the last.
    fn say(&mut self, state: &str, reason: &str) -> io::Result<()> {
        let mut line = format!("{state} {} {} {}", daskprobe_clock::now_ns(), self.end, reason.replace('\n', " "));
        line.truncate(STATUS_LEN - 1);
        while !line.is_char_boundary(line.len()) {
            line.pop();
        }
        let mut bytes = line.into_bytes();
        bytes.resize(STATUS_LEN - 1, b' ');
        bytes.push(b'\n');
        self.status.write_all_at(&bytes, 0)
    }

    /// Every record was written: the status says so.
    pub fn ended(&mut self) {
        let _ = self.say("ended", "");
    }

    /// Writing failed and capturing stops here: the status says why, the log too.
    pub fn stopped(&mut self, e: &io::Error, what: &str) {
        let end = self.end;
        log(format_args!("capture write failed ({e}): capture stopped at {end} bytes, {what}"));
        if let Err(e2) = self.say("stopped", &format!("writing failed: {e}")) {
            log(format_args!("and its status file could not say so: {e2}"));
        }
    }

    /// The file's length after the last whole record written.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Drain the queue and write every FLUSH_EVERY, and once more when
    /// `stopping` is set (the thread is unparked then). The writer sleeps
    /// instead of blocking in recv(), so forwarding threads never pay for
    /// waking it: on a 2-core machine a wake-up and a write per message
    /// compete with the scheduler. After a failed write it returns, dropping
    /// the queue, so records sent from then on are dropped at once.
    pub fn run(mut self, rx: Receiver<Vec<u8>>, stopping: &AtomicBool) {
        loop {
            thread::park_timeout(FLUSH_EVERY);
            let last = stopping.load(Ordering::Relaxed);
            match self.drain(&rx) {
                Ok(true) if last => return self.ended(),
                Ok(true) => {}
                Ok(false) => return self.ended(),
                Err(e) => return self.stopped(&e, "forwarding goes on"),
            }
        }
    }

    /// Writes what is queued; false once every sender is gone.
    pub fn drain(&mut self, rx: &Receiver<Vec<u8>>) -> io::Result<bool> {
        loop {
            match rx.try_recv() {
                Ok(rec) => {
                    self.buf.extend_from_slice(&rec);
                    if self.buf.len() >= WRITE_AT {
                        self.write()?;
                    }
                }
                Err(TryRecvError::Empty) => return self.write().map(|()| true),
                Err(TryRecvError::Disconnected) => return self.write().map(|()| false),
            }
        }
    }

    /// A short write (disk full) may end inside a record: cut the file back
    /// to the last whole one. Should that fail too, readers still drop a torn
    /// last record.
    fn write(&mut self) -> io::Result<()> {
        if let Err(e) = self.file.write_all(&self.buf) {
            let _ = self.file.set_len(self.end);
            return Err(e);
        }
        self.end += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}
