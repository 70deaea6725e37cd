//! The capture file's one writer. Forwarding threads only queue records; a
//! failed write (a full disk) ends capturing, never forwarding, and leaves
//! the file ending on a whole record.

use crate::failures::log;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
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

pub struct Capture {
    file: File,
    end: u64, // file length after the last whole record written
    buf: Vec<u8>,
}

impl Capture {
    pub fn open(path: &str) -> io::Result<Capture> {
        // never through a symlink planted where the capture goes (ELOOP instead)
        let file = OpenOptions::new().create(true).append(true).custom_flags(O_NOFOLLOW).open(path)?;
        let end = file.metadata()?.len();
        Ok(Capture { file, end, buf: Vec::with_capacity(WRITE_AT) })
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
                Ok(true) if last => return,
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    let end = self.end;
                    log(format_args!("capture write failed ({e}): capture stopped at {end} bytes, forwarding goes on"));
                    return;
                }
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
