//! A stack reader for CPython 3.11 on x86_64, cheaper per sample than py-spy's
//! (which reads each frame's code object, names and line table anew, about
//! eight reads per frame):
//! - a thread that has not run since its last read keeps its stack: no read;
//! - the thread's frame stack is read in one piece (its data-stack chunk),
//!   so only generator and coroutine frames, which live elsewhere, cost a read;
//! - code objects are cached by address, checked every sample against the
//!   fields the frame's name and line come from, in one call for the stack.
//!
//! It reports what py-spy reports (qualified name, file, line of the last
//! instruction, on-CPU and GIL state); tests/test_pyspy.py compares the two.

use crate::frames::Frames;
use crate::procstat::{State, ThreadStat};
use crate::remote::Remote;
use std::collections::HashMap;
use std::io::Write;

/// Offsets in CPython 3.11's structures (Include/cpython/pystate.h,
/// Include/internal/pycore_frame.h, Include/cpython/code.h,
/// Include/cpython/unicodeobject.h), the same for every 3.11.x on x86_64.
mod layout {
    pub const INTERP_THREADS_HEAD: usize = 16;
    /// through native_thread_id: what the walk of the thread list needs
    pub const TSTATE_HEAD: usize = 168;
    pub const TSTATE_NEXT: usize = 8;
    pub const TSTATE_CFRAME: usize = 56;
    pub const TSTATE_NATIVE_TID: usize = 160;
    /// datastack_chunk, then datastack_top (the chunk's used end)
    pub const TSTATE_CHUNK: usize = 296;
    pub const CFRAME_CURRENT_FRAME: usize = 8;
    pub const FRAME_SIZE: usize = 72;
    pub const FRAME_CODE: usize = 32;
    pub const FRAME_PREVIOUS: usize = 48;
    pub const FRAME_PREV_INSTR: usize = 56;
    /// co_firstlineno (72) .. co_linetable (136, 8 bytes): fields fixed at the code object's creation.
    pub const CODE_FIELDS: (usize, usize) = (72, 72);
    pub const CODE_FIRSTLINENO: usize = 72;
    pub const CODE_FILENAME: usize = 112;
    pub const CODE_NAME: usize = 120;
    pub const CODE_QUALNAME: usize = 128;
    pub const CODE_LINETABLE: usize = 136;
    pub const CODE_ADAPTIVE: usize = 184;
    pub const STR_LENGTH: usize = 16;
    pub const STR_STATE: usize = 32;
    pub const STR_ASCII_DATA: usize = 48;
    pub const STR_COMPACT_DATA: usize = 72;
    pub const BYTES_SIZE: usize = 16;
    pub const BYTES_DATA: usize = 32;
}
use layout::*;

const MAX_FRAMES: usize = 4096;
const MAX_THREADS: usize = 4096;
const MAX_CHUNK: usize = 1 << 18;

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

pub struct ThreadSample {
    pub tid: u64,
    pub active: bool,
    pub owns_gil: bool,
    pub frame_ids: String,
}

struct Code {
    fields: Vec<u8>,
    function: String,
    filename: String,
    first_line: i32,
    table: Vec<u8>,
    ids: HashMap<i32, u64>,
    idle_leaf: bool,
}

