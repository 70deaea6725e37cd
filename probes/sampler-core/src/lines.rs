//! The capture's lines, one writer per kind (F lines: frames.rs): a kind
//! letter and its fields, tab-separated, as LINES in daskprobe/probes/pyspy.py
//! defines them. The test below writes every kind into a file that
//! tests/unit/test_formats.py reads back with that definition.

use crate::cpython::ThreadSample;
use crate::frames::clean;
use std::io::Write;

/// `period_ns`: the CPU time a tick's sample stands for; polling, the mean interval between reads then; 0 for the others.
pub fn sample(out: &mut impl Write, t: u64, pid: i32, s: &ThreadSample, name: &str, period_ns: u64) {
    let _ = writeln!(out, "S\t{t}\t{pid}\t{}\t{}\t{}\t{name}\t{}\t{}\t{}\t{}\t{period_ns}",
                     s.tid, s.active as u8, s.owns_gil as u8, s.frame_ids, s.ident, s.stale as u8, s.tick as u8);
}

pub fn attached(out: &mut impl Write, t: u64, pid: i32, name: &str, reader: &str) {
    let _ = writeln!(out, "A\t{t}\t{pid}\t{}\t{reader}", clean(name));
}

pub fn failed(out: &mut impl Write, t: u64, pid: i32, message: &str) {
    let _ = writeln!(out, "E\t{t}\t{pid}\t{}", clean(message));
}

pub fn dropped(out: &mut impl Write, t: u64, pid: i32, read_ns: u64) {
    let _ = writeln!(out, "L\t{t}\t{pid}\t{read_ns}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::Frames;
    use std::rc::Rc;

    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/formats/pyspy.tsv");

    /// Every kind, with values that all differ, so that a field moved or
    /// dropped shows. tests/unit/test_formats.py expects these values:
    /// change both or neither.
    fn every_kind() -> Vec<u8> {
        let mut out = Vec::new();
        let mut frames = Frames::default();
        attached(&mut out, 1_000_000_001, 4242, "worker-0", "cpython311");
        let leaf = frames.id(&mut out, "spin", "/app/flow.py", 12);
        let root = frames.id(&mut out, "<module>", "/app/flow.py", 30);
        let s = ThreadSample { tid: 4243, ident: 140_234_081_310_528, active: true, owns_gil: false,
                               frame_ids: Rc::from(format!("{leaf},{root}")), stale: false,
                               tick: true };
        sample(&mut out, 1_000_000_002, 4242, &s, "MainThread", 12_345_678);
        dropped(&mut out, 1_000_000_003, 4242, 2_500_001);
        failed(&mut out, 1_000_000_004, 4244, "worker-1: no such\tprocess");
        out
    }

    /// DASKPROBE_BLESS=1 rewrites the file from these writers: then the Python
    /// test says whether the reader still reads it.
    #[test]
    fn writes_every_kind_as_the_golden_file_holds() {
        if std::env::var_os("DASKPROBE_BLESS").is_some() {
            std::fs::write(GOLDEN, every_kind()).unwrap();
        }
        let golden = std::fs::read(GOLDEN).expect("tests/data/formats/pyspy.tsv (DASKPROBE_BLESS=1 writes it)");
        assert!(golden == every_kind(), "the sampler no longer writes its lines as {GOLDEN} holds them");
    }
}
