//! Where CPython keeps what the stack reader needs, per minor version, on
//! x86_64: the walk in cpython.rs is one, the versions differ only here.
//!
//! 3.10, 3.11 and 3.12 come from their headers (Include/cpython/pystate.h,
//! Include/internal/pycore_frame.h, Include/cpython/code.h,
//! Include/cpython/unicodeobject.h, Include/internal/pycore_gil.h; for
//! `Objects`, Include/cpython/object.h, Include/internal/pycore_dict.h and
//! 3.10's Objects/dict-common.h), checked with offsetof against pyenv's
//! 3.10.13, 3.11.7, 3.12.1 and 3.13.0. These structures
//! do not change within a minor version; a build where they differ anyway
//! (a debug build) fails the check against py-spy when attaching.
//! 3.13 publishes them itself: _Py_DebugOffsets, at the start of _PyRuntime.

use crate::linetable::Format;

#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// the reader's name on the capture's `A` line
    pub reader: &'static str,
    pub interp: Interp,
    pub thread: Thread,
    pub frame: Frame,
    pub code: Code,
    pub text: Text,
    pub objects: Objects,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Interp {
    pub threads_head: usize,
    pub gil: Gil,
}

/// What py-spy hands us as the GIL's address holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Gil {
    /// _PyRuntime.gilstate.tstate_current: the holder's PyThreadState, or 0.
    Current,
    /// struct _gil_runtime_state: last_holder holds it only while locked.
    State { holder: usize, locked: usize },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Thread {
    pub next: usize,
    /// thread_id: the pthread_t, which threading.get_ident() returns
    pub ident: usize,
    /// None on 3.10, which keeps no native id (see pthread.rs)
    pub native_tid: Option<usize>,
    /// the current frame's pointer, or (3.11, 3.12) the _PyCFrame's, whose
    /// current frame is at `cframe_frame`
    pub frame: usize,
    pub cframe_frame: Option<usize>,
    /// datastack_chunk, followed by datastack_top (3.11+: frames live there)
    pub chunk: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// bytes read of each frame: through the last field used
    pub size: usize,
    pub code: usize,
    pub back: usize,
    pub instr: usize,
    pub instr_kind: Instr,
    /// 3.12+: frames owned by the C stack are the interpreter's entry frames, not Python's
    pub owner: Option<usize>,
}

pub const FRAME_OWNED_BY_CSTACK: u8 = 3;