impl Code {
    /// The line of the instruction at `prev_instr`: CPython 3.11's location table
    /// (Objects/locations.md), walked as py-spy walks it.
    fn line(&self, code_addr: u64, prev_instr: u64) -> i32 {
        let lasti = prev_instr.wrapping_sub(code_addr) as i64 - CODE_ADAPTIVE as i64;
        let (mut line, mut addr, mut i) = (self.first_line, 0i64, 0usize);
        let t = &self.table;
        while i < t.len() {
            let byte = t[i];
            i += 1;
            addr += (((byte & 7) as i64) + 1) * 2;
            let delta = match (byte >> 3) & 15 {
                15 => 0,
                14 => {
                    let d = signed_varint(t, &mut i);
                    for _ in 0..3 {
                        varint(t, &mut i); // end line, start and end column
                    }
                    d
                }
                13 => signed_varint(t, &mut i),
                c @ 10..=12 => {
                    i += 2;
                    (c - 10) as i32
                }
                _ => {
                    i += 1;
                    0
                }
            };
            line += delta;
            if addr > lasti {
                break;
            }
        }
        line
    }
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

struct Thread {
    stat: Option<ThreadStat>,
    last: Option<State>,
    tstate: u64,
    /// its last stack read: frame ids, and whether the leaf is a known wait
    stack: Option<(String, bool)>,
}

pub struct Reader {
    remote: Remote,
    pid: i32,
    interp: usize,
    gil_holder: usize,
    codes: HashMap<u64, Code>,
    threads: HashMap<u64, Thread>,
}

impl Reader {
    /// `interp`: the PyInterpreterState; `gil_holder`: _PyRuntime.gilstate.tstate_current
    /// (both as py-spy found them when it attached).
    pub fn new(pid: i32, interp: usize, gil_holder: usize) -> Reader {
        Reader { remote: Remote::new(pid), pid, interp, gil_holder, codes: HashMap::new(), threads: HashMap::new() }
    }

    /// One sample of every Python thread; None when the interpreter could not be read.
    pub fn sample(&mut self, frames: &mut Frames, out: &mut impl Write) -> Option<Vec<ThreadSample>> {
        let mut head = [0u8; 16];
        let mut ok = [false; 2];
        self.remote.read_many(&[(self.interp + INTERP_THREADS_HEAD, 8), (self.gil_holder, 8)], &mut head, &mut ok);
        if !ok[0] {
            return None;
        }
        let holder = if ok[1] { u64_at(&head, 8) } else { 0 };
        let mut samples = Vec::new();
        let mut seen = Vec::new();
        let mut t = u64_at(&head, 0);
        let mut ts = [0u8; TSTATE_HEAD];
        while t != 0 && seen.len() < MAX_THREADS && self.remote.read(t as usize, &mut ts) {
            let tid = u64_at(&ts, TSTATE_NATIVE_TID);
            seen.push(tid);
            if let Some(s) = self.thread(tid, t, frames, out) {
                samples.push(ThreadSample { owns_gil: t == holder, ..s });
            }
            t = u64_at(&ts, TSTATE_NEXT);
        }
        self.threads.retain(|tid, _| seen.contains(tid));
        Some(samples)
    }

    /// Each thread's outermost function, by native thread id: a check of this
    /// layout against py-spy's reading when attaching (a build whose
    /// structures differ, such as a debug build, would not agree).
    pub fn outermost_functions(&self) -> HashMap<u64, String> {
        let mut found = HashMap::new();
        let mut t = self.remote.read_u64(self.interp + INTERP_THREADS_HEAD).unwrap_or(0);
        let mut ts = [0u8; TSTATE_HEAD];
        while t != 0 && found.len() < MAX_THREADS && self.remote.read(t as usize, &mut ts) {
            let mut fields = [0u8; CODE_FIELDS.1];
            let code = self.walk(t as usize).and_then(|stack| stack.last().copied())
                .filter(|&(c, _)| self.remote.read(c as usize + CODE_FIELDS.0, &mut fields))
                .and_then(|_| self.load_code(&fields));
            if let Some(code) = code {
                found.insert(u64_at(&ts, TSTATE_NATIVE_TID), code.function);
            }
            t = u64_at(&ts, TSTATE_NEXT);
        }
        found
    }

    fn thread(&mut self, tid: u64, addr: u64, frames: &mut Frames, out: &mut impl Write) -> Option<ThreadSample> {
        let pid = self.pid;
        let th = self.threads.entry(tid).or_insert_with(|| Thread { stat: ThreadStat::open(pid, tid), last: None, tstate: addr, stack: None });
        let now = th.stat.as_ref().and_then(ThreadStat::read);
        // Unchanged stack: not running at either read, and not switched in between.
        let reuse = matches!((th.last, now), (Some(a), Some(b))
            if !a.running && !b.running && a.switches.is_some() && a.switches == b.switches)
            && th.tstate == addr && th.stack.is_some();
        th.last = now;
        th.tstate = addr;
        if !reuse {
            // a failed read leaves no stack to reuse: the thread may have run since the last one
            self.threads.get_mut(&tid).unwrap().stack = self.read_stack(addr as usize, frames, out);
        }
        let (frame_ids, idle_leaf) = self.threads[&tid].stack.clone()?;
        // as py-spy: running per /proc (a thread we cannot stat counts as running), unless parked in a known wait
        let running = now.is_none_or(|s| s.running);
        Some(ThreadSample { tid, active: running && !idle_leaf, owns_gil: false, frame_ids })
    }

