//! Incremental parser of Dask's TCP framing, fed with whatever each read()
//! returned. It only looks at lengths and keeps frame 0 plus small msgpack
//! sub-headers; payload frames are counted, never stored.
//!
//! Current framing (distributed >= 2021):
//!   u64 nosplit | u64 nframes | u64 len[nframes] | frames
//!   where nosplit = 8 + 8*nframes + sum(len[..k]) for some k.
//! Legacy framing (distributed 2.x):
//!   u64 nframes | u64 len[nframes] | frames

pub const MAX_FRAMES: u64 = 1 << 20;
pub const MAX_FRAME_LEN: u64 = 1 << 42;
/// Bytes of frame 0 and sub-headers kept per message; the rest is counted only.
pub const KEEP_CAP: usize = 16 << 20;
/// Bytes of a kept frame allocated when it starts; a larger one grows as its bytes come.
pub const RESERVE_MAX: usize = 1 << 20;
/// A frame after frame 0 is kept only if it is this small and starts like a msgpack map.
pub const SUBHEADER_MAX: u64 = 64 << 10;

pub const FRAMING_CURRENT: u8 = 1;
pub const FRAMING_LEGACY: u8 = 2;

#[derive(Debug)]
pub struct Message {
    pub t_first: u64,
    pub t_last: u64,
    pub framing: u8,
    pub truncated: bool,
    pub lens: Vec<u64>,
    pub kept: Vec<(u32, Vec<u8>)>,
}

pub enum Event {
    Message(Message),
    /// `offset`: where the message that could not be parsed starts in the
    /// stream, so every byte before it was parsed, whatever the chunking.
    Malformed { t: u64, offset: u64, reason: String },
}

#[derive(PartialEq)]
enum Phase {
    Prelude,
    Frames,
    Raw,
}

pub struct Parser {
    framing: u8, // 0 until the first message tells
    phase: Phase,
    hdr: Vec<u8>,
    lens: Vec<u64>,
    frame: usize,
    remaining: u64,
    keeping: bool,
    kept: Vec<(u32, Vec<u8>)>,
    kept_bytes: usize,
    truncated: bool,
    t_first: u64,
    offset: u64, // stream offset of the next byte fed
    start: u64,  // stream offset of the current message's first byte
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap())
}

fn is_msgpack_map(byte: u8) -> bool {
    (0x81..=0x8f).contains(&byte) || byte == 0xde || byte == 0xdf
}

/// A message found by resynchronizing has at most this many frames: Dask's own have a few, and a
/// small bound makes a false start in the middle of a payload all the more unlikely.
pub const RESYNC_MAX_FRAMES: u64 = 4096;

/// Whether `b` starts a current-framing message, for a stream joined mid-way: a frame count of
/// 1..=RESYNC_MAX_FRAMES, plausible lengths, a leading length that is one of the frame boundaries,
/// and a first frame that starts like msgpack (a map or an array: a message or a batch of them).
/// None: more bytes are needed to tell.
pub fn plausible_start(b: &[u8]) -> Option<bool> {
    if b.len() < 16 {
        return None;
    }
    let (nosplit, n) = (u64_at(b, 0), u64_at(b, 1));
    if !(1..=RESYNC_MAX_FRAMES).contains(&n) || nosplit < 8 + 8 * n {
        return Some(false);
    }
    let prelude = 16 + 8 * n as usize;
    if b.len() < prelude + 1 {
        return None;
    }
    let mut sum = 8 + 8 * n;
    let mut boundary = sum == nosplit;
    for i in 0..n as usize {
        let len = u64_at(b, 2 + i);
        if len > MAX_FRAME_LEN || (i == 0 && len == 0) {
            return Some(false);
        }
        sum += len;
        boundary |= sum == nosplit;
    }
    let first = b[prelude];
    Some(boundary && (is_msgpack_map(first) || (0x90..=0x9f).contains(&first) || first == 0xdc || first == 0xdd))
}

impl Parser {
    pub fn new() -> Self {
        Parser::at_offset(0)
    }

    /// A parser whose first byte fed is at `offset` of its stream, in current framing: one that
    /// takes over where a stream joined mid-way was found in step.
    pub fn resynced_at(offset: u64) -> Self {
        Parser { framing: FRAMING_CURRENT, ..Parser::at_offset(offset) }
    }

    fn at_offset(offset: u64) -> Self {
        Parser {
            framing: 0,
            phase: Phase::Prelude,
            hdr: Vec::with_capacity(64),
            lens: Vec::new(),
            frame: 0,
            remaining: 0,
            keeping: false,
            kept: Vec::new(),
            kept_bytes: 0,
            truncated: false,
            t_first: 0,
            offset,
            start: offset,
        }
    }

