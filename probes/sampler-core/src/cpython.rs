//! A stack reader for CPython 3.10 to 3.13 on x86_64, cheaper per sample than
//! py-spy's (which reads each frame's code object, names and line table anew,
//! about eight reads per frame):
//! - a read reports the threads a CPU tick found (Read::Ticked), read afresh,
//!   or the others (Read::OffCpu), or, polling, all (Read::All, with the mean
//!   interval between reads, pace.rs); a tick on a
//!   thread already listed reads no list, and the GIL with its thread state;
//!   the stacks BPF copied at ticks (`copied`, tickprog.rs) are only named;
//! - a thread that has not run since its stack was read keeps it: no read; one
//!   off a CPU keeps it for up to OFF_CPU_REREAD (ten reads, polling) though it
//!   ran since, marked stale (on-CPU samples are the ones whose stacks count);
//! - from 3.11 on, the thread's frame stack is read in one piece (its
//!   data-stack chunk), so only generator and coroutine frames, which live
//!   elsewhere, cost a read; 3.10's frames are objects linked by f_back, a
//!   read each;
//! - code objects are cached by address, checked every sample against the
//!   fields the frame's name and line come from, in one call for the stack
//!   (for BPF's copies, one call for those of a drain).
//!
//! The versions differ only in where things are (layout.rs) and in the line
//! table (linetable.rs). It reports what py-spy reports (qualified name, file,
//! line of the last instruction, on-CPU and GIL state);
//! tests/test_pyspy.py compares the two.

use crate::frames::Frames;
use crate::layout::{Frame, Gil, Instr, Layout, FRAME_OWNED_BY_CSTACK};
use crate::linetable;
use crate::names::Names;
use crate::procstat::{State, ThreadStat};
use crate::pthread;
use crate::remote::{u32_at, u64_at, Remote};
use crate::text;
use crate::tickprog::{Walk, AT_COUNT, AT_FIRST_LINE, AT_FRAMES, AT_GIL, AT_IDENT, AT_NATIVE_TID, AT_TSTATE, GIL_BYTES,
                      NONE, PRINT, SLOT};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::rc::Rc;
use std::time::{Duration, Instant};

const MAX_FRAMES: usize = 4096;
const MAX_THREADS: usize = 4096;
const MAX_CHUNK: usize = 1 << 18;
/// more than any layout's thread head, frame or GIL state
const MAX_STRUCT: usize = 256;
const PAGE: usize = 4096;
/// bytes read at once from a code object's name, file name and line table (each a header, then its data)
const PEEK: usize = 384;
/// The thread list is walked again at least this often, even when nothing says it changed.
const RELIST: Duration = Duration::from_secs(1);
/// How long a thread found off a CPU keeps the stack last read, though it ran since: polling (at
/// least; ten mean intervals where reads are spread out, as long as with ticks), and with ticks
/// (which read it whenever it is on a CPU; then its stack off one is only where it waits).
const OFF_CPU_REREAD: Duration = Duration::from_millis(100);
const OFF_CPU_REREAD_TICKED: Duration = Duration::from_secs(1);

/// Where `len` bytes at `addr` start in a copy of (address, length), if it holds
/// them all: a torn read can leave any pointer, so only in-bounds ones index a copy.
fn offset_in((base, copied): (usize, usize), addr: usize, len: usize) -> Option<usize> {
    let at = addr.wrapping_sub(base);
    (at < copied && copied - at >= len).then_some(at)
}

#[derive(Clone)]
pub struct ThreadSample {
    pub tid: u64,
    /// the Python thread identifier (threading.get_ident()), 0 when unknown
    pub ident: u64,
    pub active: bool,
    pub owns_gil: bool,
    pub frame_ids: Rc<str>,
    /// its stack was read before this sample and the thread ran since (it is off a CPU now)
    pub stale: bool,
    /// read because a CPU's tick found the thread on it (ticks.rs): it stands for the period of that tick
    pub tick: bool,
}

/// Which threads of a process one read reports.
#[derive(Clone, Copy)]
pub enum Read<'a> {
    /// every thread (without ticks: polling), at about this interval
    All(Duration),
    /// the threads ticks found on a CPU, by native id, one sample per tick, each read afresh
    Ticked(&'a [u64]),
    /// with ticks, the others: every thread but those /proc shows running (ticks sample them), the
    /// GIL holder always
    OffCpu,
}

struct Code {
    fields: Vec<u8>,
    function: String,
    filename: String,
    first_line: i32,
    table: Vec<u8>,
    /// frame id by instruction offset: decoding the line table at each read was an eighth of the sampler's CPU
    ids: HashMap<i64, u64>,
    idle_leaf: bool,
    /// 3.12+'s shim code (no file, or "<shim>"), which py-spy leaves out
    shim: bool,
}

struct Thread {
    tid: u64,
    ident: u64,
    stat: Option<ThreadStat>,
    last: Option<State>,
    /// its last stack read: frame ids, and whether the leaf is a known wait
    stack: Option<(Rc<str>, bool)>,
    /// when that stack was read, and the thread's state then
    read_at: Option<(Instant, Option<State>)>,
}