#[derive(Clone, Debug, PartialEq)]
pub enum Instr {
    /// f_lasti: the last instruction's index in 2-byte code units (3.10)
    Index,
    /// a pointer into the code object, whose bytecode starts at `adaptive`
    Pointer { adaptive: usize },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Code {
    pub firstlineno: usize,
    pub filename: usize,
    pub name: usize,
    /// 3.11+; on 3.10 py-spy reports co_name, and so do we
    pub qualname: Option<usize>,
    pub linetable: usize,
    pub format: Format,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Text {
    pub str_length: usize,
    pub str_state: usize,
    pub str_ascii_data: usize,
    pub str_compact_data: usize,
    pub bytes_size: usize,
    pub bytes_data: usize,
}

/// What reading an attribute of a Python object takes (names.rs): dicts, ints, and where an
/// instance keeps its attributes. The offsets the versions share are names.rs's constants.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects {
    pub keys: Keys,
    pub long: Long,
    pub attrs: Attrs,
    /// PyHeapTypeObject.ht_cached_keys: the keys an instance's values (3.11+) are laid out by
    pub cached_keys: usize,
    /// where values[0] lies in a PyDictValues (3.13 put four bytes of state before it)
    pub values_at: usize,
}

/// PyDictKeysObject's header.
#[derive(Clone, Debug, PartialEq)]
pub enum Keys {
    /// 3.10: dk_size entries' indices at 40, of 1 to 8 bytes by dk_size; entries of 24 bytes
    Sized,
    /// 3.11+: dk_log2_index_bytes at 9, dk_kind at 10 (0: entries of 24 bytes, with the hash; else 16),
    /// dk_nentries at 24, indices at 32
    Log2,
}

/// How an int says how many 30-bit digits it has.
#[derive(Clone, Debug, PartialEq)]
pub enum Long {
    /// ob_size: their count, negative for a negative int (3.10, 3.11)
    Size,
    /// lv_tag: their count times 8, its low two bits the sign (3.12+)
    Tag,
}

/// Where an instance of a class with Py_TPFLAGS_MANAGED_DICT keeps its attributes.
#[derive(Clone, Debug, PartialEq)]
pub enum Attrs {
    /// 3.10: no such flag; the dict at tp_dictoffset
    Dict,
    /// 3.11: a PyDictValues pointer 4 words before the object, its dict 3 before
    Split,
    /// 3.12: 3 words before it, its dict, or its values pointer less one (the low bit set)
    Tagged,
    /// 3.13: its dict 3 words before it, or else (Py_TPFLAGS_INLINE_VALUES) its values right after it
    Inline,
}

impl Thread {
    /// bytes read of each PyThreadState while walking the list
    pub fn head_len(&self) -> usize {
        self.next.max(self.ident).max(self.native_tid.unwrap_or(0)) + 8
    }
}

impl Code {
    /// (offset, length) of the fields a frame's name, file and line come from,
    /// all fixed when the code object is made: compared every sample, they
    /// tell whether a cached address still holds the same code object.
    pub fn fields(&self) -> (usize, usize) {
        let ptrs = [Some(self.filename), Some(self.name), self.qualname, Some(self.linetable)].into_iter().flatten();
        let start = ptrs.clone().chain([self.firstlineno]).min().unwrap();
        let end = ptrs.max().unwrap() + 8;
        (start, end - start)
    }
}

/// 3.10 and 3.11: str has a wstr pointer; 3.12 dropped it.
const TEXT_WSTR: Text = Text { str_length: 16, str_state: 32, str_ascii_data: 48, str_compact_data: 72,
                                bytes_size: 16, bytes_data: 32 };
const TEXT: Text = Text { str_ascii_data: 40, str_compact_data: 56, ..TEXT_WSTR };

const OBJECTS_312: Objects = Objects { keys: Keys::Log2, long: Long::Tag, attrs: Attrs::Tagged, cached_keys: 880,
                                       values_at: 0 };

fn py310() -> Layout {
    Layout {
        reader: "cpython310",
        interp: Interp { threads_head: 8, gil: Gil::Current },
        thread: Thread { next: 8, ident: 176, native_tid: None, frame: 24, cframe_frame: None, chunk: None },
        frame: Frame { size: 100, code: 32, back: 24, instr: 96, instr_kind: Instr::Index, owner: None },
        code: Code { firstlineno: 40, filename: 104, name: 112, qualname: None, linetable: 120, format: Format::Pairs },
        text: TEXT_WSTR,
        objects: Objects { keys: Keys::Sized, long: Long::Size, attrs: Attrs::Dict, cached_keys: 872, ..OBJECTS_312 },
    }
}

fn py311() -> Layout {
    Layout {
        reader: "cpython311",
        interp: Interp { threads_head: 16, gil: Gil::Current },
        thread: Thread { next: 8, ident: 152, native_tid: Some(160), frame: 56, cframe_frame: Some(8), chunk: Some(296) },
        frame: Frame { size: 72, code: 32, back: 48, instr: 56, instr_kind: Instr::Pointer { adaptive: 184 }, owner: None },
        code: Code { firstlineno: 72, filename: 112, name: 120, qualname: Some(128), linetable: 136,
                     format: Format::Locations },
        text: TEXT_WSTR,
        objects: Objects { long: Long::Size, attrs: Attrs::Split, cached_keys: 872, ..OBJECTS_312 },
    }
}

fn py312() -> Layout {
    Layout {
        reader: "cpython312",
        interp: Interp { threads_head: 72, gil: Gil::State { holder: 8, locked: 16 } },
        thread: Thread { next: 8, ident: 136, native_tid: Some(144), frame: 56, cframe_frame: Some(0), chunk: Some(232) },
        frame: Frame { size: 72, code: 0, back: 8, instr: 56, instr_kind: Instr::Pointer { adaptive: 192 },
                       owner: Some(70) },
        code: Code { firstlineno: 68, filename: 112, name: 120, qualname: Some(128), linetable: 136,
                     format: Format::Locations },
        text: TEXT,
        objects: OBJECTS_312,
    }
}

/// The layout of minor version 3.`minor`; 3.13 needs the first bytes of its
/// _PyRuntime (`debug_offsets`, at least DEBUG_OFFSETS_LEN).
pub fn select(minor: u64, debug_offsets: Option<&[u8]>) -> Result<Layout, String> {
    match (minor, debug_offsets) {
        (10, _) => Ok(py310()),
        (11, _) => Ok(py311()),
        (12, _) => Ok(py312()),
        (13, Some(d)) => from_debug_offsets(d),
        (13, None) => Err("no _PyRuntime to read CPython 3.13's debug offsets from".into()),
        _ => Err(format!("no reader of ours for CPython 3.{minor}")),
    }
}

/// Size of 3.13's _Py_DebugOffsets: 73 eight-byte words.
pub const DEBUG_OFFSETS_LEN: usize = 73 * 8;

/// 3.13's own offsets. _Py_DebugOffsets is a flat array of u64 whose order
/// is fixed within a minor version (Include/internal/pycore_runtime.h), so
/// its fields are named here by index. What it does not say is taken from
/// the 3.13 headers: datastack_top follows datastack_chunk, a compact str's
/// data follows PyASCIIObject and two more words (utf8_length, utf8).
fn from_debug_offsets(d: &[u8]) -> Result<Layout, String> {
    if d.len() < DEBUG_OFFSETS_LEN || &d[..8] != b"xdebugpy" {
        return Err("no _Py_DebugOffsets at _PyRuntime".into());
    }
    let w = |i: usize| u64::from_ne_bytes(d[i * 8..i * 8 + 8].try_into().unwrap()) as usize;
    if w(1) >> 16 != 0x030d {
        return Err(format!("_Py_DebugOffsets of version {:#x}, not 3.13", w(1)));
    }
    if w(2) != 0 {
        return Err("a free-threaded build (no GIL, other structures)".into());
    }
    let gil = w(15);
    Ok(Layout {
        reader: "cpython313",
        interp: Interp { threads_head: w(9), gil: Gil::State { holder: w(18) - gil, locked: w(17) - gil } },
        thread: Thread { next: w(21), ident: w(24), native_tid: Some(w(25)), frame: w(23), cframe_frame: None,
                         chunk: Some(w(26)) },
        frame: Frame { size: [w(29), w(30), w(31), w(33)].into_iter().max().unwrap() + 8, code: w(30), back: w(29),
                       instr: w(31), instr_kind: Instr::Pointer { adaptive: w(43) }, owner: Some(w(33)) },
        code: Code { firstlineno: w(39), filename: w(35), name: w(36), qualname: Some(w(37)), linetable: w(38),
                     format: Format::Locations },
        text: Text { str_length: w(69), str_state: w(68), str_ascii_data: w(70), str_compact_data: w(70) + 16,
                     bytes_size: w(65), bytes_data: w(66) },
        // not among the debug offsets: from the 3.13 headers, as 3.12's but for the inline values
        objects: Objects { attrs: Attrs::Inline, values_at: 8, ..OBJECTS_312 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// _Py_DebugOffsets as pyenv's CPython 3.13.0 has it (read from its
    /// _PyRuntime with ctypes), after the cookie.
    const PY313_0: [u64; 72] = [
        0x30d00f0, 0, 283320, 608, 632, 194968, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16, 7752, 0, 7768,
        7760, 304, 0, 8, 16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 208, 112, 120, 128, 136, 68, 52, 96,
        104, 200, 16, 8, 416, 24, 88, 168, 32, 24, 16, 40, 24, 16, 48, 32, 40, 24, 16, 32, 16, 24, 40, 16, 32,
        64, 32, 16, 40, 240, 200,
    ];

    fn blob(words: &[u64]) -> Vec<u8> {
        let mut b = b"xdebugpy".to_vec();
        words.iter().for_each(|w| b.extend_from_slice(&w.to_ne_bytes()));
        b
    }

    #[test]
    fn cpython_3_13_offsets_are_read_from_its_debug_offsets() {
        let l = select(13, Some(&blob(&PY313_0))).unwrap();
        // what offsetof gives with 3.13.0's headers
        assert_eq!(l.reader, "cpython313");
        assert_eq!(l.interp, Interp { threads_head: 7344, gil: Gil::State { holder: 8, locked: 16 } });
        assert_eq!(l.thread, Thread { next: 8, ident: 152, native_tid: Some(160), frame: 72, cframe_frame: None,
                                      chunk: Some(232) });
        assert_eq!(l.frame, Frame { size: 78, code: 0, back: 8, instr: 56,
                                    instr_kind: Instr::Pointer { adaptive: 200 }, owner: Some(70) });
        assert_eq!(l.code, Code { firstlineno: 68, filename: 112, name: 120, qualname: Some(128), linetable: 136,
                                  format: Format::Locations });
        assert_eq!(l.text, TEXT);
        assert_eq!(l.objects, Objects { keys: Keys::Log2, long: Long::Tag, attrs: Attrs::Inline, cached_keys: 880,
                                        values_at: 8 });
    }

    #[test]
    fn debug_offsets_of_another_build_are_refused() {
        let mut words = PY313_0;
        words[0] = 0x30e00f0; // 3.14: another _Py_DebugOffsets layout
        assert!(select(13, Some(&blob(&words))).unwrap_err().contains("not 3.13"));
        words = PY313_0;
        words[1] = 1;
        assert!(select(13, Some(&blob(&words))).unwrap_err().contains("free-threaded"));
        let mut cookie = blob(&PY313_0);
        cookie[0] = b'y';
        assert!(select(13, Some(&cookie)).is_err());
        assert!(select(13, Some(&blob(&PY313_0[..40]))).is_err(), "too short");
        assert!(select(13, None).is_err());
    }

    #[test]
    fn each_minor_version_has_its_layout() {
        let readers: Vec<_> = (10..=12).map(|m| select(m, None).unwrap().reader).collect();
        assert_eq!(readers, ["cpython310", "cpython311", "cpython312"]);
        assert!(select(9, None).is_err() && select(14, None).is_err());
        // the fields compared per sample span exactly what load_code reads
        assert_eq!(py310().code.fields(), (40, 88));
        assert_eq!(py311().code.fields(), (72, 72));
        assert_eq!(py312().code.fields(), (68, 76));
        assert_eq!(py310().thread.head_len(), 184);
        assert_eq!(py312().thread.head_len(), 152);
    }
}