    /// `read` is when this chunk was read, `delivered` when it was handed on:
    /// a message's first byte is stamped with the first, its last with the second.
    pub fn feed(&mut self, mut data: &[u8], read: u64, delivered: u64, out: &mut Vec<Event>) {
        while !data.is_empty() {
            let used = match self.phase {
                Phase::Raw => data.len(),
                Phase::Prelude => self.feed_prelude(data, read, delivered, out),
                Phase::Frames => self.feed_frames(data, delivered, out),
            };
            self.offset += used as u64;
            data = &data[used..];
        }
    }

    /// Called at end of stream: a message cut short is reported, not dropped.
    pub fn finish(&mut self, now: u64) -> Option<Event> {
        let mid_message = match self.phase {
            Phase::Prelude => !self.hdr.is_empty(),
            Phase::Frames => true,
            Phase::Raw => false,
        };
        mid_message.then(|| Event::Malformed {
            t: now,
            offset: self.start,
            reason: "stream ended inside a message".into(),
        })
    }

    /// How many prelude bytes are needed given what has arrived; never more
    /// than the real prelude, so a short first message cannot stall detection.
    fn prelude_need(&self) -> Result<usize, String> {
        if self.hdr.len() < 16 || self.framing == 0 {
            return Ok(16);
        }
        let n = match self.framing {
            FRAMING_LEGACY => u64_at(&self.hdr, 0),
            _ => u64_at(&self.hdr, 1),
        };
        if n > MAX_FRAMES || (n == 0 && self.framing == FRAMING_LEGACY) {
            return Err(format!("implausible frame count {n}"));
        }
        let fixed = if self.framing == FRAMING_LEGACY { 8 } else { 16 };
        Ok(fixed + 8 * n as usize)
    }

    fn detect(&mut self) -> Result<(), String> {
        let (a, b) = (u64_at(&self.hdr, 0), u64_at(&self.hdr, 1));
        // Dask never sends a message of no frames; 2.x often sends an empty frame 0.
        self.framing = if (1..=MAX_FRAMES).contains(&b) && a >= 8 + 8 * b {
            FRAMING_CURRENT
        } else if a <= MAX_FRAMES {
            FRAMING_LEGACY
        } else {
            return Err(format!("neither framing fits the first 16 bytes ({a}, {b})"));
        };
        Ok(())
    }

    /// True when the next byte starts a new message.
    pub fn at_boundary(&self) -> bool {
        self.phase == Phase::Prelude && self.hdr.is_empty()
    }

    /// Stream offset of the first byte not yet part of a whole message: the start of the message
    /// being read, else the next byte. Where a stream cut here stops being read (the tap's gaps).
    pub fn unfinished_from(&self) -> u64 {
        if self.phase == Phase::Frames || (self.phase == Phase::Prelude && !self.hdr.is_empty()) {
            self.start
        } else {
            self.offset
        }
    }

    fn feed_prelude(&mut self, data: &[u8], read: u64, now: u64, out: &mut Vec<Event>) -> usize {
        if self.hdr.is_empty() {
            self.t_first = read;
            self.start = self.offset;
        }
        let mut used = 0;
        loop {
            let need = match self.prelude_need() {
                Ok(need) => need,
                Err(reason) => return used + self.malformed(now, reason, out),
            };
            // Done once the framing is known and the length no longer grows.
            if self.hdr.len() == need && self.framing != 0 {
                break;
            }
            let take = (need - self.hdr.len()).min(data.len() - used);
            self.hdr.extend_from_slice(&data[used..used + take]);
            used += take;
            if self.hdr.len() < need {
                return used;
            }
            if self.framing == 0 {
                if let Err(reason) = self.detect() {
                    return used + self.malformed(now, reason, out);
                }
            }
        }
        match self.parse_lens() {
            Ok(()) => self.start_frames(now, out),
            Err(reason) => return used + self.malformed(now, reason, out),
        }
        used
    }

    fn parse_lens(&mut self) -> Result<(), String> {
        let skip = if self.framing == FRAMING_LEGACY { 1 } else { 2 };
        let n = (self.hdr.len() / 8) - skip;
        self.lens = (0..n).map(|i| u64_at(&self.hdr, skip + i)).collect();
        if let Some(bad) = self.lens.iter().find(|&&l| l > MAX_FRAME_LEN) {
            return Err(format!("implausible frame length {bad}"));
        }
        if self.framing == FRAMING_CURRENT {
            let nosplit = u64_at(&self.hdr, 0);
            let mut sum = 8 + 8 * n as u64;
            let mut ok = sum == nosplit;
            for &l in &self.lens {
                sum += l;
                ok |= sum == nosplit;
            }
            if !ok {
                return Err(format!("leading length {nosplit} matches no frame boundary"));
            }
        }
        Ok(())
    }

