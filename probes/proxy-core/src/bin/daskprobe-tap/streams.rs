//! TCP streams put back together from their segments, each direction fed to the proxy's
//! framing parser, and the proxy's capture records made of them. A direction first seen
//! mid-stream (the tap started after it opened, or segments were lost) is scanned for the
//! next message boundary, and a skip record says how many bytes went unread.
//!
//! Segments the kernel dropped (its ring was full: the tap was off a CPU under load) never come:
//! the sender's TCP does not resend what its peer got. A gap is taken as lost at once when the
//! kernel has dropped packets since its direction last read a segment in order (Tap::take_drops
//! tells before the segments after a drop are read), else when MAX_PENDING bytes wait behind it,
//! or at the direction's end; a gap record says where and how much, and the direction reads on
//! from the next message boundary after it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use daskprobe_proxy::framing::{plausible_start, Event, Parser};
use daskprobe_proxy::peer::{self, EarlyPids};
use daskprobe_proxy::record;

use crate::packets::Segment;

/// Out-of-order bytes held while waiting for a missing segment; past this, it is taken as lost.
const MAX_PENDING: usize = 8 << 20;

enum Sync {
    InStep(Parser),
    /// Bytes since the stream was joined or lost its place, not yet found to start a message;
    /// `from`: their stream offset.
    Seeking { buf: Vec<u8>, from: u64 },
}

struct Direction {
    next: Option<(u32, u64)>, // the next sequence number expected, and its stream offset
    pending: BTreeMap<u64, (Vec<u8>, u64)>, // stream offset -> bytes, their time
    pending_bytes: usize,
    sync: Sync,
    bytes: u64, // seen, read or skipped
    done: bool,
    last_t: u64, // the latest time its bytes were read at
    checked: u64, // Drops::seen when it last read a segment in order that came after them
    lost: bool,   // bytes of it were never got: unread bytes at its end are lost, not merely joined late
}

impl Direction {
    fn new() -> Self {
        Direction { next: None, pending: BTreeMap::new(), pending_bytes: 0,
                    sync: Sync::Seeking { buf: Vec::new(), from: 0 }, bytes: 0, done: false, last_t: 0,
                    checked: 0, lost: false }
    }
}

struct Conn {
    id: u32,
    dirs: [Direction; 2], // 0: client -> server (the listening side), 1: back
}

/// The kernel's drops as the streams know them.
#[derive(Clone, Copy, Default)]
struct Drops {
    seen: u64, // how many times drops were told
    at: u64,   // when they were last told: a segment stamped after came after every drop told
}

pub struct Streams {
    labels: HashMap<u16, String>, // the watched ports: what listens there
    conns: HashMap<(SocketAddr, SocketAddr), Conn>,
    next_id: u32,
    out: Sender<Vec<u8>>,
    drops: Drops,
    early: Option<Arc<EarlyPids>>, // the openers looked up as their SYNs came; None: at open
}

impl Streams {
    pub fn new(labels: HashMap<u16, String>, out: Sender<Vec<u8>>) -> Self {
        Streams { labels, conns: HashMap::new(), next_id: 1, out, drops: Drops::default(), early: None }
    }

    /// Each connection's opener from the lookup its SYN began, not one begun as the stream reads it.
    pub fn with_early_pids(self, early: Arc<EarlyPids>) -> Self {
        Streams { early: Some(early), ..self }
    }

    /// A port to watch from now on, and what listens there.
    pub fn watch(&mut self, port: u16, label: String) {
        self.labels.insert(port, label);
    }

    /// The kernel dropped `packets` packets before now: the gaps waiting are lost, and so is the next
    /// gap of each direction that has not read a segment in order since.
    pub fn dropped(&mut self, t: u64, packets: u64) {
        self.drops = Drops { seen: self.drops.seen + 1, at: t };
        let _ = self.out.send(record::drops(t, packets));
        for conn in self.conns.values_mut() {
            for (k, d) in conn.dirs.iter_mut().enumerate() {
                if !d.pending.is_empty() {
                    lose_gap(&self.out, conn.id, k as u8, d);
                }
            }
        }
    }

    pub fn segment(&mut self, t: u64, s: &Segment) {
        // past MAX_LISTED ports the kernel keeps a range of them: those in it that are not watched end here
        if !self.labels.contains_key(&s.dst.port()) && !self.labels.contains_key(&s.src.port()) {
            return;
        }
        // the listening side: the one a SYN goes to, else the one on a watched port
        let to_server = if s.syn { !s.ack } else { self.labels.contains_key(&s.dst.port()) };
        let (client, server, dir) = if to_server { (s.src, s.dst, 0) } else { (s.dst, s.src, 1) };
        if !self.conns.contains_key(&(client, server)) {
            if s.rst || (!s.syn && s.payload.is_empty()) {
                return; // a bare ACK or the end of a connection gone or never seen: nothing to record
            }
            self.open(t, client, server, s.syn && !s.ack); // its first SYN: the one looked up early
        }
        let conn = self.conns.get_mut(&(client, server)).unwrap();
        let (id, out) = (conn.id, &self.out);
        let d = &mut conn.dirs[dir];
        if s.rst {
            for (k, d) in conn.dirs.iter_mut().enumerate() {
                close(out, id, k as u8, d, t);
            }
        } else {
            take(out, id, dir as u8, d, t, s, self.drops);
        }
        if conn.dirs.iter().all(|d| d.done) {
            self.conns.remove(&(client, server));
        }
    }