/// The thread a PyThreadState holds: its identifier (pthread_t), and its native id where the state has one.
type Holds = (u64, Option<u64>);

/// One entry of the interpreter's thread list.
#[derive(Clone, Copy)]
struct Listed {
    tstate: u64,
    ident: u64,
    native_tid: Option<u64>,
}

/// Buffers kept from one sample to the next, so that a sample allocates
/// only for what is new (a stack not seen, a code object not cached).
#[derive(Default)]
struct Scratch {
    threads: Vec<Listed>,
    /// (code object, byte offset of its last instruction) per frame, leaf first
    stack: Vec<(u64, i64)>,
    /// 8 bytes for the current frame's pointer, then the used part of the thread's data-stack chunk
    chunk: Vec<u8>,
    /// memory read around a frame outside the chunk
    window: Vec<u8>,
    codes: Vec<u64>,
    /// each copied frame's code object, with its first line and PRINT bytes as BPF copied them at the tick
    prints: Vec<(u64, [u8; 4 + PRINT])>,
    ranges: Vec<(usize, usize)>,
    fields: Vec<u8>,
    ok: Vec<bool>,
    /// the GIL holder's PyThreadState as the last frame_pointers read it (0: none, or unknown)
    holder: u64,
}

pub struct Reader {
    remote: Remote,
    pid: i32,
    layout: Layout,
    interp: usize,
    gil: usize,
    /// 3.10: where glibc's struct pthread keeps the thread's native id
    tid_offset: Option<usize>,
    codes: HashMap<u64, Code>,
    /// by PyThreadState address
    threads: HashMap<u64, Thread>,
    s: Scratch,
    /// when the thread list was last walked
    listed: Instant,
    /// a listed thread could not be read: walk the list again at the next sample
    relist: bool,
    /// threads ticked, not known, for which the list was walked since the last RELIST walk
    walked_for: std::collections::HashSet<u64>,
    names: Names,
}

impl Reader {
    /// `interp`: the PyInterpreterState; `gil`: what py-spy found as the GIL's
    /// address when it attached (see layout::Gil); `modules`: where the interpreter keeps sys.modules.
    pub fn new(pid: i32, layout: Layout, interp: usize, gil: usize, modules: usize) -> Result<Reader, String> {
        let mut r = Reader { remote: Remote::new(pid), pid, layout, interp, gil, tid_offset: None,
                             codes: HashMap::new(), threads: HashMap::new(), s: Scratch::default(),
                             listed: Instant::now(), relist: true, walked_for: Default::default(),
                             names: Names::new(modules) };
        if r.layout.thread.native_tid.is_none() {
            let mut listed = Vec::new();
            r.list_threads(&mut listed, true);
            let idents: Vec<u64> = listed.iter().map(|t| t.ident).collect();
            r.tid_offset = Some(pthread::tid_offset(&r.remote, pid, &idents)?);
        }
        Ok(r)
    }

