//! The eBPF agent's snapshots of each process's executable mappings (ebpf_maps.tsv:
//! t_ns pid start end offset dev inode uid path; start, end and offset hex, dev MAJOR:MINOR hex as
//! /proc/PID/maps has it, uid the process's real uid; captures made before dev, inode and uid
//! were recorded have t_ns pid start end offset path), one snapshot per (pid, t_ns).

use std::collections::HashMap;
use std::fs;
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
    /// (st_dev, st_ino) of the file the process mapped, where the capture has them
    pub file: Option<(u64, u64)>,
    /// the process's real uid, where the capture has it
    pub uid: Option<u32>,
}

/// pid -> its snapshots, oldest first.
pub struct Snapshots(HashMap<u32, Vec<(u64, Vec<Mapping>)>>);

/// "MAJOR:MINOR" (hex) as st_dev has it.
fn device(text: &str) -> Option<u64> {
    let (major, minor) = text.split_once(':')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(libc::makedev(hex(major)?, hex(minor)?))
}

/// One line's (pid, t_ns, mapping); None for a line torn by a kill or not of either form.
fn parse(line: &str) -> Option<(u32, u64, Mapping)> {
    let f: Vec<&str> = line.splitn(9, '\t').collect();
    let hex = |s: &str| u64::from_str_radix(s, 16).ok();
    let (t, pid) = (f.first()?.parse::<u64>().ok()?, f.get(1)?.parse::<u32>().ok()?);
    let (start, end, offset) = (hex(f.get(2)?)?, hex(f.get(3)?)?, hex(f.get(4)?)?);
    // a path starts with '/': a fifth field that does not is the device of the newer form
    let (file, uid, path) = match f.get(5..).unwrap_or_default() {
        [dev, inode, uid, path] if !dev.starts_with('/') => {
            (Some((device(dev)?, inode.parse().ok()?)), Some(uid.parse().ok()?), path.to_string())
        }
        _ => (None, None, line.splitn(6, '\t').nth(5)?.to_string()),
    };
    Some((pid, t, Mapping { start, end, offset, path, file, uid }))
}

impl Snapshots {
    pub fn read(path: &Path) -> std::io::Result<Self> {
        let text = fs::read_to_string(path).unwrap_or_default();  // none: no native process sampled
        let mut by_pid: HashMap<u32, Vec<(u64, Vec<Mapping>)>> = HashMap::new();
        for (pid, t, mapping) in text.lines().filter_map(parse) {
            let snaps = by_pid.entry(pid).or_default();
            if snaps.last().map(|(last, _)| *last) != Some(t) {
                snaps.push((t, Vec::new()));
            }
            snaps.last_mut().unwrap().1.push(mapping);
        }
        Ok(Snapshots(by_pid))
    }

    /// The snapshot for a sample at t_ns: the first one taken after it (the agent takes one
    /// when it drains samples, so after them), else the last: (its index, its mappings).
    pub fn at(&self, pid: u32, t_ns: u64) -> Option<(usize, &[Mapping])> {
        let snaps = self.0.get(&pid)?;
        let i = snaps.iter().position(|(t, _)| *t >= t_ns).unwrap_or(snaps.len() - 1);
        Some((i, &snaps[i].1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_of_a_line_are_read() {
        let new = parse("5\t7\t1000\t2000\t0\tfe:01\t42\t1000\t/usr/lib/a b.so").unwrap();
        assert_eq!(new, (7, 5, Mapping { start: 0x1000, end: 0x2000, offset: 0, path: "/usr/lib/a b.so".into(),
                                         file: Some((libc::makedev(0xfe, 1), 42)), uid: Some(1000) }));
        let old = parse("5\t7\t1000\t2000\t10\t/usr/lib/a\tb.so").unwrap();
        assert_eq!(old.2, Mapping { start: 0x1000, end: 0x2000, offset: 0x10, path: "/usr/lib/a\tb.so".into(),
                                    file: None, uid: None });
        assert_eq!(parse("5\t7\t1000\t2000"), None);
        assert_eq!(parse("5\t7\t1000\t2000\t0\tfe:01\t42\tx\t/a.so"), None);
    }
}