    /// `syn`: from the connection's first SYN (else joined midway, or from its SYN-ACK).
    fn open(&mut self, t: u64, client: SocketAddr, server: SocketAddr, syn: bool) {
        let id = self.next_id;
        self.next_id += 1;
        let label = self.labels.get(&server.port()).cloned().unwrap_or_default();
        let (c, srv) = (client.to_string(), server.to_string());
        let _ = self.out.send(record::open(id, t, &label, &srv, &c, &srv, ""));
        match &self.early {
            Some(early) => early.record_pid_of(id, client, server, syn, self.out.clone()),
            None => peer::record_pid_of(id, client, server, self.out.clone()),
        }
        self.conns.insert((client, server), Conn { id, dirs: [Direction::new(), Direction::new()] });
    }

    /// Every direction still open is recorded as closed now, with what it carried.
    /// Closes every direction; returns how many that carried bytes never found a message start.
    pub fn finish(&mut self, t: u64) -> usize {
        let seeking = self.conns.values().flat_map(|c| c.dirs.iter())
            .filter(|d| d.bytes > 0 && matches!(d.sync, Sync::Seeking { .. })).count();
        for conn in self.conns.values_mut() {
            for (k, d) in conn.dirs.iter_mut().enumerate() {
                close(&self.out, conn.id, k as u8, d, t);
            }
        }
        self.conns.clear();
        seeking
    }
}

fn take(out: &Sender<Vec<u8>>, id: u32, dir: u8, d: &mut Direction, t: u64, s: &Segment, drops: Drops) {
    if d.done {
        return;
    }
    if s.syn {
        d.next = Some((s.seq.wrapping_add(1), 0));
        d.sync = Sync::InStep(Parser::new()); // from its first byte: in step
    }
    let (next_seq, next_at) = *d.next.get_or_insert((s.seq, 0));
    let at = next_at as i64 + s.seq.wrapping_sub(next_seq) as i32 as i64;
    let data_end = at + s.payload.len() as i64;
    if data_end > next_at as i64 {
        let skip = (next_at as i64 - at).max(0) as usize; // a retransmission overlapping what was read
        if at <= next_at as i64 {
            if t > drops.at {
                d.checked = drops.seen;
            }
            deliver(out, id, dir, d, t, &s.payload[skip..]);
            drain_pending(out, id, dir, d);
        } else if d.pending.insert(at as u64, (s.payload.to_vec(), t)).is_none() {
            d.pending_bytes += s.payload.len();
            // behind a drop its missing bytes will not come; on a network they may (a retransmission)
            if d.pending_bytes > MAX_PENDING || d.checked < drops.seen {
                lose_gap(out, id, dir, d);
            }
        }
    }
    if s.fin {
        close(out, id, dir, d, t);
    }
}

fn drain_pending(out: &Sender<Vec<u8>>, id: u32, dir: u8, d: &mut Direction) {
    while let Some(entry) = d.pending.first_entry() {
        let (at, next_at) = (*entry.key(), d.next.unwrap().1);
        if at > next_at {
            return;
        }
        let (bytes, t) = entry.remove();
        d.pending_bytes -= bytes.len();
        let skip = (next_at - at) as usize;
        if skip < bytes.len() {
            deliver(out, id, dir, d, t, &bytes[skip..]);
        }
    }
}

/// The missing bytes will not come (the kernel dropped them): say so, go on from the first held
/// segment, and find the next message boundary from there. The message the gap cut is unread from
/// its first byte.
fn lose_gap(out: &Sender<Vec<u8>>, id: u32, dir: u8, d: &mut Direction) {
    let (&first, &(_, t)) = d.pending.first_key_value().unwrap();
    let (seq, at) = d.next.unwrap();
    let gap = first - at;
    let _ = out.send(record::gap(id, dir, t, at, gap));
    d.next = Some((seq.wrapping_add(gap as u32), first));
    d.bytes += gap;
    d.lost = true;
    let from = match &d.sync {
        Sync::Seeking { from, .. } => *from, // still unread since then
        Sync::InStep(p) => p.unfinished_from(),
    };
    d.sync = Sync::Seeking { buf: Vec::new(), from };
    drain_pending(out, id, dir, d);
}