    pub fn name(&self) -> &'static str {
        self.layout.reader
    }

    /// Each thread's name (threading's), by identifier (names.rs); None where it could not be read.
    pub fn thread_names(&mut self) -> Option<HashMap<u64, String>> {
        // torn bytes cost this lookup (see Target::read)
        let (names, remote, layout) = (&mut self.names, &self.remote, &self.layout);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| names.read(remote, layout))).ok().flatten()
    }

    /// One sample of every Python thread into `samples`; false when the interpreter could not be read.
    pub fn sample(&mut self, frames: &mut Frames, out: &mut impl Write, samples: &mut Vec<ThreadSample>,
                  read: Read) -> bool {
        if let Read::Ticked(tids) = read {
            if let Some(known) = self.known(tids) {
                self.sample_known(&known, frames, out, samples);
                return true;
            }
        }
        let mut listed = std::mem::take(&mut self.s.threads);
        let walk = self.must_walk() || self.unknown_ticked(read);
        let holder = self.list_threads(&mut listed, walk);
        for (i, &t) in listed.iter().enumerate() {
            // A thread state made for a thread not yet started holds no ids, or its maker's (new ones
            // go first), until it starts: it is left out, and the list walked again until it has its own.
            if t.ident == 0 || t.native_tid == Some(0) || listed[i + 1..].iter().any(|o| o.ident == t.ident) {
                self.relist = true;
                continue;
            }
            // the GIL holder's stack is always current: the GIL finding names what it runs, on a CPU or not
            let owns_gil = Some(t.tstate) == holder;
            if let Some((s, n)) = self.thread(t, owns_gil, frames, out, read) {
                samples.extend(std::iter::repeat_n(ThreadSample { owns_gil, ..s }, n));
            }
        }
        self.threads.retain(|addr, _| listed.iter().any(|t| t.tstate == *addr));
        self.s.threads = listed;
        holder.is_some()
    }

    /// (PyThreadState, ticks) of each thread ticked, if all are threads listed before and the list
    /// need not be walked: then their stacks are read without reading the list.
    fn known(&self, tids: &[u64]) -> Option<Vec<(u64, usize)>> {
        if self.relist {
            return None;
        }
        let mut known: Vec<(u64, usize)> = Vec::new();
        for &tid in tids {
            let (&tstate, _) = self.threads.iter().find(|(_, th)| th.tid == tid)?;
            match known.iter_mut().find(|k| k.0 == tstate) {
                Some(k) => k.1 += 1,
                None => known.push((tstate, 1)),
            }
        }
        Some(known)
    }

    fn sample_known(&mut self, known: &[(u64, usize)], frames: &mut Frames, out: &mut impl Write,
                    samples: &mut Vec<ThreadSample>) {
        for &(tstate, n) in known {
            let ident = self.threads[&tstate].ident;
            if let Some(s) = self.ticked(Listed { tstate, ident, native_tid: None }, frames, out) {
                // the GIL, read with the thread state (frame_pointers)
                let owns_gil = self.s.holder == tstate;
                samples.extend(std::iter::repeat_n(ThreadSample { owns_gil, ..s }, n));
            }
        }
    }

    /// Each thread's outermost function, by Python thread identifier: a check
    /// of the layout against py-spy's reading when attaching (a build whose
    /// structures differ, such as a debug build, would not agree).
    pub fn outermost_functions(&mut self) -> HashMap<u64, String> {
        let mut listed = Vec::new();
        self.list_threads(&mut listed, true);
        let mut found = HashMap::new();
        for t in listed {
            let Some(&(code, _)) = self.walk(t.tstate as usize, None).and_then(|_| self.s.stack.last()) else { continue };
            let (at, len) = self.layout.code.fields();
            let mut fields = vec![0u8; len];
            if let Some(code) = self.remote.read(code as usize + at, &mut fields).then(|| self.load_code(&fields)).flatten() {
                found.insert(t.ident, code.function);
            }
        }
        found
    }

    /// Whether the thread list may have changed in a way its head does not show (CPython puts a
    /// new thread at the head): a listed thread gone or unreadable, or RELIST since the last walk.
    fn must_walk(&mut self) -> bool {
        let walk = self.relist || self.listed.elapsed() >= RELIST;
        if walk {
            (self.listed, self.relist) = (Instant::now(), false);
            self.walked_for.clear();
        }
        walk
    }

    /// Whether a read on ticks found a thread not known and not walked for since the last walk: a new
    /// thread in an old one's thread state, say (the list's head unchanged). A native thread's ticks
    /// (where BPF does not drop them) walk the list once per RELIST, not at each.
    fn unknown_ticked(&mut self, read: Read) -> bool {
        let Read::Ticked(tids) = read else { return false };
        let mut new = false;
        for &tid in tids {
            if !self.threads.values().any(|th| th.tid == tid) && self.walked_for.insert(tid) {
                new = true;
            }
        }
        new
    }

    /// Fills `into` with the interpreter's threads, walking their list only
    /// when `walk` or when its head is not the first of `into` (a read per
    /// thread, most of an idle process's sample otherwise). Returns the GIL
    /// holder's PyThreadState, Some(0) when no thread holds it or it is
    /// unknown, and None when the interpreter could not be read.
    fn list_threads(&self, into: &mut Vec<Listed>, walk: bool) -> Option<u64> {
        let l = &self.layout;
        let mut head = [0u8; 8 + MAX_STRUCT];
        let mut ok = [false; 2];
        self.remote.read_many(&[(self.interp + l.interp.threads_head, 8), self.gil_range()], &mut head, &mut ok);
        if !ok[0] {
            return None;
        }
        let holder = self.holder(&head[8..], ok[1]);
        let mut t = u64_at(&head, 0);
        if !walk && into.first().map_or(0, |f| f.tstate) == t {
            return Some(holder);
        }
        into.clear();
        let mut ts = [0u8; MAX_STRUCT];
        let ts = &mut ts[..l.thread.head_len()];
        while t != 0 && into.len() < MAX_THREADS && self.remote.read(t as usize, ts) {
            into.push(Listed { tstate: t, ident: u64_at(ts, l.thread.ident),
                               native_tid: l.thread.native_tid.map(|at| u64_at(ts, at)) });
            t = u64_at(ts, l.thread.next);
        }
        Some(holder)
    }

    /// Where the GIL's state is read (see layout::Gil).
    fn gil_range(&self) -> (usize, usize) {
        match self.layout.interp.gil {
            Gil::Current => (self.gil, 8),
            Gil::State { holder, locked } => (self.gil, holder.max(locked) + 8),
        }
    }

    /// The GIL holder's PyThreadState from what gil_range read; 0 when none holds it or it was not read.
    fn holder(&self, gil: &[u8], read: bool) -> u64 {
        match self.layout.interp.gil {
            _ if !read => 0,
            Gil::Current => u64_at(gil, 0),
            Gil::State { holder, locked } => if u32_at(gil, locked) != 0 { u64_at(gil, holder) } else { 0 },
        }
    }

    /// Whether the listed thread state `t` still holds the thread `th` read from it before. Its memory
    /// can be reused by a thread started later, and on 3.10, which keeps no native id in it, with the
    /// ended thread's pthread_t: a tick of a thread not known is how such a one shows first, and then
    /// the native id is read from the pthread.
    fn still_holds(&self, th: &Thread, t: Listed, read: Read) -> bool {
        let other_ticked = matches!(read, Read::Ticked(tids) if !tids.contains(&th.tid));
        th.ident == t.ident && match t.native_tid {
            Some(n) => n == th.tid,
            None => !other_ticked
                || self.tid_offset.and_then(|at| pthread::tid(&self.remote, t.ident, at)) == Some(th.tid),
        }
    }

    /// The thread's sample, and how many times it is reported (its ticks, when ticked).
    fn thread(&mut self, t: Listed, owns_gil: bool, frames: &mut Frames, out: &mut impl Write, read: Read)
              -> Option<(ThreadSample, usize)> {
        let same = self.threads.get(&t.tstate).is_some_and(|th| self.still_holds(th, t, read));
        if !same {
            let tid = t.native_tid.or_else(|| pthread::tid(&self.remote, t.ident, self.tid_offset?))?;
            let th = Thread { tid, ident: t.ident, stat: ThreadStat::open(self.pid, tid), last: None, stack: None,
                              read_at: None };
            self.threads.insert(t.tstate, th);
        }
        let th = self.threads.get_mut(&t.tstate).unwrap();
        if let Read::Ticked(tids) = read {
            let ticks = tids.iter().filter(|&&tid| tid == th.tid).count();
            return (ticks > 0).then(|| self.ticked(t, frames, out)).flatten().map(|s| (s, ticks));
        }
        let now = th.stat.as_ref().and_then(|s| s.read(th.last));
        if now.is_none() {
            // gone, or listed before it had its ids: the list is walked again next time
            self.relist = true;
            if th.stat.is_some() {
                // its /proc files read no more: it has ended, and its thread state may be another's
                self.threads.remove(&t.tstate);
                return None;
            }
        }
        th.last = now;
        // as py-spy: running per /proc (a thread we cannot stat counts as running)
        let running = now.is_none_or(|s| s.running);
        if running && !owns_gil && matches!(read, Read::OffCpu) {
            return None;
        }
        let read_at = th.read_at.filter(|_| th.stack.is_some());
        // Unchanged since its stack was read: off a CPU then and now, and not switched in between.
        let unchanged = matches!((read_at, now), (Some((_, Some(a))), Some(b))
                                 if !a.running && !b.running && a.ran.is_some() && a.ran == b.ran);
        // Off a CPU but run since: Dask's threads (event loops, its profiler) mostly wake between two
        // reads to sleep again at once, and only on-CPU samples' stacks say what the CPU did. Such a
        // thread keeps the stack read up to OFF_CPU_REREAD before, marked stale.
        let keep = match read {
            Read::All(every) => (every * 10).clamp(OFF_CPU_REREAD, OFF_CPU_REREAD_TICKED),
            _ => OFF_CPU_REREAD_TICKED,
        };
        let recent = read_at.is_some_and(|(at, _)| at.elapsed() < keep);
        let stale = !unchanged && !running && !owns_gil && recent;
        let tid = th.tid;
        if !unchanged && !stale {
            // a failed read leaves no stack to reuse: the thread may have run since the last one
            let stack = self.read_stack(t.tstate as usize, (t.ident, tid), frames, out);
            let th = self.threads.get_mut(&t.tstate).unwrap();
            (th.stack, th.read_at) = (stack, Some((Instant::now(), now)));
        }
        let (frame_ids, idle_leaf) = self.threads[&t.tstate].stack.clone()?;
        if now.is_none() && t.native_tid.is_none() {
            // 3.10: a new thread can have the old one's pthread_t; its tid is found anew next time
            self.threads.remove(&t.tstate);
        }
        // on a CPU unless parked in a known wait
        let s = ThreadSample { tid, ident: t.ident, active: running && !idle_leaf, owns_gil: false, frame_ids, stale,
                               tick: false };
        Some((s, 1))
    }

    /// A thread a tick found on a CPU: its stack read now, with no /proc read. Its state at the read is
    /// left unknown, so that a later read's "unchanged" test never holds against it.
    fn ticked(&mut self, t: Listed, frames: &mut Frames, out: &mut impl Write) -> Option<ThreadSample> {
        let tid = self.threads.get(&t.tstate)?.tid;
        let stack = self.read_stack(t.tstate as usize, (t.ident, tid), frames, out);
        let th = self.threads.get_mut(&t.tstate)?;
        (th.stack, th.read_at, th.last) = (stack, Some((Instant::now(), None)), None);
        let (frame_ids, idle_leaf) = th.stack.clone()?;
        Some(ThreadSample { tid: th.tid, ident: t.ident, active: !idle_leaf, owns_gil: false, frame_ids, stale: false,
                            tick: true })
    }

    /// The thread's stack as comma-separated frame ids, leaf first, and whether its leaf is a known wait;
    /// None unless the thread state still holds the thread `ident` (see walk).
    fn read_stack(&mut self, tstate: usize, thread: (u64, u64), frames: &mut Frames, out: &mut impl Write)
                  -> Option<(Rc<str>, bool)> {
        self.walk(tstate, Some(thread))?;
        self.name_stack(frames, out)
    }

    /// The scratch stack as read_stack returns it, its code objects checked.
    fn name_stack(&mut self, frames: &mut Frames, out: &mut impl Write) -> Option<(Rc<str>, bool)> {
        self.s.codes.clear();
        self.s.codes.extend(self.s.stack.iter().map(|f| f.0));
        self.check_codes();
        self.names(frames, out)
    }

    /// The scratch stack as read_stack returns it, from the code objects as cached.
    fn names(&mut self, frames: &mut Frames, out: &mut impl Write) -> Option<(Rc<str>, bool)> {
        let mut ids = String::new();
        let mut idle_leaf = None;
        let format = self.layout.code.format;
        for &(c, offset) in &self.s.stack {
            // a code object we could not read is skipped, as py-spy skips a frame whose names it cannot read
            let Some(code) = self.codes.get_mut(&c).filter(|code| !code.shim) else { continue };
            let id = *code.ids.entry(offset).or_insert_with(|| {
                let line = linetable::line(format, &code.table, code.first_line, offset);
                frames.id(out, &code.function, &code.filename, line)
            });
            idle_leaf.get_or_insert(code.idle_leaf);
            let comma = if ids.is_empty() { "" } else { "," };
            let _ = write!(ids, "{comma}{id}");
        }
        // frames but no code object: the walk followed a stale pointer into garbage
        (!ids.is_empty() || self.s.stack.is_empty()).then(|| (Rc::from(ids), idle_leaf.unwrap_or(false)))
    }

    /// Where BPF finds this interpreter's frames (tickprog.rs); a frame_size of 0 (its ticks come
    /// to the sampler) where a frame or the GIL's state would not fit BPF's copy.
    pub fn bpf_walk(&self) -> Walk {
        let (t, f, c) = (&self.layout.thread, &self.layout.frame, &self.layout.code);
        let (gil, gil_len) = self.gil_range();
        let word_in_frame = |at: usize| at + 8 <= f.size && at.is_multiple_of(8);
        if f.size > AT_FIRST_LINE || !word_in_frame(f.back) || !word_in_frame(f.code) || gil_len > GIL_BYTES {
            return Walk::default();
        }
        let or_none = |o: Option<usize>| o.map_or(NONE, |o| o as u64);
        Walk { frame: t.frame as u64, cframe_frame: or_none(t.cframe_frame), native_tid: or_none(t.native_tid),
               frame_size: f.size as u64, back: f.back as u64, gil: gil as u64, gil_len: gil_len as u64,
               ident: t.ident as u64, pthread_tid: or_none(self.tid_offset), code: f.code as u64,
               print: print_start(c).unwrap_or(0) as u64, first_line: c.firstlineno as u64 }
    }

    /// (native id, PyThreadState) of each thread listed: BPF reads their stacks at their ticks.
    pub fn listed(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.threads.iter().map(|(&tstate, th)| (th.tid, tstate))
    }

    /// The samples of stacks BPF copied at ticks of this process (tickprog.rs), in the order given,
    /// their code objects checked in one call for them all. None where the thread state no longer
    /// held the thread (the list is walked again at the next read) or the copy is not a stack.
    pub fn copied(&mut self, records: &[&[u8]], frames: &mut Frames, out: &mut impl Write)
                  -> Vec<Option<ThreadSample>> {
        self.s.prints.clear();
        let stacks: Vec<Option<Vec<(u64, i64)>>> = records.iter().map(|rec| self.copied_stack(rec)).collect();
        // a code object cached with the fields BPF found at the tick is the one there: not read again
        let at = print_in_fields(&self.layout.code);
        let cached = |c: &u64, p: &[u8; 4 + PRINT]| at.is_some_and(|(line, print)| self.codes.get(c).is_some_and(|k| {
            k.fields[line..line + 4] == p[..4] && k.fields[print..print + PRINT] == p[4..]
        }));
        let doubtful: Vec<u64> = self.s.prints.iter().filter(|(c, p)| !cached(c, p)).map(|f| f.0).collect();
        self.s.codes.clear();
        self.s.codes.extend(doubtful);
        self.check_codes();
        records.iter().zip(stacks).map(|(rec, stack)| {
            self.s.stack = stack?;
            let names = self.names(frames, out);
            let tstate = u64_at(rec, AT_TSTATE);
            let owns_gil = self.holder(&rec[AT_GIL..AT_GIL + GIL_BYTES], true) == tstate;
            let th = self.threads.get_mut(&tstate)?;
            (th.stack, th.read_at, th.last) = (names, Some((Instant::now(), None)), None);
            let (frame_ids, idle_leaf) = th.stack.clone()?;
            Some(ThreadSample { tid: th.tid, ident: th.ident, active: !idle_leaf, owns_gil, frame_ids, stale: false,
                                tick: true })
        }).collect()
    }

    /// The (code object, instruction offset) of each frame of a copy, leaf first: those BPF copied (a
    /// deeper stack keeps its leaf's MAX_DEPTH). None when its thread state held another thread (its
    /// identifier and native id are checked), or a frame could not be read (its slot is all 0: the
    /// copy would end there as if at the outermost frame).
    fn copied_stack(&mut self, rec: &[u8]) -> Option<Vec<(u64, i64)>> {
        let (tstate, tid) = (u64_at(rec, AT_TSTATE), u64_at(rec, 0) & 0xffff_ffff);
        let same = self.threads.get(&tstate)
            .is_some_and(|th| th.tid == tid && th.ident == u64_at(rec, AT_IDENT) && u64_at(rec, AT_NATIVE_TID) == tid);
        if !same {
            self.relist = true;
            return None;
        }
        let f = &self.layout.frame;
        let count = u32_at(rec, AT_COUNT) as usize;
        let mut stack = Vec::with_capacity(count);
        let mut addr = usize::MAX; // the first frame's address is not in the copy
        for i in 0..count {
            let slot = &rec[AT_FRAMES + i * SLOT..][..f.size];
            if slot.iter().all(|&b| b == 0) {
                return None;
            }
            let Ok((entry, back)) = frame_entry(f, slot, addr) else { break };
            if let Some((code, _)) = entry {
                let print = rec[AT_FRAMES + i * SLOT + AT_FIRST_LINE..][..4 + PRINT].try_into().unwrap();
                self.s.prints.push((code, print));
            }
            stack.extend(entry);
            addr = back;
        }
        (count == 0 || !stack.is_empty()).then_some(stack)
    }

    /// Checks the cached code objects listed in the scratch's `codes` in one call, and loads those new or
    /// changed.
    fn check_codes(&mut self) {
        let mut s = std::mem::take(&mut self.s);
        s.codes.sort_unstable();
        s.codes.dedup();
        let (at, len) = self.layout.code.fields();
        s.ranges.clear();
        s.ranges.extend(s.codes.iter().map(|&c| (c as usize + at, len)));
        s.fields.resize(len * s.codes.len(), 0);
        s.ok.clear();
        s.ok.resize(s.codes.len(), false);
        self.remote.read_many(&s.ranges, &mut s.fields, &mut s.ok);
        for (i, &c) in s.codes.iter().enumerate() {
            let fields = &s.fields[i * len..(i + 1) * len];
            if !s.ok[i] {
                self.codes.remove(&c);
            } else if self.codes.get(&c).is_none_or(|k| k.fields != fields) {
                match self.load_code(fields) {
                    Some(code) => self.codes.insert(c, code),
                    None => self.codes.remove(&c),
                };
            }
        }
        self.s = s;
    }

    /// Walks the thread's frames into the scratch stack. The current frame is
    /// read just before the frames, not with the thread state: on 3.11 and
    /// 3.12 it is reached through a _PyCFrame on the thread's C stack, which
    /// goes stale as soon as the thread returns from that evaluation. It is
    /// read once more when what it leads to is not a frame, or no frame.
    /// With `thread` (identifier, native id), a thread state that holds another
    /// thread now (the list was not walked: a thread started where one that
    /// ended had its state, its pthread_t too: the native id tells them
    /// apart) is not walked, and the list is walked again at the next sample.
    fn walk(&mut self, tstate: usize, thread: Option<(u64, u64)>) -> Option<()> {
        for attempt in 0..2 {
            let (first, chunk, (ident, tid)) = self.current_frame(tstate)?;
            // 3.10 keeps no native id in the state: glibc's struct pthread has it
            let tid = tid.or_else(|| pthread::tid(&self.remote, ident, self.tid_offset?));
            if thread.is_some_and(|(i, t)| i != ident || tid.is_some_and(|tid| tid != t)) {
                self.relist = true;
                return None;
            }
            self.s.stack.clear();
            if first == Some(0) && attempt == 1 {
                return Some(()); // twice: no Python frame on this thread
            }
            if let Some(frame) = first.filter(|&f| f != 0 && f.is_multiple_of(8)) {
                self.follow(frame, chunk);
            }
            if !self.s.stack.is_empty() {
                return Some(());
            }
        }
        None
    }

    /// The thread's current frame (None: unreadable), the address of its
    /// data-stack chunk, whose used part (3.11+) is copied to the scratch, and
    /// the thread its state holds.
    fn current_frame(&mut self, tstate: usize) -> Option<(Option<usize>, usize, Holds)> {
        let (ptr, chunk, chunk_len, holds) = self.frame_pointers(tstate)?;
        let cframe = self.layout.thread.cframe_frame;
        // one call: (3.11, 3.12) the current frame's pointer in the _PyCFrame, then
        // the chunk, so that the frames copied are no older than the pointer; a
        // range a version lacks has no length
        let ranges = [(ptr.wrapping_add(cframe.unwrap_or(0)), if cframe.is_some() { 8 } else { 0 }), (chunk, chunk_len)];
        let buf = &mut self.s.chunk;
        buf.resize(8 + chunk_len, 0);
        let mut ok = [false; 2];
        if ranges.iter().any(|r| r.1 > 0) {
            // the pointer fills the first 8 bytes; the chunk always follows them
            self.remote.read_many(&ranges, &mut buf[8 - ranges[0].1..], &mut ok);
        }
        let first = match cframe {
            Some(_) => ok[0].then(|| u64_at(buf, 0) as usize),
            None => Some(ptr),
        };
        buf.truncate(if ok[1] { 8 + chunk_len } else { 8 }); // no copy: every frame is read on its own
        Some((first, chunk, holds))
    }

    /// What the thread state says of its frames: the current frame's pointer
    /// (3.11, 3.12: the _PyCFrame's), the data-stack chunk and its used length;
    /// and the thread it holds (identifier; native id, 3.11+), in the same call; with them, the GIL
    /// (into the scratch).
    fn frame_pointers(&mut self, tstate: usize) -> Option<(usize, usize, usize, Holds)> {
        let t = &self.layout.thread;
        let mut head = [0u8; 40 + MAX_STRUCT];
        let mut ok = [false; 5];
        let chunk_len = if t.chunk.is_some() { 16 } else { 0 };
        let tid_len = if t.native_tid.is_some() { 8 } else { 0 };
        let ranges = [(tstate + t.frame, 8), (tstate + t.chunk.unwrap_or(0), chunk_len), (tstate + t.ident, 8),
                      (tstate + t.native_tid.unwrap_or(0), tid_len), self.gil_range()];
        self.remote.read_many(&ranges, &mut head, &mut ok);
        self.s.holder = self.holder(&head[16 + chunk_len + tid_len..], ok[4]);
        if !ok[..4].iter().all(|&o| o) {
            return None;
        }
        let holds = (u64_at(&head, 8 + chunk_len), t.native_tid.map(|_| u64_at(&head, 16 + chunk_len)));
        let (ptr, chunk, top) = if chunk_len > 0 {
            (u64_at(&head, 0) as usize, u64_at(&head, 8) as usize, u64_at(&head, 16) as usize)
        } else {
            (u64_at(&head, 0) as usize, 0, 0)
        };
        let used = if chunk != 0 && top > chunk && top - chunk <= MAX_CHUNK { top - chunk } else { 0 };
        Some((ptr, chunk, used, holds))
    }

    /// The frames from `frame` back into the scratch stack, taken from the
    /// copy of the thread's data-stack chunk where they lie in it. Frames
    /// elsewhere (generators', 3.10's, and the entry frames 3.12+ keep on the
    /// C stack, a few hundred bytes apart) are read with what follows them up
    /// to the page's end, which serves the next ones that lie there too.
    fn follow(&mut self, mut frame: usize, chunk: usize) {
        let f = &self.layout.frame;
        let s = &mut self.s;
        let bytes = &s.chunk[8..];
        let mut window = (0, 0); // address and length of what s.window holds
        s.window.resize(PAGE.max(f.size), 0);
        for _ in 0..MAX_FRAMES {
            let rec: &[u8] = if let Some(at) = offset_in((chunk, bytes.len()), frame, f.size) {
                &bytes[at..at + f.size]
            } else {
                if offset_in(window, frame, f.size).is_none() {
                    // up to the page's end: a read that cannot fail for half its bytes
                    let len = (PAGE - frame % PAGE).max(f.size);
                    if !self.remote.read(frame, &mut s.window[..len]) {
                        break; // torn: keep the frames read so far
                    }
                    window = (frame, len);
                }
                &s.window[frame - window.0..][..f.size]
            };
            let Ok((entry, back)) = frame_entry(f, rec, frame) else { break };
            s.stack.extend(entry);
            if back == 0 {
                break;
            }
            frame = back;
        }
    }

    fn load_code(&self, fields: &[u8]) -> Option<Code> {
        let c = &self.layout.code;
        let start = c.fields().0;
        let field = |at: usize| u64_at(fields, at - start) as usize;
        let (name, filename, table) = (field(c.qualname.unwrap_or(c.name)), field(c.filename), field(c.linetable));
        // A task's function is a new code object at each task (unpickled): its texts are read in
        // one call, PEEK bytes each, and one that does not fit is read again on its own.
        let mut peek = [0u8; 3 * PEEK];
        let mut ok = [false; 3];
        self.remote.read_many(&[(name, PEEK), (filename, PEEK), (table, PEEK)], &mut peek, &mut ok);
        let part = |i: usize| if ok[i] && [name, filename, table][i] != 0 { &peek[i * PEEK..][..PEEK] } else { &[][..] };
        let t = &self.layout.text;
        let string = |addr| text::read(&self.remote, t, addr);
        let function = text::within(t, part(0)).or_else(|| string(name))
            .or_else(|| c.qualname.and_then(|_| string(field(c.name))))?;
        let filename = text::within(t, part(1)).or_else(|| string(filename))?;
        let table = part(2).get(t.bytes_size..t.bytes_size + 8).map(|b| u64_at(b, 0) as usize)
            .and_then(|size| part(2).get(t.bytes_data..t.bytes_data.checked_add(size)?)).map(<[u8]>::to_vec)
            .or_else(|| self.bytes(table))?;
        Some(Code {
            idle_leaf: is_idle_leaf(&function, &filename),
            shim: filename.is_empty() || filename == "<shim>",
            first_line: u32_at(fields, c.firstlineno - start) as i32,
            fields: fields.to_vec(), function, filename, table, ids: HashMap::new(),
        })
    }

    fn bytes(&self, addr: usize) -> Option<Vec<u8>> {
        let t = &self.layout.text;
        let size = self.remote.read_u64(addr + t.bytes_size)? as usize;
        if size > 1 << 20 {
            return None;
        }
        let mut data = vec![0u8; size];
        self.remote.read(addr + t.bytes_data, &mut data).then_some(data)
    }
}

