//! BPF without a compiler or a library: the bpf() system call for maps and
//! programs, the instruction encoding the programs of tickprog.rs are
//! assembled from, and the consumer side of a BPF ring buffer.

use std::io::Error;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
pub const BPF_MAP_TYPE_RINGBUF: u32 = 27;
const BPF_PROG_TYPE_PERF_EVENT: u32 = 7;

/// struct bpf_insn: opcode, dst and src registers, offset, immediate
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Insn(u8, u8, i16, i32);

pub const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn(code, dst | (src << 4), off, imm)
}

// opcodes (BPF_CLASS | BPF_OP | BPF_SRC)
pub const CALL: u8 = 0x85;
pub const EXIT: u8 = 0x95;
pub const MOV_K: u8 = 0xb7;
pub const MOV_X: u8 = 0xbf;
pub const ADD_K: u8 = 0x07;
pub const ADD_X: u8 = 0x0f;
pub const AND_K: u8 = 0x57;
pub const RSH_K: u8 = 0x77;
pub const LSH_K: u8 = 0x67;
pub const LDX_DW: u8 = 0x79;
pub const LDX_W: u8 = 0x61;
pub const STX_DW: u8 = 0x7b;
pub const STX_W: u8 = 0x63;
pub const ST_W: u8 = 0x62;
pub const ST_DW: u8 = 0x7a;
pub const JEQ_K: u8 = 0x15;
pub const JNE_K: u8 = 0x55;
pub const JGT_K: u8 = 0x25;
pub const JA: u8 = 0x05;
// helpers
pub const MAP_LOOKUP: i32 = 1;
pub const KTIME_GET_NS: i32 = 5;
pub const SMP_PROCESSOR_ID: i32 = 8;
pub const CURRENT_PID_TGID: i32 = 14;
pub const PROBE_READ_USER: i32 = 112;
pub const RINGBUF_OUTPUT: i32 = 130;
pub const RB_NO_WAKEUP: i32 = 1;

/// A BPF program under assembly: forward jumps to labels are patched when the label is placed.
#[derive(Default)]
pub struct Asm {
    code: Vec<Insn>,
    /// (instruction, label) of each jump not yet placed
    jumps: Vec<(usize, &'static str)>,
}

impl Asm {
    pub fn op(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) -> &mut Self {
        self.code.push(insn(code, dst, src, off, imm));
        self
    }

    pub fn ops(&mut self, insns: &[Insn]) -> &mut Self {
        self.code.extend_from_slice(insns);
        self
    }

    pub fn jump(&mut self, code: u8, dst: u8, imm: i32, label: &'static str) -> &mut Self {
        self.jumps.push((self.code.len(), label));
        self.op(code, dst, 0, 0, imm)
    }

    pub fn place(&mut self, label: &'static str) -> &mut Self {
        let here = self.code.len();
        for &(at, _) in self.jumps.iter().filter(|j| j.1 == label) {
            self.code[at].2 = i16::try_from(here - at - 1).expect("a jump longer than BPF's 32,767 instructions");
        }
        self.jumps.retain(|j| j.1 != label);
        self
    }

    pub fn ret(&mut self, value: i32) -> &mut Self {
        self.op(MOV_K, 0, 0, 0, value).op(EXIT, 0, 0, 0, 0)
    }

    pub fn done(self) -> Vec<Insn> {
        assert!(self.jumps.is_empty(), "a jump to a label never placed");
        self.code
    }
}

/// The two instructions that load a map's address into `dst`, by its fd.
pub fn load_map(dst: u8, map: &Map) -> [Insn; 2] {
    [insn(0x18, dst, 1, 0, map.fd), insn(0, 0, 0, 0, 0)]
}

fn bpf(cmd: libc::c_long, attr: &[u64]) -> libc::c_int {
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), std::mem::size_of_val(attr)) as libc::c_int }
}

pub struct Map {
    pub fd: libc::c_int,
}

impl Map {
    pub fn create(kind: u32, key_size: u32, value_size: u32, max_entries: u32) -> Result<Map, String> {
        // union bpf_attr, as u64 words: map_type | key_size << 32, value_size | max_entries << 32
        let fd = bpf(BPF_MAP_CREATE, &[kind as u64 | (key_size as u64) << 32,
                                       value_size as u64 | (max_entries as u64) << 32, 0, 0]);
        if fd < 0 {
            return Err(format!("BPF map: {}", Error::last_os_error()));
        }
        Ok(Map { fd })
    }

