//! What BPF does at each CPU tick (ticks.rs), before the sampler hears of it.
//!
//! A tick of a process not sampled is dropped: without that, every tick of
//! another process (the other probes, the sampler itself, the rest of the
//! machine) woke the sampler for nothing (55% of its wake-ups on a run of
//! 10 ms tasks).
//!
//! A tick of a Python thread our reader knows (its PyThreadState, given with
//! `thread`) is read there and then: the program copies the thread's frames,
//! leaf first, up to MAX_DEPTH of them, with the thread's ids and the GIL's
//! state, into a record of the ring that the sampler drains every 200 ms
//! (cpython.rs names them). The sampler is not woken: a wake-up cost it
//! about 100 µs on this VM, 1% of a CPU's time at 100 Hz, which no reading of
//! stacks after the tick can avoid. The copy costs the ticked thread a read
//! per frame, in the interrupt. A tick of a thread known not to be Python's
//! (a native pool's, say) is dropped. Any other tick (a thread not yet
//! listed, a reader other than ours, a full ring) goes to the sampler as
//! before, which reads the stack itself.
//!
//! The programs are assembled here (bpf.rs): no compiler at run time. Where
//! the kernel refuses the stack reader (before Linux 5.8: no ring buffer),
//! the filter alone is loaded, and every tick of the sampled processes wakes
//! the sampler.

use crate::bpf::*;
use std::mem::{offset_of, size_of};

/// _IOW('$', 8, __u32)
pub const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
/// the inode of the initial pid namespace (PROC_PID_INIT_INO)
const PID_NS_INIT: u64 = 0xEFFF_FFFC;
/// more processes, and threads, than any one run samples
const MAX_PROCESSES: u32 = 4096;
const MAX_THREADS: u32 = 65536;
/// Dask's stacks reach 130 frames (p99 of ticks on a dataframe ETL); deeper ones keep their leaf's MAX_DEPTH
pub const MAX_DEPTH: usize = 160;
/// bytes kept of each frame: more than any layout's frame (3.10's, 100)
pub const SLOT: usize = 128;
pub const GIL_BYTES: usize = 24;
/// bytes of each frame's code object copied at the end of its slot (AT_PRINT): the pointers its
/// name and line table come from, after its first line number (4 bytes at AT_FIRST_LINE), which
/// tell the sampler whether the code object it cached at that address is still the one there
/// (cpython.rs)
pub const PRINT: usize = 24;
pub const AT_PRINT: usize = SLOT - PRINT;
pub const AT_FIRST_LINE: usize = AT_PRINT - 4;

/// A record's start; its frames follow, `count` SLOTs.
#[repr(C)]
pub struct Header {
    pub pid_tgid: u64,
    /// CLOCK_MONOTONIC, ns
    pub time: u64,
    pub count: u32,
    pub cpu: u32,
    /// the GIL's state (Walk's gil_len bytes of it)
    pub gil: [u8; GIL_BYTES],
    /// the thread's native id: in its PyThreadState (3.11+), or in glibc's struct pthread (3.10)
    pub native_tid: u64,
    pub tstate: u64,
    /// the Python thread identifier its PyThreadState holds
    pub ident: u64,
}

pub const AT_TIME: usize = offset_of!(Header, time);
pub const AT_COUNT: usize = offset_of!(Header, count);
pub const AT_CPU: usize = offset_of!(Header, cpu);
pub const AT_GIL: usize = offset_of!(Header, gil);
pub const AT_NATIVE_TID: usize = offset_of!(Header, native_tid);
pub const AT_TSTATE: usize = offset_of!(Header, tstate);
pub const AT_IDENT: usize = offset_of!(Header, ident);
pub const AT_FRAMES: usize = size_of::<Header>();
const RECORD: usize = AT_FRAMES + MAX_DEPTH * SLOT;
/// the ring holds this long of every CPU's ticks: four of the sampler's drains
const RING_SECONDS: f64 = 0.8;
/// stacks as deep as this, on average, for the ring's size
const TYPICAL_DEPTH: usize = 100;
/// in a `Walk`, a field the version lacks
pub const NONE: u64 = u64::MAX;
/// a thread's value in the threads map when it is known not to be a Python thread: its ticks are dropped
pub const NOT_PYTHON: u64 = 0;

