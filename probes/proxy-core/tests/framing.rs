//! The framing parser driven through its public API: hand-written cases, then
//! properties checked on generated streams cut into generated chunks
//! (proptest). `cargo test` runs a few thousand cases; the ignored
//! `fuzz_a_million` runs a million of each kind:
//!   cargo test --release -p daskprobe-proxy --test framing -- --ignored --nocapture

use daskprobe_proxy::framing::*;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::time::Instant;

fn current(frames: &[Vec<u8>], nosplit_frames: usize) -> Vec<u8> {
    let n = frames.len() as u64;
    let head: u64 = 8 + 8 * n + frames[..nosplit_frames].iter().map(|f| f.len() as u64).sum::<u64>();
    let mut out = head.to_le_bytes().to_vec();
    out.extend_from_slice(&n.to_le_bytes());
    frames.iter().for_each(|f| out.extend_from_slice(&(f.len() as u64).to_le_bytes()));
    frames.iter().for_each(|f| out.extend_from_slice(f));
    out
}

fn legacy(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut out = (frames.len() as u64).to_le_bytes().to_vec();
    frames.iter().for_each(|f| out.extend_from_slice(&(f.len() as u64).to_le_bytes()));
    frames.iter().for_each(|f| out.extend_from_slice(f));
    out
}

/// Where each chunk starts when `len` bytes are cut into chunks of `sizes` (cycled).
fn cut(len: usize, sizes: &[usize]) -> Vec<usize> {
    let (mut starts, mut pos) = (Vec::new(), 0);
    for n in sizes.iter().cycle() {
        if pos >= len {
            break;
        }
        starts.push(pos);
        pos += n;
    }
    starts
}

/// Feeds `stream` cut at `starts`, chunk i read at 2i and delivered at 2i+1,
/// then ends the stream.
fn feed(stream: &[u8], starts: &[usize]) -> Vec<Event> {
    let (mut p, mut out) = (Parser::new(), Vec::new());
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(stream.len());
        p.feed(&stream[start..end], 2 * i as u64, 2 * i as u64 + 1, &mut out);
    }
    out.extend(p.finish(u64::MAX));
    out
}

/// Feed `stream` in pseudo-random chunks of 1 to 97 bytes (xorshift, seeded).
fn parse(stream: &[u8], seed: u64) -> Vec<Event> {
    let mut x = seed | 1;
    let sizes: Vec<usize> = (0..stream.len())
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % 97) as usize
        })
        .collect();
    feed(stream, &cut(stream.len(), &sizes))
}

fn messages(events: Vec<Event>) -> Vec<Message> {
    events
        .into_iter()
        .map(|e| match e {
            Event::Message(m) => m,
            Event::Malformed { reason, .. } => panic!("malformed: {reason}"),
        })
        .collect()
}

#[test]
fn current_framing_any_chunking() {
    let a = vec![vec![0x81, 0xa2, b'o', b'p', 0xa1, b'x'], vec![0x80, 5, 1, 2], vec![]];
    let b = vec![vec![0x92, 1, 2]];
    let mut stream = current(&a, 1);
    stream.extend(current(&b, 1));
    for seed in 1..200 {
        let m = messages(parse(&stream, seed));
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].lens, vec![6, 4, 0]);
        assert_eq!(m[0].kept, vec![(0, a[0].clone())]); // pickle frame not kept
        assert_eq!(m[1].kept, vec![(0, b[0].clone())]);
        assert_eq!(m[0].framing, FRAMING_CURRENT);
    }
}

#[test]
fn a_kept_frame_read_in_chunks_is_allocated_once_at_its_size() {
    let frame0: Vec<u8> = std::iter::once(0x81).chain((1..300_000u32).map(|i| i as u8)).collect();
    let stream = current(&[frame0.clone(), vec![7; 1000]], 1);
    let m = messages(feed(&stream, &cut(stream.len(), &[16 << 10])));
    assert_eq!(m[0].kept[0].1, frame0);
    assert_eq!(m[0].kept[0].1.capacity(), frame0.len());
}

#[test]
fn legacy_framing_keeps_header_and_payload() {
    let a = vec![vec![], vec![0x92, 0x81, 1, 2], vec![0x80, 4]];
    let mut stream = legacy(&a);
    stream.extend(legacy(&[vec![], vec![0x81, 1, 2]]));
    for seed in 1..200 {
        let m = messages(parse(&stream, seed));
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].framing, FRAMING_LEGACY);
        assert_eq!(m[0].kept, vec![(1, a[1].clone())]);
    }
}

#[test]
fn legacy_with_many_frames_and_empty_header() {
    let mut frames = vec![vec![], vec![0x81, 1, 2]];
    frames.extend((0..11).map(|i| vec![i; 3]));
    for seed in 1..50 {
        let m = messages(parse(&legacy(&frames), seed));
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].framing, FRAMING_LEGACY);
        assert_eq!(m[0].lens.len(), 13);
    }
}