    /// The thread's stack as comma-separated frame ids, leaf first, and whether its leaf is a known wait.
    fn read_stack(&mut self, tstate: usize, frames: &mut Frames, out: &mut impl Write) -> Option<(String, bool)> {
        let stack = self.walk(tstate)?;
        let codes: Vec<u64> = {
            let mut c: Vec<u64> = stack.iter().map(|f| f.0).collect();
            c.sort_unstable();
            c.dedup();
            c
        };
        let (at, len) = CODE_FIELDS;
        let ranges: Vec<(usize, usize)> = codes.iter().map(|&c| (c as usize + at, len)).collect();
        let mut buf = vec![0u8; len * codes.len()];
        let mut ok = vec![false; codes.len()];
        self.remote.read_many(&ranges, &mut buf, &mut ok);
        for (i, &c) in codes.iter().enumerate() {
            let fields = &buf[i * len..(i + 1) * len];
            if !ok[i] {
                self.codes.remove(&c);
            } else if self.codes.get(&c).is_none_or(|k| k.fields != fields) {
                match self.load_code(fields) {
                    Some(code) => self.codes.insert(c, code),
                    None => self.codes.remove(&c),
                };
            }
        }
        let mut ids = Vec::with_capacity(stack.len());
        let mut idle_leaf = false;
        for (n, &(c, instr)) in stack.iter().enumerate() {
            // a code object we could not read is skipped, as py-spy skips a frame whose names it cannot read
            let Some(code) = self.codes.get_mut(&c) else { continue };
            let line = code.line(c, instr);
            let id = *code.ids.entry(line).or_insert_with(|| frames.id(out, &code.function, &code.filename, line));
            if n == 0 {
                idle_leaf = code.idle_leaf;
            }
            ids.push(id.to_string());
        }
        // frames but no code object: the walk followed a stale pointer into garbage
        (!ids.is_empty() || stack.is_empty()).then(|| (ids.join(","), idle_leaf))
    }

    /// (code object, last instruction) per frame, leaf first. The thread's
    /// _PyCFrame lives on its C stack, so a pointer to it goes stale as soon as
    /// the thread returns from that evaluation: it is read just before the
    /// frames (not with the thread state, before /proc), and once more when
    /// what it leads to is not a frame, or no frame.
    fn walk(&self, tstate: usize) -> Option<Vec<(u64, u64)>> {
        for attempt in 0..2 {
            let mut ts = [0u8; 24];
            let mut ok = [false; 2];
            self.remote.read_many(&[(tstate + TSTATE_CFRAME, 8), (tstate + TSTATE_CHUNK, 16)], &mut ts, &mut ok);
            if !(ok[0] && ok[1]) {
                return None;
            }
            let (cframe, chunk, top) = (u64_at(&ts, 0) as usize, u64_at(&ts, 8) as usize, u64_at(&ts, 16) as usize);
            let chunk_len = if chunk != 0 && top > chunk && top - chunk <= MAX_CHUNK { top - chunk } else { 0 };
            let mut buf = vec![0u8; 8 + chunk_len];
            let mut ok = [false; 2];
            let ranges = [(cframe + CFRAME_CURRENT_FRAME, 8), (chunk, chunk_len)];
            self.remote.read_many(&ranges[..if chunk_len > 0 { 2 } else { 1 }], &mut buf, &mut ok);
            let first = u64_at(&buf, 0) as usize;
            if ok[0] && first == 0 && attempt == 1 {
                return Some(Vec::new()); // twice: no Python frame on this thread
            }
            let chunk = (chunk, if ok[1] { &buf[8..] } else { &[][..] });
            let stack = if ok[0] && first.is_multiple_of(8) { self.follow(first, chunk) } else { Vec::new() };
            if !stack.is_empty() {
                return Some(stack);
            }
        }
        None
    }

