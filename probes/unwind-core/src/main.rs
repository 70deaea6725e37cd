//! daskprobe-unwind: the native processes' CPU samples that the eBPF agent copied with the
//! top of their user stack (ebpf_ustacks.bin), unwound from their modules' .eh_frame (as
//! `perf --call-graph dwarf` does, after the run) and symbolized.
//!
//!     daskprobe-unwind --stacks FILE --maps FILE --record BYTES --offsets pid=4,t0=16,ip=56,...
//!     daskprobe-unwind --maps FILE --addresses < LINES
//!
//! The record layout comes from its one definition, probes/ebpf_format.py. Prints one line per
//! record: N, a tab, its frames leaf first as "function [module]", ';'-joined, as the agent
//! writes the kernel stacks it symbolizes itself. With --addresses, the stacks BPF walked by
//! frame pointers (stdin: "pid<TAB>t_ns<TAB>addr,addr,...", hex, leaf first) are symbolized the same way.
//!
//! It runs as root and the mapped files' paths are the cluster's: each is read only if open.rs's
//! checks hold. Those not read are named on stderr with the reason, and counted; their frames
//! stay "[unknown] [module]".

mod maps;
mod module;
mod open;

use std::collections::HashMap;
use std::io::{BufRead, BufWriter, Read, Write};
use std::path::PathBuf;
use std::rc::Rc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{Module, Unwinder};

use maps::{Mapping, Snapshots};
use module::Elf;
use open::Skip;

/// A file as a mapping names it, with what its checks depend on: the same path may be another file
/// for another process (or, recorded by device and inode, another file by now).
type FileKey = (String, Option<(u64, u64)>, Option<u32>);

const MAX_FRAMES: usize = 128;

struct Args {
    maps: PathBuf,
    /// None: --addresses
    stacks: Option<(PathBuf, usize, HashMap<String, usize>)>,
}

fn need<T>(o: Option<T>, what: &str) -> Result<T, String> {
    o.ok_or(format!("missing --{what}"))
}

fn args() -> Result<Args, String> {
    let (mut stacks, mut maps, mut record, mut offsets, mut addresses) = (None, None, None::<usize>, HashMap::new(), false);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--addresses" {
            addresses = true;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--stacks" => stacks = Some(PathBuf::from(value)),
            "--maps" => maps = Some(PathBuf::from(value)),
            "--record" => record = value.parse().ok(),
            "--offsets" => {
                for kv in value.split(',') {
                    let (k, v) = kv.split_once('=').ok_or(format!("bad offset {kv}"))?;
                    offsets.insert(k.to_string(), v.parse().map_err(|_| format!("bad offset {kv}"))?);
                }
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    let maps = need(maps, "maps")?;
    if addresses {
        return Ok(Args { maps, stacks: None });
    }
    for field in ["pid", "t0", "ip", "sp", "bp", "size", "stack"] {
        need(offsets.get(field), &format!("offsets {field}=N"))?;
    }
    Ok(Args { maps, stacks: Some((need(stacks, "stacks")?, need(record, "record")?, offsets)) })
}

/// A process's modules at one snapshot: framehop's unwinder, and for symbols each
/// mapped range with its load bias and file (None: a file not read).
struct Process {
    unwinder: UnwinderX86_64<Vec<u8>>,
    ranges: Vec<(std::ops::Range<u64>, u64, Option<Rc<Elf>>, String)>,
}

impl Process {
    fn new(mappings: &[Mapping], elves: &mut HashMap<FileKey, Result<Rc<Elf>, Skip>>) -> Process {
        let mut p = Process { unwinder: UnwinderX86_64::new(), ranges: Vec::new() };
        let mut by_path: Vec<(&str, Vec<&Mapping>)> = Vec::new();
        for m in mappings {
            match by_path.iter_mut().find(|(path, _)| *path == m.path) {
                Some((_, ms)) => ms.push(m),
                None => by_path.push((&m.path, vec![m])),
            }
        }
        for (path, ms) in by_path {
            let key = (path.to_string(), ms[0].file, ms[0].uid);
            let range = ms.iter().map(|m| m.start).min().unwrap()..ms.iter().map(|m| m.end).max().unwrap();
            let name = path.rsplit('/').next().unwrap_or(path).trim_end_matches(" (deleted)").to_string();
            let Ok(elf) = elves.entry(key).or_insert_with(|| Elf::open(ms[0]).map(Rc::new)).clone() else {
                p.ranges.push((range, 0, None, name));
                continue;
            };
            let Some(bias) = elf.bias(ms[0]) else { continue };
            p.unwinder.add_module(Module::new(name.clone(), range.clone(), bias, elf.sections()));
            p.ranges.push((range, bias, Some(elf), name));
        }
        p
    }

    fn symbolize(&self, avma: u64) -> String {
        let name = |s: &str| s.replace(';', ":").replace('\t', " ");
        match self.ranges.iter().find(|(r, ..)| r.contains(&avma)) {
            Some((_, bias, elf, module)) => match elf.as_ref().and_then(|e| e.symbol(avma.wrapping_sub(*bias))) {
                Some(f) => format!("{} [{}]", name(f), name(module)),
                None => format!("[unknown] [{}]", name(module)),
            },
            None => "[unknown]".to_string(),
        }
    }

    /// Leaf first. Unwinding stops where the copied stack ends or the rules give out:
    /// the frames found until then are kept.
    fn frames(&self, cache: &mut CacheX86_64, ip: u64, sp: u64, bp: u64, stack: &[u8]) -> Vec<String> {
        let mut read = |addr: u64| {
            let at = addr.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(at..at + 8).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
        };
        let mut it = self.unwinder.iter_frames(ip, UnwindRegsX86_64::new(ip, sp, bp), cache, &mut read);
        let mut out = Vec::new();
        while let Ok(Some(frame)) = it.next() {
            out.push(self.symbolize(frame.address_for_lookup()));
            if out.len() == MAX_FRAMES {
                break;
            }
        }
        out
    }
}

fn field(rec: &[u8], at: usize, width: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..width].copy_from_slice(&rec[at..at + width]);
    u64::from_le_bytes(b)
}

