//! The line of an instruction, from a code object's line table. An
//! instruction that has no line of its own (cleanup code the compiler adds)
//! gets the line before it, as py-spy reports it on 3.11+.

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Format {
    /// CPython 3.10: (bytecode delta, signed line delta) byte pairs; a line
    /// delta of -128 marks a range with no line (Objects/lnotab_notes.txt).
    Pairs,
    /// CPython 3.11+: the location table (Objects/locations.md).
    Locations,
}

/// The line of the instruction at byte `offset` of the bytecode.
pub fn line(format: Format, table: &[u8], first_line: i32, offset: i64) -> i32 {
    match format {
        Format::Pairs => line_pairs(table, first_line, offset),
        Format::Locations => line_locations(table, first_line, offset),
    }
}

/// py-spy 0.4 skips a no-line pair without its bytecode delta, so every
/// line after one is off; this follows CPython's advance() instead.
fn line_pairs(table: &[u8], first_line: i32, offset: i64) -> i32 {
    if offset < 0 {
        return first_line; // a frame that has not started (f_lasti -1)
    }
    let (mut line, mut end) = (first_line, 0i64);
    for pair in table.chunks_exact(2) {
        end += pair[0] as i64;
        if pair[1] != 0x80 {
            line += pair[1] as i8 as i32;
        }
        if end > offset {
            break;
        }
    }
    line
}

fn line_locations(t: &[u8], first_line: i32, offset: i64) -> i32 {
    let (mut line, mut end, mut i) = (first_line, 0i64, 0usize);
    while i < t.len() {
        let byte = t[i];
        i += 1;
        end += (((byte & 7) as i64) + 1) * 2;
        line += match (byte >> 3) & 15 {
            15 => 0, // no location
            14 => {
                let d = signed_varint(t, &mut i);
                for _ in 0..3 {
                    varint(t, &mut i); // end line, start and end column
                }
                d
            }
            13 => signed_varint(t, &mut i), // no column
            c @ 10..=12 => {
                i += 2; // one-line form: the code is the line delta, two column bytes
                (c - 10) as i32
            }
            _ => {
                i += 1; // short form: same line, one column byte
                0
            }
        };
        if end > offset {
            break;
        }
    }
    line
}

fn varint(t: &[u8], i: &mut usize) -> u32 {
    let (mut v, mut shift) = (0u32, 0);
    while *i < t.len() {
        let b = t[*i];
        *i += 1;
        v |= ((b & 63) as u32).checked_shl(shift).unwrap_or(0);
        shift += 6;
        if b & 64 == 0 {
            break;
        }
    }
    v
}

fn signed_varint(t: &[u8], i: &mut usize) -> i32 {
    let v = varint(t, i);
    if v & 1 != 0 { -((v >> 1) as i32) } else { (v >> 1) as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The tables of concurrent.futures.thread._WorkItem.run (its `except
    // BaseException as exc` cleanup has no line), compiled at line 2 by each
    // interpreter; the ranges are that interpreter's code.co_lines().

    /// Every instruction of every range decodes to its line; a range with no
    /// line to the line of the range before it.
    fn check(format: Format, table: &[u8], ranges: &[(i64, i64, Option<i32>)]) {
        let mut before = 2;
        for &(start, end, want) in ranges {
            let want = want.unwrap_or(before);
            for offset in (start..end).step_by(2) {
                assert_eq!(line(format, table, 2, offset), want, "offset {offset}");
            }
            before = want;
        }
    }

    #[test]
    fn pairs_of_cpython_3_10_past_a_range_with_no_line() {
        let table = b"\x0a\x01\x04\x01\x02\x01\x18\x01\x0e\x01\x0c\x01\x12\x01\x08\x80\x02\xfe\x10\x04";
        check(Format::Pairs, table, &[(0, 10, Some(3)), (10, 14, Some(4)), (14, 16, Some(5)), (16, 40, Some(6)),
              (40, 54, Some(7)), (54, 66, Some(8)), (66, 84, Some(9)), (84, 92, None), (92, 94, Some(7)),
              (94, 110, Some(11))]);
        assert_eq!(line(Format::Pairs, table, 2, -2), 2, "not started: the first line");
    }

    #[test]
    fn locations_of_cpython_3_12() {
        let table = b"\x80\x00\xd8\x0b\x0f\x8f\x3b\x89\x3b\xd7\x0b\x33\xd1\x0b\x33\xd4\x0b\x35\xd8\x08\x0e\xf0\x02\
                      \x06\x05\x27\xd8\x11\x18\x90\x14\x97\x17\x91\x17\x98\x24\x9f\x29\x99\x29\xd0\x11\x33\xa0\x74\
                      \xa7\x7b\xa1\x7b\xd1\x11\x33\x88\x06\xf0\x0a\x00\x09\x0d\x8f\x0b\x89\x0b\xd7\x08\x1e\xd1\x08\
                      \x1e\x98\x76\xd5\x08\x26\xf8\xf4\x09\x00\x0c\x19\xf2\x00\x02\x05\x14\xd8\x08\x0c\x8f\x0b\x89\
                      \x0b\xd7\x08\x21\xd1\x08\x21\xa0\x23\xd4\x08\x26\xd8\x0f\x13\x8d\x04\xfb\xf0\x05\x02\x05\x14\
                      \xfa";
        check(Format::Locations, table, &[(0, 2, Some(2)), (2, 54, Some(3)), (54, 56, Some(4)), (56, 58, Some(5)),
              (58, 134, Some(6)), (134, 190, Some(11)), (190, 192, None), (192, 208, Some(7)), (208, 262, Some(8)),
              (262, 276, Some(9)), (276, 284, None), (284, 286, Some(7)), (286, 292, None)]);
    }

    #[test]
    fn locations_of_cpython_3_13() {
        let table = b"\x80\x00\xd8\x0b\x0f\x8f\x3b\x89\x3b\xd7\x0b\x33\xd1\x0b\x33\xd7\x0b\x35\xd1\x0b\x35\xd8\x08\x0e\
                      \xf0\x02\x06\x05\x27\xd8\x11\x15\x97\x17\x92\x17\x98\x24\x9f\x29\x99\x29\xd0\x11\x33\xa0\x74\
                      \xa7\x7b\xa1\x7b\xd1\x11\x33\x88\x06\xf0\x0a\x00\x09\x0d\x8f\x0b\x89\x0b\xd7\x08\x1e\xd1\x08\
                      \x1e\x98\x76\xd5\x08\x26\xf8\xf4\x09\x00\x0c\x19\xf3\x00\x02\x05\x14\xd8\x08\x0c\x8f\x0b\x89\
                      \x0b\xd7\x08\x21\xd1\x08\x21\xa0\x23\xd4\x08\x26\xd8\x0f\x13\x8d\x04\xfb\xf0\x05\x02\x05\x14\
                      \xfa";
        check(Format::Locations, table, &[(0, 2, Some(2)), (2, 64, Some(3)), (64, 66, Some(4)), (66, 68, Some(5)),
              (68, 144, Some(6)), (144, 200, Some(11)), (200, 202, None), (202, 220, Some(7)), (220, 274, Some(8)),
              (274, 288, Some(9)), (288, 296, None), (296, 298, Some(7)), (298, 304, None)]);
    }
}
