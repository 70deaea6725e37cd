//! Thread names as threading keeps them: `threading._active` maps each
//! thread's identifier (its pthread_t) to its Thread, whose `_name` is the
//! name. Read here rather than by py-spy, whose lookup reads every thread's
//! stack and scans sys.modules at each call: most of the sampler's CPU as a
//! session starts, when threads appear. `_active` is found once and kept
//! (threading empties it in place after a fork; it never binds a new dict).

use crate::layout::{Attrs, Keys, Layout, Long, Objects};
use crate::remote::{u32_at, u64_at, Remote};
use crate::text;
use std::collections::HashMap;

/// Offsets 3.10 to 3.13 share (Include/object.h, cpython/object.h, internal/pycore_moduleobject.h,
/// cpython/dictobject.h, cpython/longintrepr.h).
const OB_TYPE: usize = 8;
const TP_BASICSIZE: usize = 32;
const TP_FLAGS: usize = 168;
const TP_DICTOFFSET: usize = 288;
const MD_DICT: usize = 16;
const MA_KEYS: usize = 32;
const MA_VALUES: usize = 40;
const LONG_SIZE: usize = 16;
const LONG_DIGITS: usize = 24;
const MANAGED_DICT: u64 = 1 << 4;
const INLINE_VALUES: u64 = 1 << 2;
/// more entries than any dict searched here holds: a torn header
const MAX_ENTRIES: usize = 1 << 16;
/// an identifier of 64 bits is at most three 30-bit digits
const MAX_DIGITS: usize = 3;

pub struct Names {
    /// where the interpreter keeps its pointer to sys.modules
    modules: usize,
    /// threading._active and the type every dict has, once found
    active: Option<(usize, u64)>,
}

impl Names {
    pub fn new(modules: usize) -> Names {
        Names { modules, active: None }
    }

    /// Each thread's name by identifier; empty before threading is imported, None when the
    /// process could not be read as the layout says.
    pub fn read(&mut self, r: &Remote, l: &Layout) -> Option<HashMap<u64, String>> {
        let kept = match self.active {
            Some(kept) => Some(kept),
            None => self.find(r, l)?,
        };
        let Some((active, dict_type)) = kept else {
            return Some(HashMap::new());
        };
        if r.read_u64(active.wrapping_add(OB_TYPE))? != dict_type {
            self.active = None; // cannot happen while threading is loaded: look again next time
            return None;
        }
        let mut names = HashMap::new();
        for (key, thread) in items(r, &l.objects, active)? {
            let name = attr(r, l, thread, "_name").and_then(|a| text::read(r, &l.text, a));
            if let (Some(ident), Some(name)) = (long(r, &l.objects, key), name) {
                names.insert(ident, name);
            }
        }
        if names.is_empty() {
            self.active = None; // a live interpreter has a thread: what was kept is not threading's table
        }
        Some(names)
    }

    /// sys.modules["threading"].__dict__["_active"] (Some(None): threading is not loaded yet); None
    /// when sys.modules could not be read.
    fn find(&mut self, r: &Remote, l: &Layout) -> Option<Option<(usize, u64)>> {
        let modules = r.read_u64(self.modules)? as usize;
        let dict_type = r.read_u64(modules.wrapping_add(OB_TYPE))?;
        let Some(threading) = lookup(r, l, modules, "threading")? else { return Some(None) };
        let globals = r.read_u64(threading.wrapping_add(MD_DICT))? as usize;
        // threading being imported has no _active yet
        self.active = lookup(r, l, globals, "_active")?.map(|active| (active, dict_type));
        Some(self.active)
    }
}

/// The value under the str key `name` in the dict at `dict` (Some(None): no such key); None when the
/// dict could not be read.
fn lookup(r: &Remote, l: &Layout, dict: usize, name: &str) -> Option<Option<usize>> {
    let mut h = [0u8; MA_VALUES + 8];
    r.read(dict, &mut h).then_some(())?;
    find(r, l, u64_at(&h, MA_KEYS) as usize, u64_at(&h, MA_VALUES) as usize, name)
}

/// The value under `name` among the keys at `keys` (values in `values`, a PyDictValues, if not 0),
/// as `lookup` gives it: every key's start read in one call and compared.
fn find(r: &Remote, l: &Layout, keys: usize, values: usize, name: &str) -> Option<Option<usize>> {
    let items = entries(r, &l.objects, keys, values)?;
    let peek = (l.text.str_ascii_data + name.len()).max(l.text.str_compact_data);
    let ranges: Vec<(usize, usize)> = items.iter().map(|&(k, _)| (k, peek)).collect();
    let (mut buf, mut ok) = (vec![0u8; peek * ranges.len()], vec![false; ranges.len()]);
    r.read_many(&ranges, &mut buf, &mut ok);
    let at = (0..items.len()).find(|&i| ok[i] && text::within(&l.text, &buf[i * peek..][..peek]).as_deref() == Some(name));
    Some(at.map(|i| items[i].1))
}