/// Where, in a code object, the PRINT bytes start: they end with its line table's pointer.
fn print_start(c: &crate::layout::Code) -> Option<usize> {
    (c.linetable + 8).checked_sub(PRINT)
}

/// Where, in a code object's cached fields (Code::fields), the first line and the PRINT bytes BPF
/// copies with each frame lie (bpf_walk): the pointers to its line table and, before it, its name
/// (3.11+: and qualified name; 3.10: and file name). None where a layout has them elsewhere.
fn print_in_fields(c: &crate::layout::Code) -> Option<(usize, usize)> {
    let (start, len) = c.fields();
    let print = print_start(c)?.checked_sub(start)?;
    let line = c.firstlineno.checked_sub(start)?;
    (print + PRINT <= len && line + 4 <= len).then_some((line, print))
}

/// What the copy `rec` of a frame at `addr` holds: its (code object, byte offset of its last
/// instruction), None for the C stack's entry frames (3.12+), and the frame that called it (0: none);
/// Err when it is not a frame but an object a stale pointer led to (its refcount, its type, and a
/// type's type is itself): a walk stops there, before walking that loop.
fn frame_entry(f: &Frame, rec: &[u8], addr: usize) -> Result<(Option<(u64, i64)>, usize), ()> {
    let (code, back) = (u64_at(rec, f.code), u64_at(rec, f.back) as usize);
    if !code.is_multiple_of(8) || !back.is_multiple_of(8) || back == addr {
        return Err(());
    }
    let entry = (code != 0 && f.owner.is_none_or(|o| rec[o] != FRAME_OWNED_BY_CSTACK)).then(|| {
        let offset = match f.instr_kind {
            Instr::Index => u32_at(rec, f.instr) as i32 as i64 * 2,
            Instr::Pointer { adaptive } => u64_at(rec, f.instr).wrapping_sub(code.wrapping_add(adaptive as u64)) as i64,
        };
        (code, offset)
    });
    Ok((entry, back))
}