/// Where the stack reader finds a process's frames, as the program reads it (a map value).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Walk {
    /// in the PyThreadState, the pointer to the current frame (3.10, 3.13) or to the _PyCFrame (3.11, 3.12)
    pub frame: u64,
    /// in the _PyCFrame, the current frame's pointer (NONE: no _PyCFrame)
    pub cframe_frame: u64,
    /// in the PyThreadState, the native thread id (NONE: 3.10)
    pub native_tid: u64,
    /// bytes copied of each frame (0: the process is not read here, its ticks go to the sampler)
    pub frame_size: u64,
    /// in a frame, the pointer to the one that called it
    pub back: u64,
    /// where the GIL's state is, and its length
    pub gil: u64,
    pub gil_len: u64,
    /// in the PyThreadState, the thread identifier (a pthread_t)
    pub ident: u64,
    /// in glibc's struct pthread, the native id (3.10; NONE where the PyThreadState has it)
    pub pthread_tid: u64,
    /// in a frame, the pointer to its code object; in that, where the PRINT bytes start, and its
    /// first line number
    pub code: u64,
    pub print: u64,
    pub first_line: u64,
}

pub struct TickProgram {
    pub prog: libc::c_int,
    procs: Map,
    /// None: the filter alone was loaded
    pub copier: Option<Copier>,
}

/// The stack copier's maps the sampler uses: threads (PyThreadState by pid_tgid) and the ring.
pub struct Copier {
    threads: Map,
    pub ring: Ring,
}

impl Copier {
    fn load(procs: &Map, cpus: usize, rate: f64) -> Result<(libc::c_int, Copier), String> {
        let threads = Map::create(BPF_MAP_TYPE_HASH, 8, 8, MAX_THREADS)?;
        // a record is built here, then written to the ring as long as it is (the program holds the map)
        let scratch = Map::create(BPF_MAP_TYPE_PERCPU_ARRAY, 4, RECORD as u32, 1)?;
        let ring = Ring::create(ring_bytes(cpus, rate))?;
        let prog = load_perf_program(&walker(procs, &threads, &scratch, &ring.map))?;
        Ok((prog, Copier { threads, ring }))
    }
}

impl TickProgram {
    /// For `cpus` CPUs ticking `rate` times a second.
    pub fn load(cpus: usize, rate: f64) -> Result<TickProgram, String> {
        // BPF sees the kernel's pids; in a pid namespace, those given to `watch` are others
        let ns = std::fs::metadata("/proc/self/ns/pid").map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        if ns.map_or(true, |ino| ino != PID_NS_INIT) {
            return Err("in a pid namespace of its own (or none known): its pids are not BPF's".into());
        }
        let procs = Map::create(BPF_MAP_TYPE_HASH, 4, size_of::<Walk>() as u32, MAX_PROCESSES)?;
        match Copier::load(&procs, cpus, rate) {
            Ok((prog, copier)) => Ok(TickProgram { prog, procs, copier: Some(copier) }),
            Err(e) => {
                log!("no stack reader at the tick ({e}): each tick wakes the sampler");
                let prog = load_perf_program(&filter(&procs))?;
                Ok(TickProgram { prog, procs, copier: None })
            }
        }
    }

    /// From now on `pid`'s ticks are kept: read here as `walk` says, or passed to the sampler.
    pub fn watch(&self, pid: i32, walk: Walk) {
        if let Err(e) = self.procs.update(&(pid as u32), &walk) {
            log!("pid {pid} not added to the tick program ({e}): it is read only every 200 ms");
        }
    }

    pub fn unwatch(&self, pid: i32) {
        self.procs.delete(&(pid as u32));
    }