#[test]
fn garbage_is_reported_once_then_counted() {
    let mut stream = current(&[vec![0x80]], 1);
    stream.extend(vec![0xff; 64]);
    let ev = parse(&stream, 7);
    assert!(matches!(ev[0], Event::Message(_)));
    assert!(matches!(ev[1], Event::Malformed { .. }));
    assert_eq!(ev.len(), 2);
}

#[test]
fn eof_inside_a_message_is_reported() {
    let stream = current(&[vec![1, 2, 3, 4]], 1);
    let mut p = Parser::new();
    p.feed(&stream[..stream.len() - 1], 0, 0, &mut Vec::new());
    assert!(p.finish(1).is_some());
}

// ---- Properties -------------------------------------------------------------

/// A message as sent: its frames, and (current framing) how many frames the
/// leading length spans.
#[derive(Debug, Clone)]
struct Msg {
    frames: Vec<Vec<u8>>,
    nosplit: Index,
}

impl Msg {
    fn encode(&self, framing: u8) -> Vec<u8> {
        match framing {
            FRAMING_CURRENT => current(&self.frames, self.nosplit.index(self.frames.len() + 1)),
            _ => legacy(&self.frames),
        }
    }

    /// What the parser must keep: non-empty frames that are the header (frame
    /// 0; 2.x: frames 0 and 1), or small and starting like a msgpack map.
    fn kept(&self, framing: u8) -> Vec<(u32, Vec<u8>)> {
        let head = if framing == FRAMING_LEGACY { 2 } else { 1 };
        let small_map = |f: &[u8]| f.len() as u64 <= SUBHEADER_MAX && matches!(f[0], 0x81..=0x8f | 0xde | 0xdf);
        let keep = |i: usize, f: &[u8]| !f.is_empty() && (i < head || small_map(f));
        self.frames.iter().enumerate().filter(|(i, f)| keep(*i, f)).map(|(i, f)| (i as u32, f.clone())).collect()
    }
}

/// Frames of a few bytes, a few hundred, or either side of SUBHEADER_MAX,
/// starting with any byte or one near the msgpack map markers.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    let sub = SUBHEADER_MAX as usize;
    let len = prop_oneof![20 => 0usize..48, 4 => 0usize..600, 1 => sub - 1..sub + 2];
    let first = prop_oneof![any::<u8>(), select(vec![0x80u8, 0x81, 0x8f, 0x90, 0xde, 0xdf])];
    (len, first, any::<u8>()).prop_map(|(len, first, step)| {
        (0..len).map(|i| if i == 0 { first } else { (i as u8).wrapping_mul(step) }).collect()
    })
}

/// A stream of 1 to 5 messages of 1 to 6 frames in one framing. Fewer than
/// 16 frames keeps a 2.x stream from looking like a current one (that needs
/// nframes >= 8 + 8 * len[0] with len[0] >= 1): the parser detects, and a
/// 2.x first message of 16+ frames with a small non-empty frame 0 is
/// ambiguous by construction of the two formats.
fn wellformed() -> impl Strategy<Value = (u8, Vec<Msg>)> {
    let msg = (vec(frame(), 1..7), any::<Index>()).prop_map(|(frames, nosplit)| Msg { frames, nosplit });
    (select(vec![FRAMING_CURRENT, FRAMING_LEGACY]), vec(msg, 1..6))
}

/// Chunk sizes, cycled: byte by byte, small, or up to a few KiB.
fn chunking() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![Just(vec![1]), vec(1usize..=16, 1..8), vec(1usize..=4096, 1..8)]
}

/// Arbitrary input: noise; u64 words at and around the parser's limits;
/// well-formed streams with bytes flipped, inserted, or cut off.
fn arbitrary() -> impl Strategy<Value = Vec<u8>> {
    let word = prop_oneof![
        0u64..64,
        select(vec![MAX_FRAMES, MAX_FRAMES + 1, MAX_FRAME_LEN, MAX_FRAME_LEN + 1, u64::MAX]),
        any::<u64>()
    ];
    let words = (vec(word, 0..8), vec(any::<u8>(), 0..64))
        .prop_map(|(w, tail)| w.iter().flat_map(|x| x.to_le_bytes()).chain(tail).collect());
    let edits = vec((any::<Index>(), any::<u8>(), 0u8..3), 1..4);
    let mutated = (wellformed(), edits).prop_map(|((framing, msgs), edits)| {
        let mut s: Vec<u8> = msgs.iter().flat_map(|m| m.encode(framing)).collect();
        for (at, byte, op) in edits {
            if s.is_empty() {
                break;
            }
            let i = at.index(s.len());
            match op {
                0 => s[i] ^= byte.max(1),
                1 => s.truncate(i),
                _ => s.insert(i, byte),
            }
        }
        s
    });
    prop_oneof![vec(any::<u8>(), 0..256), words, mutated]
}

