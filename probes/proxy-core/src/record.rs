//! Capture records: `u32 length | u8 kind | body`, little-endian, the length
//! counting the kind byte. Each kind's body is defined once, in RECORDS of
//! daskprobe/probes/proxy_capture.py: the test below writes every kind into a
//! file that tests/unit/test_formats.py reads back with that definition.

use crate::framing::{Event, Message};

pub const OPEN: u8 = 1;
pub const PEER: u8 = 2;
pub const MESSAGE: u8 = 3;
pub const CLOSE: u8 = 4;
pub const MALFORMED: u8 = 5;
pub const LOST: u8 = 6;
pub const SKIP: u8 = 7;
pub const GAP: u8 = 8;
pub const DROPS: u8 = 9;

struct Rec(Vec<u8>);

impl Rec {
    fn new(kind: u8) -> Self {
        Rec::sized(kind, 0)
    }
    /// A record of `body` bytes after its kind, allocated once: a message's is written per message
    /// forwarded, and growing it from empty reallocated and copied it several times.
    fn sized(kind: u8, body: usize) -> Self {
        let mut v = Vec::with_capacity(5 + body);
        v.extend_from_slice(&[0, 0, 0, 0, kind]);
        Rec(v)
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(mut self, s: &str) -> Self {
        self.0.extend_from_slice(&(s.len() as u16).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn done(mut self) -> Vec<u8> {
        let body = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&body.to_le_bytes());
        self.0
    }
}

/// A connection accepted on a listener. `dir` 0 in later records means
/// peer -> upstream (the accepting side's process), 1 the reverse.
/// `up_local` is the proxy's own end of its connection to the upstream.
pub fn open(conn: u32, t: u64, label: &str, listen: &str, peer: &str, upstream: &str, up_local: &str) -> Vec<u8> {
    Rec::new(OPEN).u32(conn).u64(t).str(label).str(listen).str(peer).str(upstream).str(up_local).done()
}

/// The pid owning the connecting socket, or -1 when it could not be found.
pub fn peer(conn: u32, pid: i32) -> Vec<u8> {
    Rec::new(PEER).u32(conn).u32(pid as u32).done()
}

/// A connection dropped before it was served (the peer reset first, no fd
/// was left, the upstream refused): it has no id and no other record.
pub fn lost(t: u64, label: &str, reason: &str) -> Vec<u8> {
    Rec::new(LOST).u64(t).str(label).str(reason).done()
}

/// The tap joined a direction mid-stream, or lost its place in it, and found it in step again at
/// stream offset `offset`: `bytes` before it went unread.
pub fn skip(conn: u32, dir: u8, t: u64, offset: u64, bytes: u64) -> Vec<u8> {
    Rec::new(SKIP).u32(conn).u8(dir).u64(t).u64(offset).u64(bytes).done()
}

/// The tap never got `bytes` of a direction from stream offset `offset` (the kernel dropped its
/// copies of them): the message they cut, and what follows until a message boundary is found again,
/// are lost (a skip record then says where it read on from).
pub fn gap(conn: u32, dir: u8, t: u64, offset: u64, bytes: u64) -> Vec<u8> {
    Rec::new(GAP).u32(conn).u8(dir).u64(t).u64(offset).u64(bytes).done()
}

/// The kernel dropped `packets` watched packets (no room in the tap's ring) since the last such record.
pub fn drops(t: u64, packets: u64) -> Vec<u8> {
    Rec::new(DROPS).u64(t).u64(packets).done()
}

pub fn close(conn: u32, dir: u8, t: u64, bytes: u64) -> Vec<u8> {
    Rec::new(CLOSE).u32(conn).u8(dir).u64(t).u64(bytes).done()
}

pub fn event(conn: u32, dir: u8, ev: Event) -> Vec<u8> {
    match ev {
        Event::Message(m) => message(conn, dir, m),
        Event::Malformed { t, offset, reason } => {
            Rec::new(MALFORMED).u32(conn).u8(dir).u64(t).u64(offset).str(&reason).done()
        }
    }
}

/// The bytes after its kind of a message record: the fixed fields, the lengths, each kept frame.
fn message_body(m: &Message) -> usize {
    4 + 1 + 1 + 1 + 8 + 8 + 4 + 8 * m.lens.len() + 4 + m.kept.iter().map(|(_, b)| 8 + b.len()).sum::<usize>()
}

fn message(conn: u32, dir: u8, m: Message) -> Vec<u8> {
    let mut r = Rec::sized(MESSAGE, message_body(&m))
        .u32(conn)
        .u8(dir)
        .u8(m.framing)
        .u8(m.truncated as u8)
        .u64(m.t_first)
        .u64(m.t_last)
        .u32(m.lens.len() as u32);
    for l in m.lens {
        r = r.u64(l);
    }
    r = r.u32(m.kept.len() as u32);
    for (idx, bytes) in m.kept {
        r = r.u32(idx).u32(bytes.len() as u32);
        r.0.extend_from_slice(&bytes);
    }
    r.done()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/formats/proxy.bin");

    /// Every kind, with values whose bytes all differ, so that a field written
    /// at another width, place or byte order shows. tests/unit/test_formats.py
    /// expects these values: change both or neither.
    fn every_kind() -> Vec<u8> {
        let message = Message {
            t_first: 0x1122_3344_5566_7788,
            t_last: 0x1122_3344_5566_9900,
            framing: 1,
            truncated: false,
            lens: vec![9, 0x0001_0203_0405, 1],
            kept: vec![(0, b"\x81\xa2op\xa4ping".to_vec()), (2, vec![0x80])],
        };
        let legacy = Message {
            t_first: 0x2122_3344_5566_7788,
            t_last: u64::MAX,
            framing: 2,
            truncated: true,
            lens: vec![5],
            kept: vec![],
        };
        let malformed = Event::Malformed { t: 0x3122_3344_5566_7788, offset: 0x0a0b_0c0d_0e0f, reason: "bad".into() };
        [
            open(7, 0x0102_0304_0506_0708, "worker-0", "127.0.0.1:8786", "127.0.0.1:50001", "127.0.0.1:40001",
                 "127.0.0.1:50002"),
            peer(7, 4242),
            open(0xfedc_ba98, 9, "wörker-é", "[::1]:1", "", "x", ""),
            peer(0xfedc_ba98, -1),
            event(7, 0, Event::Message(message)),
            event(0xfedc_ba98, 1, Event::Message(legacy)),
            event(0xfedc_ba98, 1, malformed),
            close(7, 0, 0x4122_3344_5566_7788, 0x0001_0203_0405_0607),
            close(7, 1, 0x4122_3344_5566_7789, 3),
            close(0xfedc_ba98, 0, 0x4122_3344_5566_7790, 0),
            lost(0x5122_3344_5566_7788, "scheduler", "accept: Too many open files (os error 24)"),
            skip(7, 1, 0x6122_3344_5566_7788, 0x0708_090a_0b0c, 0x0102_0304_0506),
            gap(0xfedc_ba98, 0, 0x7122_3344_5566_7788, 0x1718_191a_1b1c, 0x1112_1314_1516),
            drops(0x8122_3344_5566_7788, 0x2122_2324_2526),
        ]
        .concat()
    }

    /// A message record is allocated once at its size (capacity == length): no reallocation per message.
    #[test]
    fn a_message_record_is_allocated_at_its_size() {
        for kept in [0usize, 1, 100, 5000, 1 << 20] {
            let m = Message { t_first: 1, t_last: 2, framing: 1, truncated: false, lens: vec![kept as u64, 7, 9],
                              kept: vec![(0, vec![0x81; kept]), (2, vec![0x80; 9])] };
            let r = event(3, 1, Event::Message(m));
            assert_eq!(r.capacity(), r.len(), "{kept} bytes kept");
        }
    }

    /// DASKPROBE_BLESS=1 rewrites the file from this writer: then the Python
    /// test says whether the reader still reads it.
    #[test]
    fn writes_every_kind_as_the_golden_file_holds() {
        if std::env::var_os("DASKPROBE_BLESS").is_some() {
            std::fs::write(GOLDEN, every_kind()).unwrap();
        }
        let golden = std::fs::read(GOLDEN).expect("tests/data/formats/proxy.bin (DASKPROBE_BLESS=1 writes it)");
        assert!(golden == every_kind(), "the proxy no longer writes its records as {GOLDEN} holds them");
    }
}
