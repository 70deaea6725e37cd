//! The framing parser driven through its public API: hand-written cases.

use daskprobe_proxy::framing::*;

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

/// Feed `stream` in pseudo-random chunks (xorshift, seeded) and collect events.
fn parse(stream: &[u8], seed: u64) -> Vec<Event> {
    let (mut p, mut out, mut x, mut pos) = (Parser::new(), Vec::new(), seed | 1, 0);
    while pos < stream.len() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = 1 + (x % 97) as usize;
        let end = (pos + n).min(stream.len());
        p.feed(&stream[pos..end], pos as u64, pos as u64, &mut out);
        pos = end;
    }
    out
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
