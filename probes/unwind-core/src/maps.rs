//! The eBPF agent's snapshots of each process's executable mappings (ebpf_maps.tsv:
//! t_ns pid start end offset path, hex addresses), one snapshot per (pid, t_ns).

use std::collections::HashMap;
use std::fs;
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub path: String,
}

/// pid -> its snapshots, oldest first.
pub struct Snapshots(HashMap<u32, Vec<(u64, Vec<Mapping>)>>);

impl Snapshots {
    pub fn read(path: &Path) -> std::io::Result<Self> {
        let text = fs::read_to_string(path).unwrap_or_default();  // none: no native process sampled
        let mut by_pid: HashMap<u32, Vec<(u64, Vec<Mapping>)>> = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.splitn(6, '\t').collect();
            let [t, pid, start, end, offset, path] = f[..] else { continue };  // a line torn by a kill
            let (Ok(t), Ok(pid)) = (t.parse::<u64>(), pid.parse::<u32>()) else { continue };
            let hex = |s: &str| u64::from_str_radix(s, 16).ok();
            let (Some(start), Some(end), Some(offset)) = (hex(start), hex(end), hex(offset)) else { continue };
            let snaps = by_pid.entry(pid).or_default();
            if snaps.last().map(|(last, _)| *last) != Some(t) {
                snaps.push((t, Vec::new()));
            }
            snaps.last_mut().unwrap().1.push(Mapping { start, end, offset, path: path.to_string() });
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