    /// The frames from `frame` back, taken from the copy of the thread's
    /// data-stack chunk (its address and bytes) where they lie in it.
    fn follow(&self, mut frame: usize, (chunk, bytes): (usize, &[u8])) -> Vec<(u64, u64)> {
        let mut stack = Vec::new();
        let mut own = [0u8; FRAME_SIZE];
        while frame != 0 && stack.len() < MAX_FRAMES {
            // a torn read can leave any pointer here: only in-bounds offsets index the chunk
            let at = frame.wrapping_sub(chunk);
            let f: &[u8] = if at < bytes.len() && bytes.len() - at >= FRAME_SIZE {
                &bytes[at..at + FRAME_SIZE]
            } else if self.remote.read(frame, &mut own) {
                &own
            } else {
                break; // torn: keep the frames read so far
            };
            stack.push((u64_at(f, FRAME_CODE), u64_at(f, FRAME_PREV_INSTR)));
            frame = u64_at(f, FRAME_PREVIOUS) as usize;
        }
        stack
    }

    fn load_code(&self, fields: &[u8]) -> Option<Code> {
        let field = |off: usize| u64_at(fields, off - CODE_FIELDS.0) as usize;
        let function = self.string(field(CODE_QUALNAME)).or_else(|| self.string(field(CODE_NAME)))?;
        let filename = self.string(field(CODE_FILENAME))?;
        let table = self.bytes(field(CODE_LINETABLE))?;
        let first_line = i32::from_ne_bytes(fields[CODE_FIRSTLINENO - CODE_FIELDS.0..][..4].try_into().unwrap());
        Some(Code {
            idle_leaf: is_idle_leaf(&function, &filename),
            fields: fields.to_vec(), function, filename, first_line, table, ids: HashMap::new(),
        })
    }

    fn string(&self, addr: usize) -> Option<String> {
        let mut h = [0u8; STR_COMPACT_DATA];
        if addr == 0 || !self.remote.read(addr, &mut h) {
            return None;
        }
        let len = u64_at(&h, STR_LENGTH) as usize;
        let state = u32::from_ne_bytes(h[STR_STATE..STR_STATE + 4].try_into().unwrap());
        let (kind, compact, ascii) = (((state >> 2) & 7) as usize, (state >> 5) & 1 == 1, (state >> 6) & 1 == 1);
        if !compact || len >= 4096 || !matches!(kind, 1 | 2 | 4) {
            return None;
        }
        let mut data = vec![0u8; len * kind];
        let at = addr + if ascii { STR_ASCII_DATA } else { STR_COMPACT_DATA };
        if !self.remote.read(at, &mut data) {
            return None;
        }
        data.chunks_exact(kind)
            .map(|c| char::from_u32(match kind { 1 => c[0] as u32, 2 => u16::from_ne_bytes([c[0], c[1]]) as u32,
                                                 _ => u32::from_ne_bytes(c.try_into().unwrap()) }))
            .collect()
    }

    fn bytes(&self, addr: usize) -> Option<Vec<u8>> {
        let size = self.remote.read_u64(addr + BYTES_SIZE)? as usize;
        if size > 1 << 20 {
            return None;
        }
        let mut data = vec![0u8; size];
        self.remote.read(addr + BYTES_DATA, &mut data).then_some(data)
    }
}

/// py-spy's heuristic for threads parked in a wait that /proc shows as running.
fn is_idle_leaf(function: &str, filename: &str) -> bool {
    (function == "wait" && filename.ends_with("threading.py"))
        || (function == "select" && filename.ends_with("selectors.py"))
        || (function == "poll"
            && (filename.ends_with("asyncore.py") || ["zmq", "gevent", "tornado"].iter().any(|s| filename.contains(s))))
}