/// The (key, value) pairs of the dict at `dict`, in insertion order, set ones only.
fn items(r: &Remote, o: &Objects, dict: usize) -> Option<Vec<(usize, usize)>> {
    let mut h = [0u8; MA_VALUES + 8];
    r.read(dict, &mut h).then_some(())?;
    entries(r, o, u64_at(&h, MA_KEYS) as usize, u64_at(&h, MA_VALUES) as usize)
}

/// The set (key, value) pairs of the keys object at `keys`, each value from `values` (a
/// PyDictValues) when it is not 0 (a split dict, or an instance's values), else from its entry.
fn entries(r: &Remote, o: &Objects, keys: usize, values: usize) -> Option<Vec<(usize, usize)>> {
    let mut h = [0u8; 40];
    r.read(keys, &mut h).then_some(())?;
    let (n, at, width) = match o.keys {
        Keys::Sized => {
            let size = u64_at(&h, 8) as usize;
            let index_bytes = match size { 0..=0xff => 1, 0x100..=0xffff => 2, 0x10000..=0xffff_ffff => 4, _ => 8 };
            (u64_at(&h, 32) as usize, 40 + size.checked_mul(index_bytes)?, 24)
        }
        Keys::Log2 => (u64_at(&h, 24) as usize, 32 + (1usize << (h[9] & 63)), if h[10] == 0 { 24 } else { 16 }),
    };
    if n > MAX_ENTRIES {
        return None;
    }
    let mut e = vec![0u8; n * width];
    r.read(keys.wrapping_add(at), &mut e).then_some(())?;
    let key = width - 16; // after the hash, where there is one
    let mut v = vec![0u8; if values != 0 { n * 8 } else { 0 }];
    if values != 0 && !r.read(values.wrapping_add(o.values_at), &mut v) {
        return None;
    }
    let value = |i: usize| if values != 0 { u64_at(&v, i * 8) } else { u64_at(&e, i * width + key + 8) };
    Some((0..n).map(|i| (u64_at(&e, i * width + key) as usize, value(i) as usize))
        .filter(|&(k, v)| k != 0 && v != 0).collect())
}

/// The attribute `name` of the object at `obj`, from its instance dict or values.
fn attr(r: &Remote, l: &Layout, obj: usize, name: &str) -> Option<usize> {
    let o = &l.objects;
    // the 4 words before the object (3.11+ keep its dict or values there) and its head
    let mut h = [0u8; 48];
    r.read(obj.checked_sub(32)?, &mut h).then_some(())?;
    let tp = u64_at(&h, 32 + OB_TYPE) as usize;
    let fields = [TP_BASICSIZE, TP_FLAGS, TP_DICTOFFSET, o.cached_keys];
    let (mut t, mut ok) = ([0u8; 32], [false; 4]);
    r.read_many(&fields.map(|f| (tp.wrapping_add(f), 8)), &mut t, &mut ok);
    if !ok.iter().all(|&k| k) {
        return None;
    }
    let (basicsize, flags, dictoffset, cached) = (u64_at(&t, 0) as usize, u64_at(&t, 8), u64_at(&t, 16), u64_at(&t, 24) as usize);
    let before = |words: usize| u64_at(&h, 32 - 8 * words) as usize;
    let managed = flags & MANAGED_DICT != 0;
    let (dict, values) = match o.attrs {
        Attrs::Split if managed => (before(3), before(4)),
        Attrs::Tagged if managed && before(3) & 1 == 1 => (0, before(3).wrapping_add(1)),
        Attrs::Inline if managed && before(3) == 0 && flags & INLINE_VALUES != 0 => (0, obj.wrapping_add(basicsize)),
        Attrs::Tagged | Attrs::Inline if managed => (before(3), 0),
        _ => {
            // 3.10, or a class that keeps its dict at tp_dictoffset
            let at = (dictoffset as i64 > 0).then(|| obj.wrapping_add(dictoffset as usize))?;
            (r.read_u64(at)? as usize, 0)
        }
    };
    match (dict, values) {
        (0, 0) => None,
        (0, values) => find(r, l, cached, values, name).flatten(),
        (dict, _) => lookup(r, l, dict, name).flatten(),
    }
}

/// The int at `addr`, if it is not negative and fits 64 bits.
fn long(r: &Remote, o: &Objects, addr: usize) -> Option<u64> {
    let mut b = [0u8; LONG_DIGITS + 4 * MAX_DIGITS];
    r.read(addr, &mut b).then_some(())?;
    let size = u64_at(&b, LONG_SIZE);
    let digits = match o.long {
        Long::Size => (size as i64 >= 0).then_some(size as usize)?,
        Long::Tag => (size & 3 != 2).then_some((size >> 3) as usize)?,
    };
    (digits <= MAX_DIGITS).then(|| (0..digits).map(|i| (u32_at(&b, LONG_DIGITS + 4 * i) as u64) << (30 * i))
        .fold(0u64, |a, d| a | d))
}
