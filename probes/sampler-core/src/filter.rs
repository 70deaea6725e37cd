//! Which ticks reach the sampler: a BPF program on each CPU's tick event
//! (ticks.rs) passes a tick only when the process it found is one being
//! sampled, a key of its map. Without it, every tick of any other process
//! (the other probes, the sampler itself, whatever else the machine runs)
//! wakes the sampler for nothing: 55% of the wake-ups on a run of 10 ms tasks.
//!
//! The program is 13 instructions, assembled here: the sampler loads it
//! with the bpf() system call, no compiler needed.

use std::io::Error;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_PROG_TYPE_PERF_EVENT: u32 = 7;
/// _IOW('$', 8, __u32)
pub const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
/// the inode of the initial pid namespace (PROC_PID_INIT_INO)
const PID_NS_INIT: u64 = 0xEFFF_FFFC;
/// more processes than any one run samples
const MAX_PROCESSES: u32 = 4096;

/// struct bpf_insn: opcode, dst and src registers, offset, immediate
#[repr(C)]
struct Insn(u8, u8, i16, i32);

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn(code, dst | (src << 4), off, imm)
}

/// return map_lookup(&(get_current_pid_tgid() >> 32)) != NULL
fn program(map: libc::c_int) -> [Insn; 13] {
    [
        insn(0x85, 0, 0, 0, 14),        // call bpf_get_current_pid_tgid
        insn(0x77, 0, 0, 0, 32),        // r0 >>= 32: the process (tgid)
        insn(0x63, 10, 0, -4, 0),       // *(u32 *)(r10 - 4) = r0
        insn(0xbf, 2, 10, 0, 0),        // r2 = r10
        insn(0x07, 2, 0, 0, -4),        // r2 += -4: the key
        insn(0x18, 1, 1, 0, map),       // r1 = the map (a 64-bit load, by fd)
        insn(0x00, 0, 0, 0, 0),
        insn(0x85, 0, 0, 0, 1),         // call bpf_map_lookup_elem
        insn(0x55, 0, 0, 2, 0),         // if r0 != 0 goto pass
        insn(0xb7, 0, 0, 0, 0),         // r0 = 0: drop the tick
        insn(0x95, 0, 0, 0, 0),         // exit
        insn(0xb7, 0, 0, 0, 1),         // pass: r0 = 1
        insn(0x95, 0, 0, 0, 0),         // exit
    ]
}

fn bpf(cmd: libc::c_long, attr: &[u64]) -> libc::c_int {
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), std::mem::size_of_val(attr)) as libc::c_int }
}

pub struct Filter {
    map: libc::c_int,
    pub prog: libc::c_int,
}

impl Filter {
    pub fn load() -> Result<Filter, String> {
        // BPF sees the kernel's pids; in a pid namespace, those given to `add` are others
        let ns = std::fs::metadata("/proc/self/ns/pid").map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        if ns.map_or(true, |ino| ino != PID_NS_INIT) {
            return Err("in a pid namespace of its own (or none known): its pids are not BPF's".into());
        }
        // union bpf_attr, as u64 words: map_type | key_size << 32, value_size | max_entries << 32
        let map = bpf(BPF_MAP_CREATE, &[BPF_MAP_TYPE_HASH as u64 | 4 << 32, 1 | (MAX_PROCESSES as u64) << 32, 0, 0]);
        if map < 0 {
            return Err(format!("BPF map: {}", Error::last_os_error()));
        }
        let insns = program(map);
        let license = c"GPL";
        // prog_type | insn_cnt << 32, insns, license, then no log, no name
        let attr = [BPF_PROG_TYPE_PERF_EVENT as u64 | (insns.len() as u64) << 32, insns.as_ptr() as u64,
                    license.as_ptr() as u64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let prog = bpf(BPF_PROG_LOAD, &attr);
        if prog < 0 {
            let e = Error::last_os_error();
            unsafe { libc::close(map) };
            return Err(format!("BPF program: {e}"));
        }
        Ok(Filter { map, prog })
    }

    /// From now on, ticks of `pid`'s threads wake the sampler.
    pub fn add(&self, pid: i32) {
        let (key, value) = (pid as u32, 1u8);
        // map_fd, key, value, flags (BPF_ANY)
        if bpf(BPF_MAP_UPDATE_ELEM, &[self.map as u64, &key as *const u32 as u64, &value as *const u8 as u64, 0]) < 0 {
            eprintln!("daskprobe-sampler: pid {pid} not added to the tick filter ({}): it is read only every 100 ms",
                      Error::last_os_error());
        }
    }

    pub fn remove(&self, pid: i32) {
        let key = pid as u32;
        bpf(BPF_MAP_DELETE_ELEM, &[self.map as u64, &key as *const u32 as u64, 0, 0]);
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        unsafe {
            libc::close(self.prog);
            libc::close(self.map);
        }
    }
}