    /// The thread `tid`'s PyThreadState (Some; NOT_PYTHON: its ticks are dropped), or none any more: its
    /// ticks go to the sampler.
    pub fn thread(&self, pid: i32, tid: u64, tstate: Option<u64>) {
        let key = (pid as u64) << 32 | tid;
        let Some(threads) = self.copier.as_ref().map(|c| &c.threads) else { return };
        match tstate {
            Some(t) => {
                if let Err(e) = threads.update(&key, &t) {
                    log!("thread {tid} not given to the tick program: {e}");
                }
            }
            None => threads.delete(&key),
        }
    }
}

/// A power of 2, 1 MiB at least (2 CPUs at 100 Hz: 2 MiB)
fn ring_bytes(cpus: usize, rate: f64) -> usize {
    let record = 8 + AT_FRAMES + TYPICAL_DEPTH * SLOT;
    ((cpus as f64 * rate * RING_SECONDS) as usize * record).next_power_of_two().clamp(1 << 20, 1 << 30)
}

impl Drop for TickProgram {
    fn drop(&mut self) {
        unsafe { libc::close(self.prog) };
    }
}

/// r0 = the process's Walk, or return 0 (not sampled); pid_tgid at S_PID_TGID
fn find_process(a: &mut Asm, procs: &Map) {
    a.op(CALL, 0, 0, 0, CURRENT_PID_TGID)
        .op(STX_DW, 10, 0, S_PID_TGID, 0)
        .op(RSH_K, 0, 0, 0, 32)
        .op(STX_W, 10, 0, S_TGID, 0) // the key: the process (tgid)
        .ops(&load_map(1, procs))
        .op(MOV_X, 2, 10, 0, 0)
        .op(ADD_K, 2, 0, 0, S_TGID as i32)
        .op(CALL, 0, 0, 0, MAP_LOOKUP)
        .jump(JNE_K, 0, 0, "sampled")
        .ret(0)
        .place("sampled");
}

/// Passes the ticks of the processes in `procs`.
fn filter(procs: &Map) -> Vec<Insn> {
    let mut a = Asm::default();
    find_process(&mut a, procs);
    a.ret(1);
    a.done()
}

/// Offsets of Walk's fields, as the program loads them
const W_FRAME: i16 = offset_of!(Walk, frame) as i16;
const W_CFRAME_FRAME: i16 = offset_of!(Walk, cframe_frame) as i16;
const W_NATIVE_TID: i16 = offset_of!(Walk, native_tid) as i16;
const W_FRAME_SIZE: i16 = offset_of!(Walk, frame_size) as i16;
const W_BACK: i16 = offset_of!(Walk, back) as i16;
const W_GIL: i16 = offset_of!(Walk, gil) as i16;
const W_GIL_LEN: i16 = offset_of!(Walk, gil_len) as i16;
const W_IDENT: i16 = offset_of!(Walk, ident) as i16;
const W_PTHREAD_TID: i16 = offset_of!(Walk, pthread_tid) as i16;
const W_CODE: i16 = offset_of!(Walk, code) as i16;
const W_PRINT: i16 = offset_of!(Walk, print) as i16;
const W_FIRST_LINE: i16 = offset_of!(Walk, first_line) as i16;
/// on the program's stack (r10 is its frame pointer): pid_tgid, the process, the current
/// frame, and a 0 (the scratch's key)
const S_PID_TGID: i16 = -8;
const S_TGID: i16 = -12;
const S_FRAME: i16 = -24;
const S_ZERO: i16 = -28;