/// An event without its times: what must not depend on the chunking.
#[derive(Debug, PartialEq)]
enum Seen {
    Message { framing: u8, truncated: bool, lens: Vec<u64>, kept: Vec<(u32, Vec<u8>)> },
    Malformed { offset: u64, reason: String },
}

impl Seen {
    fn of(event: Event) -> Seen {
        match event {
            Event::Message(m) => Seen::Message { framing: m.framing, truncated: m.truncated, lens: m.lens, kept: m.kept },
            Event::Malformed { offset, reason, .. } => Seen::Malformed { offset, reason },
        }
    }

    /// Bytes of the stream this message took: prelude and frames.
    fn size(&self) -> u64 {
        match self {
            Seen::Message { framing, lens, .. } => {
                let words = lens.len() as u64 + if *framing == FRAMING_CURRENT { 2 } else { 1 };
                8 * words + lens.iter().sum::<u64>()
            }
            Seen::Malformed { .. } => 0,
        }
    }
}

fn seen(stream: &[u8], sizes: &[usize]) -> Vec<Seen> {
    feed(stream, &cut(stream.len(), sizes)).into_iter().map(Seen::of).collect()
}

/// Any input, any chunking: the same events as in one chunk, and every byte
/// is either in a message or at or after the one malformed report, which is
/// the last event and points at the first byte no message took.
fn parsed_or_reported(stream: &[u8], sizes: &[usize]) -> Result<(), TestCaseError> {
    let events = seen(stream, sizes);
    prop_assert_eq!(&events, &seen(stream, &[stream.len().max(1)]));
    let parsed: u64 = events.iter().map(Seen::size).sum();
    let report = events.iter().enumerate().find_map(|(i, e)| match e {
        Seen::Malformed { offset, .. } => Some((i, *offset)),
        Seen::Message { .. } => None,
    });
    match report {
        None => prop_assert_eq!(parsed, stream.len() as u64),
        Some((i, offset)) => {
            prop_assert_eq!(i + 1, events.len(), "events after the malformed report");
            prop_assert_eq!(offset, parsed);
            prop_assert!(parsed < stream.len() as u64);
        }
    }
    Ok(())
}

/// Well-formed input, any chunking: exactly the messages encoded, each
/// stamped with the read time of the chunk holding its first byte and the
/// delivery time of the chunk holding its last.
fn same_messages(framing: u8, msgs: &[Msg], sizes: &[usize]) -> Result<(), TestCaseError> {
    let parts: Vec<Vec<u8>> = msgs.iter().map(|m| m.encode(framing)).collect();
    let stream = parts.concat();
    let starts = cut(stream.len(), sizes);
    let chunk = |offset: usize| (starts.partition_point(|&s| s <= offset) - 1) as u64;
    let events = feed(&stream, &starts);
    prop_assert_eq!(events.len(), msgs.len());
    let mut at = 0;
    for ((event, msg), part) in events.into_iter().zip(msgs).zip(&parts) {
        let Event::Message(m) = event else { return Err(TestCaseError::fail("reported malformed")) };
        let lens: Vec<u64> = msg.frames.iter().map(|f| f.len() as u64).collect();
        prop_assert_eq!((m.framing, m.truncated, &m.lens), (framing, false, &lens));
        prop_assert_eq!(m.kept, msg.kept(framing));
        prop_assert_eq!((m.t_first, m.t_last), (2 * chunk(at), 2 * chunk(at + part.len() - 1) + 1));
        at += part.len();
    }
    Ok(())
}

/// Seeded: a failure in `cargo test` fails the same way on every run.
fn runner(cases: u32) -> TestRunner {
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

fn check_arbitrary(cases: u32) {
    let result = runner(cases).run(&(arbitrary(), chunking()), |(stream, sizes)| parsed_or_reported(&stream, &sizes));
    result.unwrap();
}

fn check_wellformed(cases: u32) {
    let result = runner(cases).run(&(wellformed(), chunking()), |((framing, msgs), sizes)| same_messages(framing, &msgs, &sizes));
    result.unwrap();
}

#[test]
fn arbitrary_input_is_parsed_or_reported_whatever_the_chunking() {
    check_arbitrary(10_000);
}

#[test]
fn wellformed_streams_give_exactly_their_messages_whatever_the_chunking() {
    check_wellformed(3_000);
}

/// A panic or a broken property fails the run (proptest shrinks it and
/// prints the smallest input), so a pass means: panics 0.
#[test]
#[ignore = "benchmark: a million inputs of each kind, about two minutes"]
fn fuzz_a_million() {
    for (name, check) in [("arbitrary", check_arbitrary as fn(u32)), ("well-formed", check_wellformed)] {
        let start = Instant::now();
        check(1_000_000);
        println!("{name}: 1000000 inputs in {:.1} s, panics 0", start.elapsed().as_secs_f64());
    }
}