/// py-spy's heuristic for threads parked in a wait that /proc shows as running (woken, not yet on a
/// CPU), on the function's own name: from 3.11 a frame is named by its qualified name
/// ("EpollSelector.select"), which py-spy's test of the name misses.
fn is_idle_leaf(qualname: &str, filename: &str) -> bool {
    let function = qualname.rsplit('.').next().unwrap_or(qualname);
    (function == "wait" && filename.ends_with("threading.py"))
        || (function == "select" && filename.ends_with("selectors.py"))
        || (function == "poll"
            && (filename.ends_with("asyncore.py") || ["zmq", "gevent", "tornado"].iter().any(|s| filename.contains(s))))
}

#[cfg(test)]
mod tests {
    use super::{is_idle_leaf, offset_in, print_in_fields};

    #[test]
    fn what_bpf_copies_of_a_code_object_is_among_the_fields_it_is_cached_by() {
        // (first line, pointers) within Code::fields: 3.10's file name, name, line table; 3.11+'s
        // name, qualified name, line table
        let at: Vec<_> = (10..=12).map(|m| print_in_fields(&crate::layout::select(m, None).unwrap().code)).collect();
        assert_eq!(at, [Some((0, 64)), Some((0, 48)), Some((0, 52))]);
    }

    #[test]
    fn a_wait_is_idle_by_its_own_name_or_its_qualified_one() {
        assert!(is_idle_leaf("select", "/usr/lib/python3.10/selectors.py"));
        assert!(is_idle_leaf("EpollSelector.select", "/usr/lib/python3.11/selectors.py"));
        assert!(is_idle_leaf("Condition.wait", "/usr/lib/python3.11/threading.py"));
        assert!(!is_idle_leaf("Condition.notify", "/usr/lib/python3.11/threading.py"));
        assert!(!is_idle_leaf("select", "/home/me/my_flow.py"));
    }

    #[test]
    fn only_addresses_wholly_inside_a_copy_index_it() {
        let copy = (0x1000, 0x100);
        assert_eq!(offset_in(copy, 0x1000, 0x50), Some(0));
        assert_eq!(offset_in(copy, 0x10b0, 0x50), Some(0xb0), "ends at the copy's end");
        assert_eq!(offset_in(copy, 0x10b8, 0x50), None, "runs past it");
        assert_eq!(offset_in(copy, 0xff8, 0x50), None, "starts before it");
        assert_eq!(offset_in((0, 0), 0x10, 8), None, "nothing copied");
    }
}