/// The filter, then for a thread in `threads` the stack copy described at the top of this file,
/// built in the CPU's scratch and written to the ring in one piece, as long as its frames.
/// Registers kept across calls: r6 the frame, r7 the Walk, r8 the PyThreadState, r9 the record.
fn walker(procs: &Map, threads: &Map, scratch: &Map, ring: &Map) -> Vec<Insn> {
    let mut a = Asm::default();
    find_process(&mut a, procs);
    find_thread(&mut a, threads);
    start_record(&mut a, scratch);
    read_thread_state(&mut a);
    copy_frames(&mut a);
    // the record's length, from its count (the verifier wants it bounded)
    a.op(LDX_W, 3, 9, AT_COUNT as i16, 0).op(LSH_K, 3, 0, 0, SLOT.trailing_zeros() as i32)
        .op(ADD_K, 3, 0, 0, AT_FRAMES as i32).jump(JGT_K, 3, RECORD as i32, "pass")
        .ops(&load_map(1, ring)).op(MOV_X, 2, 9, 0, 0).op(MOV_K, 4, 0, 0, RB_NO_WAKEUP)
        .op(CALL, 0, 0, 0, RINGBUF_OUTPUT).jump(JNE_K, 0, 0, "pass") // full: the sampler reads it
        .ret(0)
        .place("drop")
        .ret(0)
        .place("pass")
        .ret(1);
    a.done()
}

/// r7 = the process's Walk (from r0), r8 = the thread's PyThreadState; else to "pass" (or "drop": not
/// a Python thread)
fn find_thread(a: &mut Asm, threads: &Map) {
    a.op(MOV_X, 7, 0, 0, 0)
        .op(LDX_DW, 1, 7, W_FRAME_SIZE, 0).jump(JEQ_K, 1, 0, "pass") // 0: not read here
        // the key: pid_tgid, as a tid alone could be an ended process's, reused
        .ops(&load_map(1, threads)).op(MOV_X, 2, 10, 0, 0).op(ADD_K, 2, 0, 0, S_PID_TGID as i32)
        .op(CALL, 0, 0, 0, MAP_LOOKUP).jump(JEQ_K, 0, 0, "pass")
        .op(LDX_DW, 8, 0, 0, 0).jump(JEQ_K, 8, NOT_PYTHON as i32, "drop");
}

/// r9 = this CPU's scratch (a tick's program runs to its end before the CPU's next), its header
/// written but for the count and what read_thread_state reads
fn start_record(a: &mut Asm, scratch: &Map) {
    a.op(ST_W, 10, 0, S_ZERO, 0)
        .ops(&load_map(1, scratch)).op(MOV_X, 2, 10, 0, 0).op(ADD_K, 2, 0, 0, S_ZERO as i32)
        .op(CALL, 0, 0, 0, MAP_LOOKUP).jump(JEQ_K, 0, 0, "pass")
        .op(MOV_X, 9, 0, 0, 0)
        .op(LDX_DW, 1, 10, S_PID_TGID, 0).op(STX_DW, 9, 1, 0, 0)
        .op(CALL, 0, 0, 0, KTIME_GET_NS).op(STX_DW, 9, 0, AT_TIME as i16, 0)
        .op(CALL, 0, 0, 0, SMP_PROCESSOR_ID).op(STX_W, 9, 0, AT_CPU as i16, 0)
        .op(STX_DW, 9, 8, AT_TSTATE as i16, 0);
    for at in [AT_NATIVE_TID, AT_IDENT] {
        a.op(ST_DW, 9, 0, at as i16, 0);
    }
}

/// probe_read_user(r9 + at, len, *(r7 + field) + r`base`)
fn read_field(a: &mut Asm, at: usize, len: i32, field: i16, base: u8) {
    a.op(LDX_DW, 3, 7, field, 0).op(ADD_X, 3, base, 0, 0)
        .op(MOV_X, 1, 9, 0, 0).op(ADD_K, 1, 0, 0, at as i32).op(MOV_K, 2, 0, 0, len)
        .op(CALL, 0, 0, 0, PROBE_READ_USER);
}

