//! Native thread ids for CPython 3.10, which keeps only the pthread_t of a
//! thread (PyThreadState.thread_id). On glibc that is the address of the
//! thread's struct pthread, whose tid field sits at an offset fixed per glibc
//! build (720 in Debian 12's 2.36) and not exported. So it is found when
//! attaching: the first offset at which every Python thread's struct holds a
//! distinct thread id of the process.

use crate::remote::{u32_at, Remote};

/// How far into struct pthread the tid is looked for.
const SPAN: usize = 2048;

/// The offset of the tid in struct pthread, from the threads' pthread_t values.
pub fn tid_offset(remote: &Remote, pid: i32, idents: &[u64]) -> Result<usize, String> {
    let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| format!("cannot list the threads: {e}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut heads = Vec::with_capacity(idents.len());
    for &ident in idents {
        let mut head = vec![0u8; SPAN];
        if !remote.read(ident as usize, &mut head) {
            return Err(format!("cannot read the struct pthread at {ident:#x}"));
        }
        heads.push(head);
    }
    find_tid_offset(&heads, &tids).ok_or_else(|| "no thread id found in struct pthread".into())
}

/// The native id of the thread whose pthread_t is `ident`.
pub fn tid(remote: &Remote, ident: u64, offset: usize) -> Option<u64> {
    let mut b = [0u8; 4];
    remote.read(ident as usize + offset, &mut b).then(|| u32::from_ne_bytes(b) as u64)
}

/// `heads`: the first bytes of each thread's struct pthread; `tids`: the process's thread ids.
fn find_tid_offset(heads: &[Vec<u8>], tids: &[u32]) -> Option<usize> {
    let at = u32_at;
    let len = heads.iter().map(Vec::len).min()?;
    (0..len.saturating_sub(3)).step_by(4).find(|&i| {
        let mut found: Vec<u32> = heads.iter().map(|h| at(h, i)).filter(|t| tids.contains(t)).collect();
        found.sort_unstable();
        found.dedup();
        found.len() == heads.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(fields: &[(usize, u32)]) -> Vec<u8> {
        let mut h = vec![0u8; 1024];
        for &(at, v) in fields {
            h[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        }
        h
    }

    #[test]
    fn the_tid_is_where_every_thread_holds_its_own_id() {
        let tids = [100, 101, 102];
        let heads = [
            // at 16 one thread holds a tid by chance; at 64 all hold the same one
            head(&[(16, 101), (64, 100), (720, 100)]),
            head(&[(16, 7), (64, 100), (720, 102)]),
        ];
        assert_eq!(find_tid_offset(&heads, &tids), Some(720));
        assert_eq!(find_tid_offset(&heads[..1], &tids), Some(16), "one thread: the first offset holding a tid");
        assert_eq!(find_tid_offset(&[head(&[(720, 555)])], &tids), None, "not a thread of the process");
        assert_eq!(find_tid_offset(&[], &tids), None);
    }
}