fn deliver(out: &Sender<Vec<u8>>, id: u32, dir: u8, d: &mut Direction, t: u64, data: &[u8]) {
    // A stream's bytes are read in order, so their times never go back: a segment held for one
    // missing before it counts from when that one came, and packets' stamps converted from the
    // ring's clock (see packets::Clocks) cannot put a later message before an earlier one.
    let t = t.max(d.last_t);
    d.last_t = t;
    let (seq, at) = d.next.unwrap();
    d.next = Some((seq.wrapping_add(data.len() as u32), at + data.len() as u64));
    d.bytes += data.len() as u64;
    let mut events = Vec::new();
    match &mut d.sync {
        Sync::InStep(p) => p.feed(data, t, t, &mut events),
        Sync::Seeking { buf, from } => {
            buf.extend_from_slice(data);
            if let Some((found, p)) = seek(buf, at + data.len() as u64, t, &mut events) {
                let _ = out.send(record::skip(id, dir, t, found, found - *from));
                d.sync = Sync::InStep(p);
            }
        }
    }
    for ev in events {
        let _ = out.send(record::event(id, dir, ev));
    }
}

/// The first message start in buf (whose last byte is at stream offset `end`): its offset and
/// a parser that has read from there. Bytes ruled out are dropped from buf.
fn seek(buf: &mut Vec<u8>, end: u64, t: u64, events: &mut Vec<Event>) -> Option<(u64, Parser)> {
    let base = end - buf.len() as u64;
    let mut i = 0;
    while i < buf.len() {
        match plausible_start(&buf[i..]) {
            Some(true) => {
                let at = base + i as u64;
                let mut p = Parser::resynced_at(at);
                p.feed(&buf[i..], t, t, events);
                buf.clear();
                return Some((at, p));
            }
            Some(false) => i += 1,
            None => break,
        }
    }
    buf.drain(..i);
    None
}

/// Its end: what still waits behind a gap is read (the gap's bytes will not come now), and bytes
/// left unread after a loss are said lost by a skip record at the stream's end.
fn close(out: &Sender<Vec<u8>>, id: u32, dir: u8, d: &mut Direction, t: u64) {
    if d.done {
        return;
    }
    drain_pending(out, id, dir, d);
    while !d.pending.is_empty() {
        lose_gap(out, id, dir, d);
    }
    d.done = true;
    match &mut d.sync {
        Sync::InStep(p) => {
            if let Some(ev) = p.finish(t) {
                let _ = out.send(record::event(id, dir, ev));
            }
        }
        Sync::Seeking { from, .. } if d.lost => {
            let end = d.next.map_or(*from, |(_, at)| at);
            let _ = out.send(record::skip(id, dir, t, end, end - *from));
        }
        Sync::Seeking { .. } => {}
    }
    let _ = out.send(record::close(id, dir, t, d.bytes));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// One current-framing message of one frame, a msgpack map {"op": op}.
    fn message(op: u8) -> Vec<u8> {
        let frame = [0x81, 0xa2, b'o', b'p', 0xa1, op];
        [&16u64.to_le_bytes()[..], &1u64.to_le_bytes(), &(frame.len() as u64).to_le_bytes(), &frame].concat()
    }

    fn segment<'a>(seq: u32, syn: bool, payload: &'a [u8]) -> Segment<'a> {
        Segment { src: "127.0.0.1:40000".parse().unwrap(), dst: "127.0.0.1:8786".parse().unwrap(), seq, syn,
                  ack: !syn, fin: false, rst: false, payload }
    }

    /// A segment the kernel dropped leaves a gap: once the drop is told, the gap is lost at once (not
    /// held until 8 MiB wait behind it), said in a gap record, and the messages after it are read.
    #[test]
    fn a_gap_behind_a_drop_is_lost_at_once_and_the_stream_reads_on() {
        let (tx, rx) = channel();
        let mut streams = Streams::new(HashMap::from([(8786, "scheduler".to_string())]), tx);
        let msgs: Vec<Vec<u8>> = (b'a'..=b'e').map(message).collect();
        let mut seq = 1000u32;
        streams.segment(1, &segment(seq, true, &[]));
        seq += 1;
        for (i, m) in msgs.iter().enumerate() {
            if i == 3 {
                streams.dropped(10, 1); // told before the segment after the dropped one (msgs[2]) is read
            }
            if i != 2 {
                streams.segment(20 + i as u64, &segment(seq, false, m));
            }
            seq += m.len() as u32;
        }
        let kinds: Vec<(u8, Vec<u8>)> = rx.try_iter().map(|r| (r[4], r)).collect();
        let of = |k: u8| kinds.iter().filter(|(kind, _)| *kind == k).map(|(_, r)| r.clone()).collect::<Vec<_>>();
        let ops: Vec<u8> = of(record::MESSAGE).iter().map(|r| r[r.len() - 1]).collect();
        assert_eq!(ops, b"abde", "every message but the one dropped");
        let gap = &of(record::GAP)[0];
        let field = |at: usize| u64::from_le_bytes(gap[at..at + 8].try_into().unwrap());
        assert_eq!((field(18), field(26)), ((2 * msgs[0].len()) as u64, msgs[2].len() as u64), "its offset and bytes");
        assert_eq!(of(record::DROPS).len(), 1);
    }
}