/// The processes' modules, built once per (pid, snapshot).
struct Modules<'a> {
    snapshots: &'a Snapshots,
    elves: HashMap<FileKey, Result<Rc<Elf>, Skip>>,
    processes: HashMap<(u32, usize), Process>,
}

impl Modules<'_> {
    fn at(&mut self, pid: u32, t: u64) -> Option<&Process> {
        let (i, mappings) = self.snapshots.at(pid, t)?;
        let elves = &mut self.elves;
        Some(self.processes.entry((pid, i)).or_insert_with(|| Process::new(mappings, elves)))
    }

    /// Says on stderr which files were not read and why, and how many for each reason.
    fn tell_skipped(&self) {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for ((path, ..), why) in self.elves.iter().filter_map(|(k, e)| Some((k, e.as_ref().err()?))) {
            eprintln!("daskprobe-unwind: not read, its frames unnamed: {path}: {why}");
            let why = why.to_string();
            match counts.iter_mut().find(|(w, _)| *w == why) {
                Some((_, n)) => *n += 1,
                None => counts.push((why, 1)),
            }
        }
        if !counts.is_empty() {
            let total: usize = counts.iter().map(|(_, n)| n).sum();
            let each: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
            eprintln!("daskprobe-unwind: {total} mapped files not read: {}", each.join("; "));
        }
    }
}

fn main() {
    let a = args().unwrap_or_else(|e| {
        eprintln!("daskprobe-unwind: {e}");
        std::process::exit(2)
    });
    let snapshots = Snapshots::read(&a.maps).expect("reading the maps");
    let mut modules = Modules { snapshots: &snapshots, elves: HashMap::new(), processes: HashMap::new() };
    let mut out = BufWriter::new(std::io::stdout().lock());
    match &a.stacks {
        Some((stacks, record, offsets)) => unwind(stacks, *record, offsets, &mut modules, &mut out),
        None => symbolize(&mut modules, &mut out),
    }
    out.flush().expect("writing");
    modules.tell_skipped();
}

/// Each stack a "pid<TAB>t_ns<TAB>addr,..." line of stdin holds, symbolized.
fn symbolize(modules: &mut Modules, out: &mut impl Write) {
    for (n, line) in std::io::stdin().lock().lines().map_while(Result::ok).enumerate() {
        let f: Vec<&str> = line.splitn(3, '\t').collect();
        let parsed = match f[..] {
            [pid, t, addrs] => pid.parse::<u32>().ok().zip(t.parse::<u64>().ok()).map(|k| (k, addrs)),
            _ => None,
        };
        let frames = match parsed {
            Some(((pid, t), addrs)) => match modules.at(pid, t) {
                // a caller's address is where it returns to: the call is the byte before it (which
                // a call a function ends with, to a function that does not return, leaves outside it)
                Some(p) => addrs.split(',').filter_map(|x| u64::from_str_radix(x, 16).ok()).enumerate()
                    .map(|(i, avma)| p.symbolize(if i == 0 { avma } else { avma.saturating_sub(1) }))
                    .collect::<Vec<_>>().join(";"),
                None => "[no mappings]".to_string(),  // it exited before the agent read them
            },
            None => "[unreadable]".to_string(),
        };
        writeln!(out, "{n}\t{frames}").expect("writing");
    }
}

fn unwind(stacks: &PathBuf, record: usize, offsets: &HashMap<String, usize>, modules: &mut Modules,
          out: &mut impl Write) {
    let mut input = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(stacks).expect("the stacks"));
    let mut cache = CacheX86_64::new();
    let o = |k: &str| offsets[k];
    let mut rec = vec![0u8; record];
    let mut n = 0usize;
    while input.read_exact(&mut rec).is_ok() {  // a record torn by a kill ends the file
        let (pid, t) = (field(&rec, o("pid"), 4) as u32, field(&rec, o("t0"), 8));
        let (ip, sp, bp) = (field(&rec, o("ip"), 8), field(&rec, o("sp"), 8), field(&rec, o("bp"), 8));
        let size = (field(&rec, o("size"), 8) as usize).min(record - o("stack"));
        let frames = match modules.at(pid, t) {
            Some(_) if ip == 0 => vec!["[lost]".to_string()],  // BPF could not read the user registers
            Some(p) => p.frames(&mut cache, ip, sp, bp, &rec[o("stack")..o("stack") + size]),
            None => vec!["[no mappings]".to_string()],  // it exited before the agent read them
        };
        writeln!(out, "{n}\t{}", frames.join(";")).expect("writing");
        n += 1;
    }
}
