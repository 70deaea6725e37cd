//! Python str objects read out of another process: compact ones (every
//! identifier, file name and most others), by the header fields in Text.

use crate::layout::Text;
use crate::remote::{u32_at, u64_at, Remote};

/// The longest str read: names and file names, not data.
const MAX_CHARS: usize = 4096;

/// Where a str's characters lie, from its header: (offset in the object, bytes), and bytes per character.
pub fn shape(t: &Text, h: &[u8]) -> Option<(usize, usize, usize)> {
    let len = u64_at(h, t.str_length) as usize;
    let state = u32_at(h, t.str_state);
    let (kind, compact, ascii) = (((state >> 2) & 7) as usize, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
    if !compact || len >= MAX_CHARS || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    Some((if ascii { t.str_ascii_data } else { t.str_compact_data }, len * kind, kind))
}

/// The str at `addr`: its header, then its characters.
pub fn read(remote: &Remote, t: &Text, addr: usize) -> Option<String> {
    let mut h = [0u8; 256];
    let h = h.get_mut(..t.str_compact_data)?;
    if addr == 0 || !remote.read(addr, h) {
        return None;
    }
    let (at, len, kind) = shape(t, h)?;
    let mut data = vec![0u8; len];
    remote.read(addr + at, &mut data).then(|| decode(&data, kind))?
}

/// The str whose copy, from its start, `b` is, if the copy holds all of it.
pub fn within(t: &Text, b: &[u8]) -> Option<String> {
    let (at, len, kind) = shape(t, b.get(..t.str_compact_data)?)?;
    decode(b.get(at..at + len)?, kind)
}

fn decode(data: &[u8], kind: usize) -> Option<String> {
    data.chunks_exact(kind)
        .map(|c| char::from_u32(match kind { 1 => c[0] as u32, 2 => u16::from_ne_bytes([c[0], c[1]]) as u32,
                                             _ => u32::from_ne_bytes(c.try_into().unwrap()) }))
        .collect()
}