    pub fn update<K, V>(&self, key: &K, value: &V) -> Result<(), Error> {
        // map_fd, key, value, flags (BPF_ANY)
        let attr = [self.fd as u64, key as *const K as u64, value as *const V as u64, 0];
        if bpf(BPF_MAP_UPDATE_ELEM, &attr) < 0 { Err(Error::last_os_error()) } else { Ok(()) }
    }

    pub fn delete<K>(&self, key: &K) {
        bpf(BPF_MAP_DELETE_ELEM, &[self.fd as u64, key as *const K as u64, 0, 0]);
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

/// Loads a program for perf events (the fd to give PERF_EVENT_IOC_SET_BPF); on refusal, the end of the
/// verifier's log, asked for only then (it was most of the load's time).
pub fn load_perf_program(insns: &[Insn]) -> Result<libc::c_int, String> {
    let load = |log: &mut [u8]| {
        let license = c"GPL";
        let (level, size, buf) = if log.is_empty() { (0, 0, 0) } else { (1, log.len() as u64, log.as_mut_ptr() as u64) };
        // prog_type | insn_cnt << 32, insns, license, log_level | log_size << 32, log_buf, then no name
        bpf(BPF_PROG_LOAD, &[BPF_PROG_TYPE_PERF_EVENT as u64 | (insns.len() as u64) << 32, insns.as_ptr() as u64,
                             license.as_ptr() as u64, level | size << 32, buf, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
    };
    let prog = load(&mut []);
    if prog >= 0 {
        return Ok(prog);
    }
    let refused = Error::last_os_error();
    let mut log = vec![0u8; 1 << 24];
    let again = load(&mut log);
    if again >= 0 {
        return Ok(again);
    }
    let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).into_owned();
    let last: Vec<&str> = text.lines().rev().take(3).collect();
    Err(format!("BPF program: {refused} ({})", last.into_iter().rev().collect::<Vec<_>>().join(" / ")))
}

/// The reading end of a BPF ring buffer, as libbpf maps it: a consumer page we
/// advance, then a producer page and the data pages, mapped twice in a row so
/// that a record that wraps around reads as one piece. Each record: a 32-bit
/// length with a busy (not yet committed) and a discard bit, 4 bytes, the data,
/// padded to 8.
pub struct Ring {
    pub map: Map,
    consumer: *mut u8,
    producer: *mut u8,
    size: usize,
    page: usize,
}

const BUSY: u32 = 1 << 31;
const DISCARD: u32 = 1 << 30;

impl Ring {
    pub fn create(size: usize) -> Result<Ring, String> {
        let map = Map::create(BPF_MAP_TYPE_RINGBUF, 0, 0, size as u32)?;
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let map_at = |len: usize, prot: libc::c_int, offset: usize| {
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, map.fd, offset as i64) };
            if p == libc::MAP_FAILED { Err(format!("mapping a BPF ring: {}", Error::last_os_error())) } else { Ok(p as *mut u8) }
        };
        let consumer = map_at(page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = map_at(page + 2 * size, libc::PROT_READ, page).inspect_err(|_| unsafe {
            libc::munmap(consumer as *mut libc::c_void, page);
        })?;
        Ok(Ring { map, consumer, producer, size, page })
    }

    /// Calls `each` with every record committed since the last call, in order, and hands their space back.
    pub fn drain(&self, mut each: impl FnMut(&[u8])) {
        let cons_at = self.consumer as *mut u64;
        let mut cons = unsafe { std::ptr::read_volatile(cons_at) };
        let prod = unsafe { std::ptr::read_volatile(self.producer as *const u64) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        while cons < prod {
            let at = unsafe { self.producer.add(self.page + (cons as usize & (self.size - 1))) };
            // the kernel commits a record by clearing BUSY: its bytes are ours once we see that
            let header = unsafe { std::sync::atomic::AtomicU32::from_ptr(at as *mut u32) }
                .load(std::sync::atomic::Ordering::Acquire);
            if header & BUSY != 0 {
                break; // reserved, not yet written: the next drain takes it
            }
            let len = (header & !(BUSY | DISCARD)) as usize;
            if header & DISCARD == 0 {
                each(unsafe { std::slice::from_raw_parts(at.add(8), len) });
            }
            cons += ((8 + len + 7) & !7) as u64;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        unsafe { std::ptr::write_volatile(cons_at, cons) };
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        unsafe {
            libc::munmap(self.consumer as *mut libc::c_void, self.page);
            libc::munmap(self.producer as *mut libc::c_void, self.page + 2 * self.size);
        }
    }
}