    fn start_frames(&mut self, now: u64, out: &mut Vec<Event>) {
        self.hdr.clear();
        self.frame = 0;
        self.phase = Phase::Frames;
        self.next_frame(now, out);
    }

    /// Skips empty frames; emits the message when no frames are left.
    fn next_frame(&mut self, now: u64, out: &mut Vec<Event>) {
        while self.frame < self.lens.len() && self.lens[self.frame] == 0 {
            self.frame += 1;
        }
        if self.frame == self.lens.len() {
            self.emit(now, out);
        } else {
            self.remaining = self.lens[self.frame];
            self.keeping = false;
        }
    }

    fn feed_frames(&mut self, data: &[u8], now: u64, out: &mut Vec<Event>) -> usize {
        let len = self.lens[self.frame];
        if self.remaining == len {
            // 2.x sends an (often empty) compression header, then the message.
            let head = if self.framing == FRAMING_LEGACY { 2 } else { 1 };
            let wanted = self.frame < head || (len <= SUBHEADER_MAX && is_msgpack_map(data[0]));
            self.keeping = wanted;
            if wanted {
                // at its size at once, not regrown per chunk; but only up to RESERVE_MAX before its bytes come,
                // since the length is the peer's word
                let size = len.min((KEEP_CAP - self.kept_bytes).min(RESERVE_MAX) as u64) as usize;
                self.kept.push((self.frame as u32, Vec::with_capacity(size)));
            }
        }
        let take = (self.remaining.min(data.len() as u64)) as usize;
        if self.keeping {
            let room = KEEP_CAP - self.kept_bytes;
            let keep = take.min(room);
            self.truncated |= keep < take;
            self.kept.last_mut().unwrap().1.extend_from_slice(&data[..keep]);
            self.kept_bytes += keep;
        }
        self.remaining -= take as u64;
        if self.remaining == 0 {
            self.frame += 1;
            self.next_frame(now, out);
        }
        take
    }

    fn emit(&mut self, now: u64, out: &mut Vec<Event>) {
        out.push(Event::Message(Message {
            t_first: self.t_first,
            t_last: now,
            framing: self.framing,
            truncated: self.truncated,
            lens: std::mem::take(&mut self.lens),
            kept: std::mem::take(&mut self.kept),
        }));
        self.kept_bytes = 0;
        self.truncated = false;
        self.phase = Phase::Prelude;
    }

    /// The stream cannot be re-synchronised: report once, then only count bytes.
    fn malformed(&mut self, now: u64, reason: String, out: &mut Vec<Event>) -> usize {
        out.push(Event::Malformed { t: now, offset: self.start, reason });
        self.phase = Phase::Raw;
        self.hdr = Vec::new();
        self.kept = Vec::new();
        0
    }
}

#[cfg(test)]
mod resync_tests {
    use super::plausible_start;

    /// A current-framing message as distributed writes it: frame 0 a msgpack map, then a payload.
    fn message(payload: usize) -> Vec<u8> {
        let frame0 = b"\x81\xa2op\xa4ping".to_vec();
        let lens = [frame0.len() as u64, payload as u64];
        let mut m = (8 + 8 * 2 + lens[0]).to_le_bytes().to_vec();
        m.extend_from_slice(&2u64.to_le_bytes());
        lens.iter().for_each(|l| m.extend_from_slice(&l.to_le_bytes()));
        m.extend_from_slice(&frame0);
        m.extend(std::iter::repeat(0x7b).take(payload));
        m
    }

    #[test]
    fn finds_a_message_start_and_no_other_offset_in_it() {
        let m = message(1000);
        assert_eq!(plausible_start(&m), Some(true));
        assert_eq!(plausible_start(&m[..20]), None, "16 bytes and not all lengths: more are needed");
        for at in 1..m.len() {
            assert_ne!(plausible_start(&m[at..]), Some(true), "a false start at {at}");
        }
    }
}

#[cfg(test)]
mod reserve_tests {
    use super::*;

    /// A peer that announces a 16 MiB frame 0 and sends 10 bytes of it gets RESERVE_MAX reserved, not 16 MiB.
    #[test]
    fn a_kept_frame_reserves_at_most_reserve_max_before_its_bytes_come() {
        let len = (KEEP_CAP - 1) as u64;
        let mut stream = (16 + len).to_le_bytes().to_vec();
        stream.extend_from_slice(&1u64.to_le_bytes());
        stream.extend_from_slice(&len.to_le_bytes());
        stream.extend_from_slice(&[0x81; 10]);
        let (mut p, mut out) = (Parser::new(), Vec::new());
        p.feed(&stream, 1, 2, &mut out);
        assert!(out.is_empty());
        assert_eq!(p.kept.last().unwrap().1.capacity(), RESERVE_MAX);
    }
}