/// The current frame's pointer onto the stack (in the thread state, then, 3.11 and 3.12, in the
/// _PyCFrame); the thread's ids and the GIL's state into the record, for the sampler to check that
/// the thread state still held the thread it was given for.
fn read_thread_state(a: &mut Asm) {
    let read_to_stack = |a: &mut Asm| {
        a.op(MOV_X, 1, 10, 0, 0).op(ADD_K, 1, 0, 0, S_FRAME as i32).op(MOV_K, 2, 0, 0, 8)
            .op(CALL, 0, 0, 0, PROBE_READ_USER);
    };
    a.op(LDX_DW, 3, 7, W_FRAME, 0).op(ADD_X, 3, 8, 0, 0);
    read_to_stack(a);
    a.op(LDX_DW, 3, 7, W_CFRAME_FRAME, 0).jump(JEQ_K, 3, -1, "no cframe")
        .op(LDX_DW, 1, 10, S_FRAME, 0).op(ADD_X, 3, 1, 0, 0);
    read_to_stack(a);
    a.place("no cframe");
    read_field(a, AT_IDENT, 8, W_IDENT, 8);
    a.op(LDX_DW, 3, 7, W_NATIVE_TID, 0).jump(JEQ_K, 3, -1, "tid in pthread");
    read_field(a, AT_NATIVE_TID, 8, W_NATIVE_TID, 8);
    a.jump(JA, 0, 0, "tid read").place("tid in pthread")
        .op(LDX_DW, 3, 7, W_PTHREAD_TID, 0).jump(JEQ_K, 3, -1, "tid read")
        .op(LDX_DW, 6, 9, AT_IDENT as i16, 0);
    read_field(a, AT_NATIVE_TID, 4, W_PTHREAD_TID, 6);
    a.place("tid read")
        .op(LDX_DW, 2, 7, W_GIL_LEN, 0).jump(JGT_K, 2, GIL_BYTES as i32, "no gil")
        .op(LDX_DW, 3, 7, W_GIL, 0).op(MOV_X, 1, 9, 0, 0).op(ADD_K, 1, 0, 0, AT_GIL as i32)
        .op(CALL, 0, 0, 0, PROBE_READ_USER)
        .place("no gil");
}

/// r`dst` = the u64 at the slot's offset held in the Walk's `field` (masked, so that the verifier
/// sees the load inside the slot)
fn slot_word(a: &mut Asm, dst: u8, slot: i32, field: i16) {
    a.op(LDX_DW, 1, 7, field, 0).op(AND_K, 1, 0, 0, (SLOT - 8) as i32 & !7)
        .op(MOV_X, 2, 9, 0, 0).op(ADD_K, 2, 0, 0, slot).op(ADD_X, 2, 1, 0, 0)
        .op(LDX_DW, dst, 2, 0, 0);
}

/// The frames from the current one, each copied whole into its slot, with its code object's PRINT
/// bytes and first line (zeros where a read fails), and left by its `back` field, unrolled MAX_DEPTH
/// times
fn copy_frames(a: &mut Asm) {
    a.op(LDX_DW, 6, 10, S_FRAME, 0);
    for i in 0..MAX_DEPTH {
        let slot = (AT_FRAMES + i * SLOT) as i32;
        a.op(ST_W, 9, 0, AT_COUNT as i16, i as i32).jump(JEQ_K, 6, 0, "copied")
            .op(MOV_X, 1, 9, 0, 0).op(ADD_K, 1, 0, 0, slot)
            .op(LDX_DW, 2, 7, W_FRAME_SIZE, 0).op(AND_K, 2, 0, 0, SLOT as i32 - 1)
            .op(MOV_X, 3, 6, 0, 0)
            .op(CALL, 0, 0, 0, PROBE_READ_USER);
        slot_word(a, 6, slot, W_CODE); // the frame is copied: r6 holds its code object till `back`
        for (field, at, len) in [(W_PRINT, AT_PRINT, PRINT), (W_FIRST_LINE, AT_FIRST_LINE, 4)] {
            a.op(LDX_DW, 3, 7, field, 0).op(ADD_X, 3, 6, 0, 0)
                .op(MOV_X, 1, 9, 0, 0).op(ADD_K, 1, 0, 0, slot + at as i32).op(MOV_K, 2, 0, 0, len as i32)
                .op(CALL, 0, 0, 0, PROBE_READ_USER);
        }
        slot_word(a, 6, slot, W_BACK);
    }
    a.op(ST_W, 9, 0, AT_COUNT as i16, MAX_DEPTH as i32).place("copied");
}
