//! Reads of another process's memory with process_vm_readv, many ranges per
//! system call: the call, not the bytes, is what a stack read costs.

use libc::{c_void, iovec, pid_t};

const IOV_MAX: usize = 1024;

pub struct Remote {
    pid: pid_t,
}

impl Remote {
    pub fn new(pid: i32) -> Remote {
        Remote { pid }
    }

    /// Fills `buf` from `addr`; false unless every byte was read.
    pub fn read(&self, addr: usize, buf: &mut [u8]) -> bool {
        let mut ok = [false];
        self.read_many(&[(addr, buf.len())], buf, &mut ok);
        ok[0]
    }

    pub fn read_u64(&self, addr: usize) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| u64::from_ne_bytes(b))
    }

    /// Reads the ranges (addr, len) back to back into `buf` (at least their
    /// total length); `ok[i]` says whether range i was read whole. A range the
    /// kernel cannot read ends one call, so the rest are asked for again.
    pub fn read_many(&self, ranges: &[(usize, usize)], buf: &mut [u8], ok: &mut [bool]) {
        let mut start = 0;
        let mut at = 0; // offset of ranges[start] in buf
        while start < ranges.len() {
            let end = (start + IOV_MAX).min(ranges.len());
            let got = self.readv(&ranges[start..end], &mut buf[at..]);
            let mut left = got;
            let mut i = start;
            while i < end && left >= ranges[i].1 {
                ok[i] = true;
                left -= ranges[i].1;
                at += ranges[i].1;
                i += 1;
            }
            if i < end {
                ok[i] = false; // the range that stopped the call
                at += ranges[i].1;
                i += 1;
            }
            start = i;
        }
    }

    fn readv(&self, ranges: &[(usize, usize)], buf: &mut [u8]) -> usize {
        let total: usize = ranges.iter().map(|r| r.1).sum();
        assert!(buf.len() >= total, "read_many: buffer too small");
        let local = iovec { iov_base: buf.as_mut_ptr() as *mut c_void, iov_len: total };
        let remote: Vec<iovec> =
            ranges.iter().map(|&(a, n)| iovec { iov_base: a as *mut c_void, iov_len: n }).collect();
        // SAFETY: local covers `total` writable bytes of buf; remote addresses are only read by the kernel.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, remote.as_ptr(), remote.len() as _, 0) };
        n.max(0) as usize
    }
}

/// The u64 at `at` in a copy of another process's memory (native byte order, as it was there).
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}
