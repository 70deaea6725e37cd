//! Capture records: `u32 body_len | u8 kind | body`, little-endian.
//! The layout is read back by daskprobe.probes.proxy_capture; keep the two in step.

use daskprobe_proxy::framing::{Event, Message};

pub const OPEN: u8 = 1;
pub const PEER: u8 = 2;
pub const MESSAGE: u8 = 3;
pub const CLOSE: u8 = 4;
pub const MALFORMED: u8 = 5;
pub const LOST: u8 = 6;

struct Rec(Vec<u8>);

impl Rec {
    fn new(kind: u8) -> Self {
        Rec(vec![0, 0, 0, 0, kind])
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

fn message(conn: u32, dir: u8, m: Message) -> Vec<u8> {
    let mut r = Rec::new(MESSAGE)
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
