"""daskprobe's eBPF agent. Runs under Debian's python3 (which has bcc), stdlib only.

    /usr/bin/python3 ebpf_agent.py --out DIR [--cpu HZ] [--gil [--gil-per-process N]] [--offcpu] [--tcp PORT,...]

Reads "PID python|native NAME" lines on stdin: processes (tgids) to watch,
added at any time; GIL waits are probed in the python ones. Compiles at the
priority it was started with (daskprobe lowers it once ready). Prints "ready" once the
BPF programs are loaded, and "done" once its captures are complete
after SIGTERM (the kernel's detaching of the probes, as it exits, takes longer
than everything else it does at the end). Every POLL_S it drains the ring buffers (BPF
never wakes it: a wake-up per event would cost more than the event) and
appends to DIR:
    ebpf_events.bin  ring records, each a header and a struct event (ebpf_format.py: the framing,
                     the fields, and the kinds GIL wait, off-CPU and TCP segment), as BPF wrote
                     them, in bulk; CPU samples' kernel stacks are symbolized here, user stacks after the run
    ebpf_cpu.tsv     t_ns pid tid cpu user_frames kernel_frames   (frames leaf first, ';'-joined;
                     user_frames #ADDR,...: its addresses, hex, symbolized after the run;
                     @N: the Nth record of ebpf_ustacks.bin, unwound after the run)
    ebpf_ustacks.bin struct ustack records (ebpf_format.py): CPU samples of the native processes,
                     with their user registers and the top of their user stack, as BPF copied them
    ebpf_maps.tsv    t_ns pid start end offset dev inode uid path   (a sampled process's executable mappings, hex,
                     when they change; dev MAJOR:MINOR, the process's real uid: the unwinder reads a file only
                     if it is still that one and that user could read it)
    ebpf_programs.tsv  name runs run_time_ns        (each BPF program's cost, if the kernel counts it: ebpf_format)
    ebpf_small.tsv   kind pid tid total_ns count                  (waits below the thresholds, summed in BPF)
    ebpf_status.tsv  A|E pid what                                 (attached / could not, and why;
                     pid -1: the whole agent, e.g. events lost to a full ring buffer,
                     or switches that sched_switch did not show)
All times are bpf_ktime_get_ns(): CLOCK_MONOTONIC, the run's clock.
"""

import argparse
import bisect
import ctypes
import functools
import mmap
import os
import re
import select
import signal
import struct
import sys
import time

from bcc import BPF, PerfSWConfig, PerfType

import ebpf_format  # siblings: sys.path[0] is this script's folder
from btf import Btf
from mapped_file import NotRead, default_version, fd_path, first, mappings, open_mapped

TIMENS_NS = ebpf_format.timens_ns()


def kernel_now() -> int:
    """Now on the kernel's CLOCK_MONOTONIC, BPF's clock (this process may be in a time namespace)."""
    return time.monotonic_ns() - TIMENS_NS

GIL_MIN_NS = 5_000
OFFCPU_MIN_NS = 50_000
MAPS_EVERY_S = 1.0
POLL_S = 0.5  # a drain costs about the same whether it finds 400 records or 2,000; a wake-up is 60-110 µs
GIL_ATTACH_S = 5.0  # how long a watched process may take to map its libpython
TCP_PROBE_FORMAT = "/sys/kernel/tracing/events/tcp/tcp_probe/format"

PROGRAM = r"""
#include <uapi/linux/ptrace.h>
""" + ebpf_format.C_DECLARATIONS + r"""
struct agg { u64 ns; u64 n; };

// Two rings: events, all one size, which the agent appends in bulk without looking at them
// (4 MiB: 65K records; merge-10K emits about 5K a second, drained every 500 ms), and CPU samples,
// which it decodes one by one (8 MiB: 500 copied native stacks)
BPF_RINGBUF_OUTPUT(events, 1 << 10);
BPF_RINGBUF_OUTPUT(samples, 1 << 11);
BPF_ARRAY(lost, u64, 1);
BPF_HASH(watched, u32, u8, 4096);
BPF_HASH(small, u64, struct agg, 65536);  // key: kind << 32 | tid, and tid -> tgid below
BPF_HASH(tgid_of, u32, u32, 65536);

static inline void emit(struct event *e) {
    if (events.ringbuf_output(e, sizeof(*e), BPF_RB_NO_WAKEUP) != 0) lost.increment(0);
}

static inline void add_small(u32 kind, u32 tgid, u32 tid, u64 ns) {
    u64 key = ((u64)kind << 32) | tid;
    struct agg zero = {};
    struct agg *a = small.lookup_or_try_init(&key, &zero);
    if (a) { __sync_fetch_and_add(&a->ns, ns); __sync_fetch_and_add(&a->n, 1); }
    // written only when new (or the id reused): an update allocates an entry to replace the old one
    u32 *known = tgid_of.lookup(&tid);
    if (!known || *known != tgid) tgid_of.update(&tid, &tgid);
}

#ifdef WITH_CPU
BPF_STACK_TRACE(stacks, 16384);
BPF_HASH(unwound, u32, u8, 4096);  // native processes: their user stacks are copied, to unwind after the run
struct task_struct;

// The user stack's top and the registers to unwind it from: those of the sample when it
// hit user code, else those saved on entering the kernel (a system call, a fault).
static inline int copy_user_stack(struct pt_regs *ctx, struct ustack *s) {
    u64 ip = ctx->ip, sp = ctx->sp, bp = ctx->bp;
    if ((ctx->cs & 3) != 3) {
#ifdef ENTRY_REGS  // needs BTF and bpf_task_pt_regs (5.15)
        struct pt_regs *user = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
        if (bpf_probe_read_kernel(&ip, 8, &user->ip) || bpf_probe_read_kernel(&sp, 8, &user->sp)
            || bpf_probe_read_kernel(&bp, 8, &user->bp)) return -1;
#else
        return -1;
#endif
    }
    s->ip = ip; s->sp = sp; s->bp = bp;
    u64 n = 0;
    // in pieces: a whole-size read fails outright where the stack ends less than USTACK_BYTES above sp
    #pragma unroll
    for (int i = 0; i < USTACK_BYTES / USTACK_CHUNK; i++) {
        if (bpf_probe_read_user(s->stack + i * USTACK_CHUNK, USTACK_CHUNK, (void *)(sp + i * USTACK_CHUNK)))
            break;
        n += USTACK_CHUNK;
    }
    s->size = n;
    return 0;
}

static inline int unwound_sample(struct pt_regs *ctx, u32 tgid, u32 tid) {
    struct ustack *s = samples.ringbuf_reserve(sizeof(struct ustack));
    if (!s) { lost.increment(0); return 0; }
    s->e.kind = EVENT_USTACK; s->e.pid = tgid; s->e.tid = tid; s->e.cpu = bpf_get_smp_processor_id();
    s->e.t0 = bpf_ktime_get_ns(); s->e.t1 = 0; s->e.t2 = 0; s->e.v1 = 0;
    s->e.v2 = stacks.get_stackid(ctx, 0);
    if (copy_user_stack(ctx, s)) { s->ip = 0; s->sp = 0; s->bp = 0; s->size = 0; }
    samples.ringbuf_submit(s, BPF_RB_NO_WAKEUP);
    return 0;
}

int on_cpu_sample(struct pt_regs *ctx) {  // a struct bpf_perf_event_data, which starts with the regs
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!watched.lookup(&tgid)) return 0;
    if (unwound.lookup(&tgid)) return unwound_sample(ctx, tgid, (u32)id);
    struct event e = {};
    e.kind = EVENT_CPU; e.pid = tgid; e.tid = (u32)id; e.cpu = bpf_get_smp_processor_id();
    e.t0 = bpf_ktime_get_ns();
    e.v1 = stacks.get_stackid(ctx, BPF_F_USER_STACK);
    e.v2 = stacks.get_stackid(ctx, 0);
    if (samples.ringbuf_output(&e, sizeof(e), BPF_RB_NO_WAKEUP) != 0) lost.increment(0);
    return 0;
}
#endif

#ifdef WITH_GIL
// A GIL wait is a sleep on the GIL's condition: take_gil's call of pthread_cond_timedwait (its only
// call in libpython), each up to the switch interval (5 ms). Probing take_gil itself trapped at every
// acquisition, waited for or not: 1.6 us each, about 2% of merge-10K's CPU; Dask's processes sleep
// 12 to 700 times less often. libc's function is probed (in the watched processes; timed by traps,
// past a few of them in every process), so the caller is checked: Python's code.
struct text { u64 lo; u64 hi; };
BPF_HASH(gil_text, u32, struct text, 4096);
static inline int from_python(struct pt_regs *ctx, u32 tgid) {
    struct text *t = gil_text.lookup(&tgid);
    u64 caller = 0;  // at a function's first instruction, the stack's top is the return address
    return t && !bpf_probe_read_user(&caller, sizeof(caller), (void *)PT_REGS_SP(ctx))
           && caller >= t->lo && caller < t->hi;
}

static inline void gil_wait(u32 tgid, u32 tid, u64 start, u64 end) {
    u64 wait = end - start;
    if (wait >= GIL_MIN_NS) {
        struct event e = {};
        e.kind = EVENT_GIL; e.pid = tgid; e.tid = tid; e.t0 = start; e.t1 = end;
        emit(&e);
    } else {
        add_small(EVENT_GIL, tgid, tid, wait);
    }
}

#if defined(ENTRY_REGS) && !defined(GIL_TRAPS)
// The probe's one task is to find the GIL's condition, at its first wait: the agent then lets it go,
// and sched_switch times each wait as a futex sleep on the GIL (gil_sleep). Two traps a wait
// (entry and return, each while the waiter holds the GIL's mutex) cost bursts of no-op tasks
// 3-6% of their time, where a trap's own cost (1.5 us a call) would make it 0.3%.
#define GIL_AT_SWITCH 1
BPF_HASH(gil_cond, u32, u64, 4096);
int gil_enter(struct pt_regs *ctx) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!from_python(ctx, tgid)) return 0;
    u64 cond = PT_REGS_PARM1(ctx);
    gil_cond.update(&tgid, &cond);
    return 0;
}

struct task_struct;
// Whether the thread going off its CPU (the current one) sleeps in a futex wait on its process's GIL:
// the system call's number and arguments, as saved on entering the kernel. Its futex words (glibc
// 2.25 and later): the waiters' signals, the condition's last 8 bytes, and the GIL's mutex, which
// follows the condition (48 bytes) in CPython's struct, where a waiter woken sleeps again if its
// holder has not let it go. Other words of the condition are where a signalling thread may sleep.
static inline u32 gil_sleep(u32 tgid, s64 state) {
    if (state != 1) return 0;  // TASK_INTERRUPTIBLE: a futex wait; preempted threads are not asleep
    u64 *cond = gil_cond.lookup(&tgid);
    if (!cond) return 0;
    struct pt_regs *user = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
    u64 nr = 0, addr = 0, op = 0;
    if (bpf_probe_read_kernel(&nr, 8, &user->orig_ax) || bpf_probe_read_kernel(&addr, 8, &user->di)
        || bpf_probe_read_kernel(&op, 8, &user->si)) return 0;
    op &= 0x7f;  // FUTEX_CMD_MASK: without the private and clock flags
    if (nr != 202 || (op != 0 && op != 9)) return 0;  // __NR_futex; FUTEX_WAIT, FUTEX_WAIT_BITSET
    return addr - *cond - 40 < 8 || addr == *cond + 48;
}
#else  // no bpf_task_pt_regs (5.15, BTF), or --gil-traps: each wait timed from its call to its return
BPF_HASH(gil_start, u32, u64, 65536);
int gil_enter(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!from_python(ctx, tgid)) return 0;
    u64 now = bpf_ktime_get_ns();
    gil_start.update(&tid, &now);
    return 0;
}
int gil_exit(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    u64 *start = gil_start.lookup(&tid);
    if (!start) return 0;
    // a return to elsewhere than Python's code leaves an entry whose own return went unseen (the
    // probes swapped for one for the whole machine meanwhile; the thread's id reused): dropped
    struct text *t = gil_text.lookup(&tgid);
    u64 to = PT_REGS_IP(ctx);  // at a return probe, where the call returns to
    if (t && to >= t->lo && to < t->hi)
        gil_wait(tgid, tid, *start, bpf_ktime_get_ns());
    gil_start.delete(&tid);
    return 0;
}
#endif
#endif

#if defined(WITH_OFFCPU) || defined(GIL_AT_SWITCH)
// out: when the thread went off its CPU (0: on one); ran: its CPU time then (se.sum_exec_runtime)
struct off { u64 out; u64 wake; s64 state; u32 tgid; u32 gil; u64 ran; };
BPF_HASH(off_start, u32, struct off, 65536);
BPF_ARRAY(unseen, u64, 2);  // switches back to a watched thread with none out before, and out with none back

// The thread is back on a CPU since `in`: its interval off one is emitted (or summed, if short),
// and its GIL wait too.
static inline void back(struct off *o, u32 tid, u64 in) {
#ifdef WITH_OFFCPU
    u64 d = in > o->out ? in - o->out : 0;  // an entry the agent seeded, by a clock read a bit apart
    if (d >= OFFCPU_MIN_NS) {
        struct event e = {};
        e.kind = EVENT_OFFCPU; e.pid = o->tgid; e.tid = tid;
        e.t0 = o->out; e.t1 = o->wake; e.t2 = in; e.v1 = o->state;
        emit(&e);
    } else {
        add_small(EVENT_OFFCPU, o->tgid, tid, d);
    }
#endif
#ifdef GIL_AT_SWITCH
    if (o->gil) gil_wait(o->tgid, tid, o->out, in);
#endif
    o->out = 0;
}

// When a thread went back on its CPU with no sched_switch to it: it has run `ran - o->ran` ns since
// it went off, in one stretch that ends now (no switch out of it went untraced, as `unseen` counts),
// and not before its wakeup. Without its CPU time (no BTF), the interval ends at its wakeup, if seen.
// (That time leaves out what interrupts and the hypervisor took meanwhile: `in` comes that much late.)
static inline u64 unseen_in(struct off *o, u64 now, u64 ran) {
    u64 in = o->out, d = ran - o->ran;
    if (o->ran && ran > o->ran && now > o->out && d < now - o->out) in = now - d;
    return in > o->wake ? in : o->wake;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;  // sched_switch runs as prev
    u32 prev = args->prev_pid, next = args->next_pid;
    // A thread's entry stays from one interval to the next, written in place (an update and a
    // delete each interval cost a watched thread's switches a quarter more); out 0: on a CPU.
    if (prev && watched.lookup(&tgid)) {
        u32 gil = 0;
        u64 ran = 0;
#ifdef GIL_AT_SWITCH
        gil = gil_sleep(tgid, args->prev_state);
#endif
#ifdef RUNTIME  // task_struct's se.sum_exec_runtime, from the kernel's BTF (btf.py)
        bpf_probe_read_kernel(&ran, 8, (void *)bpf_get_current_task() + RUNTIME);
#endif
        struct off *was = off_start.lookup(&prev);
        if (was) {
            // On Linux 6.18 here sched_switch showed no switch back to a thread for 0.1-0.4% of its
            // switches (one asleep for a second, woken and asleep again, seemed to have run all along)
            if (was->out) {
                unseen.increment(0);
                back(was, prev, unseen_in(was, now, ran));
            }
            was->out = now; was->wake = 0; was->state = args->prev_state; was->tgid = tgid; was->gil = gil;
            was->ran = ran;
#ifdef WITH_OFFCPU
        } else {
#else
        } else if (gil) {  // the GIL's waits alone: only the threads that wait for it need an entry
#endif
            struct off o = {now, 0, args->prev_state, tgid, gil, ran};
            off_start.update(&prev, &o);
        }
    }
    struct off *o = off_start.lookup(&next);
    if (o && o->out) back(o, next, now);
    else if (o) unseen.increment(1);  // back on a CPU, by its entry never off it: its switch out went unseen
    return 0;
}
#endif
#ifdef WITH_OFFCPU
TRACEPOINT_PROBE(sched, sched_wakeup) {
    u32 tid = args->pid;
    struct off *o = off_start.lookup(&tid);
    if (o && o->wake == 0) o->wake = bpf_ktime_get_ns();
    return 0;
}
#endif

#ifdef WITH_TCP
BPF_HASH(ports, u16, u8, 4096);
TRACEPOINT_PROBE(tcp, tcp_probe) {
    u16 sport = args->sport, dport = args->dport;  // sport: the receiving socket's own port
    if (!ports.lookup(&sport) && !ports.lookup(&dport)) return 0;
    struct event e = {};
    e.kind = EVENT_TCP; e.t0 = bpf_ktime_get_ns(); e.v1 = ((s64)sport << 16) | dport; e.v2 = args->data_len;
#ifdef SKB_CB  // offsets from the kernel's BTF (btf.py); the tracepoint has skbaddr and skaddr (6.9)
    // data_len is 16 bits, and a segment TCP sends again is probed again: the segment's sequence
    // numbers, against what the socket expects next, tell both
    u32 seq = 0, end_seq = 0, rcv_nxt = 0;
    u8 flags = 0;
    int failed = bpf_probe_read_kernel(&seq, 4, (void *)args->skbaddr + SKB_CB + CB_SEQ)
        | bpf_probe_read_kernel(&end_seq, 4, (void *)args->skbaddr + SKB_CB + CB_END_SEQ)
        | bpf_probe_read_kernel(&flags, 1, (void *)args->skbaddr + SKB_CB + CB_TCP_FLAGS)
        | bpf_probe_read_kernel(&rcv_nxt, 4, (void *)args->skaddr + RCV_NXT);
    if (!failed) {
        e.t1 = (u64)seq << 32 | end_seq;
        e.t2 = (u64)rcv_nxt << 32 | 0x100 | flags;
    }
#endif
    emit(&e);
    return 0;
}
#endif
"""


def libpython_of(pid: int):
    """The mapping of the file that holds take_gil for this process: its libpython, else its executable."""
    if lib := first(pid, r"/libpython3\.\d+[^/]*\.so"):
        return lib
    exe = os.stat(f"/proc/{pid}/exe")
    return next((m for m in mappings(pid) if int(m.inode) == exe.st_ino and m.path != "[vdso]"), None)


def stat_field(path: str, n: int) -> str | None:
    """Field n (from 3, the state) of a /proc stat file, counted after the command name, which may
    hold spaces and parentheses (None: gone)."""
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()[n - 3]
    except (OSError, IndexError):
        return None


@functools.cache
def kernel_types() -> Btf:
    return Btf()  # 60 ms to read: once, for every program that reads kernel structs by hand


def runtime(path: str) -> int:
    """A thread's CPU time so far, ns (its schedstat's first field: se.sum_exec_runtime), 0 if
    unknown."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return 0


def started(pid: int) -> str | None:
    """When the process started (field 22, clock ticks since boot): with its pid, who it is."""
    return stat_field(f"/proc/{pid}/stat", 22)


def libc_of(pid: int):
    return first(pid, r"/libc(\.so|-[\d.]+\.so)")


def exec_mappings(pid: int) -> list:
    """The process's executable mappings, its files' and its vDSO ([vdso]) (mapped_file.Mapping)."""
    return [m for m in mappings(pid) if m.perms[2] == "x"]


def text_of(pid: int, path: str) -> tuple[int, int] | None:
    """Where the executable mappings of `path` lie in the process: (lowest start, highest end)."""
    spans = [(int(m.start, 16), int(m.end, 16)) for m in exec_mappings(pid) if m.path == path]
    return (min(a for a, _ in spans), max(b for _, b in spans)) if spans else None


def take_gil_symbol(fd: int) -> str | None:
    """take_gil, or its LTO-suffixed name (take_gil.lto_priv.0), in an open file."""
    try:
        found = BPF.get_user_functions_and_addresses(fd_path(fd), r"^take_gil(\..*)?$")
    except Exception:
        return None
    return found[0][0].decode() if found else None


def real_uid(pid: int) -> int:
    """The process's real uid (OSError: gone)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


class Agent:
    def __init__(self, args):
        self.args, self.files, self.stacks_cache, self.symbols = args, {}, {}, {}
        # by file (device, inode): take_gil's name in a libpython; (an open descriptor, whose
        # /proc/self/fd path bcc attaches to, and pthread_cond_timedwait's address) in a libc
        self.gil_libs, self.gil_libcs = {}, {}
        # libc file -> (pid, its start time), or None for the whole machine -> the uprobe events attached
        self.gil_probes = {}
        self.ustacks, self.maps = 0, {}  # records in ebpf_ustacks.bin; pid -> its last mappings written
        self.ranges = {}  # pid -> (starts, ends) of those mappings, sorted, and when they were read
        self.owed = set()  # pids with a sample outside their last mappings
        self.gil_waiting = {}  # pid -> (name, deadline): its libpython not mapped yet
        self.gil_found = set()  # pids whose GIL condition BPF has found
        cflags = [f"-DGIL_MIN_NS={GIL_MIN_NS}ULL", f"-DOFFCPU_MIN_NS={OFFCPU_MIN_NS}ULL"]
        cflags += ["-DWITH_CPU"] * bool(args.cpu) + ["-DWITH_GIL"] * args.gil + ["-DWITH_OFFCPU"] * args.offcpu
        cflags += ["-DWITH_TCP"] * bool(args.tcp) + ["-DGIL_TRAPS"] * args.gil_traps
        if args.tcp:
            cflags += self.tcp_offsets()
        if args.offcpu or (args.gil and not args.gil_traps):
            cflags += self.runtime_offset()
        # GIL waits read at the switches (no trap at each), where the kernel has bpf_task_pt_regs
        self.gil_at_switch = args.gil and not args.gil_traps
        entry_regs = bool(args.cpu) or self.gil_at_switch
        try:
            self.b = self.load(cflags + ["-DENTRY_REGS"] * entry_regs)
        except Exception as e:  # no BTF, or a kernel before 5.15: all but that part still runs
            if not entry_regs:
                raise
            self.b, self.gil_at_switch = self.load(cflags), False
            lost = ["native samples taken in the kernel are not unwound"] * bool(args.cpu)
            lost += ["each GIL wait trapped twice (its call and its return)"] * (args.gil and not args.gil_traps)
            self.out("ebpf_status.tsv").write(f"E\t-1\t{'; '.join(lost)}: {e}\n")
        if args.tcp:
            for port in args.tcp:
                self.b["ports"][ctypes.c_uint16(port)] = ctypes.c_uint8(1)
        self.events, self.samples = (RingReader(self.b[name].map_fd, self.b[name].max_entries)
                                     for name in ("events", "samples"))
        if args.cpu:
            # bcc reads /proc/kallsyms whole when it first names a kernel address: 60 ms of CPU, which
            # stalled the first drain to find a kernel stack, mid-run; here, the cluster is starting
            self.b.ksym(0)

    def tcp_offsets(self) -> list[str]:
        """Where the BPF program finds a segment's sequence numbers and its socket's rcv_nxt."""
        try:
            with open(TCP_PROBE_FORMAT) as f:
                fields = f.read()
            if "skaddr;" not in fields or "skbaddr;" not in fields:
                raise ValueError("tcp:tcp_probe has no skbaddr and skaddr before Linux 6.9")
            btf = kernel_types()
            where = {"SKB_CB": btf.offset("sk_buff", "cb"), "RCV_NXT": btf.offset("tcp_sock", "rcv_nxt")}
            where |= {f"CB_{m.upper()}": btf.offset("tcp_skb_cb", m) for m in ("seq", "end_seq", "tcp_flags")}
        except Exception as e:  # no BTF, or one not read here: the segments are still counted
            self.out("ebpf_status.tsv").write(
                f"E\t-1\tTCP segments read from data_len alone (16 bits: over 64 KiB wraps; a segment sent "
                f"again counts twice): {e}\n")
            return []
        return [f"-D{name}={off}" for name, off in where.items()]

    def runtime_offset(self) -> list[str]:
        """Where the BPF program finds a thread's CPU time, to end an interval whose switch back
        sched_switch did not show."""
        try:
            btf = kernel_types()
            return [f"-DRUNTIME={btf.offset('task_struct', 'se') + btf.offset('sched_entity', 'sum_exec_runtime')}"]
        except Exception as e:  # no BTF, or one not read here
            self.out("ebpf_status.tsv").write(
                f"E\t-1\ta thread's switch back to a CPU that sched_switch does not show ends its interval off "
                f"one at its wakeup, else where it began: {e}\n")
            return []

    def load(self, cflags: list[str]) -> BPF:
        b = BPF(text=PROGRAM, cflags=cflags)
        if self.args.cpu:
            b.attach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK,
                                fn_name="on_cpu_sample", sample_freq=self.args.cpu, cpu=-1)
        return b

    def out(self, name: str, mode: str = "a"):
        if name not in self.files:
            # never through a symlink planted where a capture goes (ELOOP instead)
            fd = os.open(os.path.join(self.args.out, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
            self.files[name] = os.fdopen(fd, mode)
        return self.files[name]

    def watch(self, pid: int, name: str, python: bool) -> None:
        self.b["watched"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        if self.gil_at_switch:  # a pid reused: its last process's GIL is not this one's
            self.b["gil_cond"].pop(ctypes.c_uint32(pid), None)
            self.gil_found.discard(pid)
        if self.args.cpu:
            self.snapshot_maps(pid)  # a process that ends before a drain is still named
        if self.args.cpu and not python:  # a native build rarely keeps frame pointers: unwind from .eh_frame
            self.b["unwound"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)
        if self.args.offcpu:
            self.seed_sleepers(pid)
        status = self.out("ebpf_status.tsv")
        status.write(f"A\t{pid}\twatching {name}\n")
        if self.args.gil and python:
            self.gil_waiting[pid] = (name, time.monotonic() + GIL_ATTACH_S)
            self.retry_gil()

    def seed_sleepers(self, pid: int) -> None:
        """Threads asleep since before they were watched (all of a cluster attached to) have no
        switch-out for BPF to see, and would count as on a CPU until they wake: each sleeping one
        is entered as off-CPU from now, with its CPU time then. Should it be running by the time the
        entry is made, its next switch-out ends that interval where its CPU time says it ran (as a
        switch back sched_switch did not show, and counted with those)."""
        table, now = self.b["off_start"], kernel_now()
        for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
            if (state := stat_field(f"/proc/{pid}/task/{tid}/stat", 3)) is None:
                continue
            key = ctypes.c_uint32(int(tid))
            if state in "SDI" and table.get(key) is None:  # out, no wake-up seen, blocked, tgid, not the GIL
                table[key] = table.Leaf(now, 0, 1, pid, 0, runtime(f"/proc/{pid}/task/{tid}/schedstat"))

    def retry_gil(self) -> None:
        """A process watched right after exec has only its executable and the loader mapped: its
        libpython comes a few milliseconds later, so a miss is retried until GIL_ATTACH_S."""
        for pid, (name, deadline) in list(self.gil_waiting.items()):
            line = self.attach_gil(pid, name)
            if line.startswith("A") or time.monotonic() > deadline:
                self.out("ebpf_status.tsv").write(line)
                del self.gil_waiting[pid]

    def attach_gil(self, pid: int, name: str) -> str:
        try:
            lib, libc = libpython_of(pid), libc_of(pid)
            if lib is None:
                return f"E\t{pid}\tgil: {name}: no libpython or executable mapped\n"
            if (sym := self.take_gil_in(pid, lib)) is None:
                return f"E\t{pid}\tgil: {name}: no take_gil symbol in {lib.path} (stripped, or not CPython)\n"
            if not libc:
                return f"E\t{pid}\tgil: {name}: no libc mapped\n"
            key, (fd, at) = self.libc_in(pid, libc)
            if not at:
                return f"E\t{pid}\tgil: {name}: no pthread_cond_timedwait in its libc ({libc.path})\n"
            text = text_of(pid, lib.path)
        # gone, or a file not read (mapped_file's checks) or that is not the ELF file expected
        except (OSError, ValueError, IndexError, struct.error, NotRead) as e:
            return f"E\t{pid}\tgil: {name}: {e}\n"
        if text is None:
            return f"E\t{pid}\tgil: {name}: {lib.path} is not mapped\n"
        table = self.b["gil_text"]
        table[ctypes.c_uint32(pid)] = table.Leaf(*text)
        try:
            scope = self.attach_waits(key, fd_path(fd), at, pid)
        except Exception as e:  # bcc's only kind; the process gone meanwhile, say
            del table[ctypes.c_uint32(pid)]
            return f"E\t{pid}\tgil: {name}: attaching to {libc.path}: {e}\n"
        return f"A\t{pid}\tgil: {name}: {lib.path}:{sym}, its waits in {libc.path}:pthread_cond_timedwait ({scope})\n"

    def take_gil_in(self, pid: int, lib) -> str | None:
        """take_gil's name in the file the process maps (looked for once per file)."""
        fd = open_mapped(pid, lib)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if key not in self.gil_libs:
                self.gil_libs[key] = take_gil_symbol(fd)
            return self.gil_libs[key]
        finally:
            os.close(fd)

    def libc_in(self, pid: int, libc) -> tuple:
        """(device, inode) of the libc file the process maps (in another mount namespace, another file
        than at its path here), and (a descriptor open on it, pthread_cond_timedwait's address). The
        descriptor stays open: bcc attaches to its /proc/self/fd path, which names that file only."""
        fd = open_mapped(pid, libc)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key in self.gil_libcs:
            os.close(fd)
        else:
            try:
                self.gil_libcs[key] = (fd, default_version(fd, "pthread_cond_timedwait"))
            except BaseException:
                os.close(fd)
                raise
        return key, self.gil_libcs[key]

    def attach_waits(self, file: tuple[int, int], path: str, at: int, pid: int) -> str:
        """Probes libc's pthread_cond_timedwait for `pid`, and says for whom. Per process, the kernel
        writes the breakpoint into the watched processes' memory only, so no other process on the
        machine traps at its condition waits; past --gil-per-process of them, one probe for the
        whole machine replaces theirs, whose checks would make every trap cost more."""
        probes = self.gil_probes.setdefault(file, {})
        self.drop_waits(probes, [k for k in probes if k is not None and started(k[0]) != k[1]])
        me = (pid, started(pid))
        if None in probes or me in probes:
            return "probed machine-wide" if None in probes else "probed in this process"
        # at the switches, a process's probe lives until its first wait: one each
        whom = pid if self.gil_at_switch or len(probes) < self.args.gil_per_process else -1
        before = set(self.b.uprobe_fds)
        try:
            self.b.attach_uprobe(name=path, addr=at, fn_name="gil_enter", pid=whom)
            if not self.gil_at_switch:
                self.b.attach_uretprobe(name=path, addr=at, fn_name="gil_exit", pid=whom)
        except Exception:  # none half attached: a retry starts afresh
            self.drop_events(set(self.b.uprobe_fds) - before)
            raise
        probes[me if whom == pid else None] = set(self.b.uprobe_fds) - before
        if whom == pid:
            return "probed in this process"
        self.drop_waits(probes, [k for k in probes if k is not None])  # the machine-wide probe serves them
        return f"probed machine-wide, past {self.args.gil_per_process} processes with probes of their own"

    def let_go_found(self) -> None:
        """Once a process's GIL condition is found (its first wait), sched_switch times its waits and
        its probe is let go."""
        found = {k.value for k in self.b["gil_cond"].keys()} - self.gil_found
        for pid in found:
            self.out("ebpf_status.tsv").write(f"A\t{pid}\tgil: its GIL's condition found; its waits are "
                                              "read at its threads' switches, with no probe in libc\n")
        self.gil_found |= found
        for probes in self.gil_probes.values():
            self.drop_waits(probes, [k for k in probes if k is not None and k[0] in found])

    def drop_waits(self, probes: dict, keys: list) -> None:
        for k in keys:
            self.drop_events(probes.pop(k))

    def drop_events(self, events: set) -> None:
        """Detaches each; one that fails stays (its check on every trap) and is said in the log."""
        for event in events:
            try:
                self.b.detach_uprobe_event(event)
            except Exception as e:
                print(f"ebpf agent: could not detach {event!r}: {e}", file=sys.stderr, flush=True)

    def frames(self, stack_id: int, pid: int) -> str:
        """A kernel stack (pid -1) symbolized; a user stack as "#" and its addresses (hex, leaf first),
        symbolized after the run from the process's mappings (ebpf_maps.tsv), which are read
        again when an address falls outside the last ones."""
        if stack_id < 0:
            return "[lost]" if stack_id != -14 else ""  # -EFAULT: no such stack (e.g. kernel-only)
        key = (pid, stack_id)
        if key not in self.stacks_cache:
            # the addresses up to the first 0, in one copy (bcc's walk takes one Python step per address)
            table = self.b["stacks"]
            ips = table[table.Key(stack_id)].ip[:]
            addrs = ips[:ips.index(0)] if 0 in ips else ips
            if pid < 0:
                self.stacks_cache[key] = ";".join(self.symbol(addr) for addr in addrs)
            else:
                self.stacks_cache[key] = "#" + ",".join(f"{addr:x}" for addr in addrs)
                if addrs and not self.mapped(pid, addrs[0]):
                    self.owed.add(pid)
        return self.stacks_cache[key]

    def mapped(self, pid: int, ip: int) -> bool:
        """Whether the last mappings read hold the sample's instruction (only the leaf: a walk by frame
        pointers through code built without them goes on through garbage)."""
        starts, ends, _ = self.ranges.get(pid, ((), (), 0.0))
        i = bisect.bisect_right(starts, ip) - 1
        return i >= 0 and ip < ends[i]

    def pay_maps(self, last: bool = False) -> None:
        """Reads again the mappings of the processes that had a sample outside them, each at most every
        MAPS_EVERY_S; all of them at the end."""
        now = time.monotonic()
        for pid in list(self.owed):
            if last or now - self.ranges.get(pid, ((), (), -MAPS_EVERY_S))[2] >= MAPS_EVERY_S:
                self.snapshot_maps(pid)
                self.owed.discard(pid)

    def symbol(self, addr: int) -> str:
        """A kernel address, looked up once."""
        if addr not in self.symbols:
            self.symbols[addr] = self.b.ksym(addr).decode("utf-8", "replace").replace(";", ":").replace("\t", " ")
        return self.symbols[addr]

    def drain(self) -> None:
        self.events.take(ebpf_format.RECORD_SIZE, self.out("ebpf_events.bin", "ab"))
        records = self.samples.records()
        if records:  # CPU samples: the only records decoded here, to write their stacks
            cpu, unwound = self.out("ebpf_cpu.tsv"), set()
            for raw in records:
                e = ebpf_format.Event.from_buffer_copy(raw[:ebpf_format.SIZE])
                if e.kind == ebpf_format.USTACK:
                    self.out("ebpf_ustacks.bin", "ab").write(raw)
                    user, self.ustacks = f"@{self.ustacks}", self.ustacks + 1
                    unwound.add(e.pid)
                else:
                    user = self.frames(e.v1, e.pid)
                cpu.write(f"{e.t0}\t{e.pid}\t{e.tid}\t{e.cpu}\t{user}\t{self.frames(e.v2, -1)}\n")
            for pid in unwound:
                self.snapshot_maps(pid)
        self.pay_maps()
        for f in self.files.values():
            f.flush()

    def snapshot_maps(self, pid: int) -> None:
        """The process's executable file mappings, written when they differ from the last ones
        written: the unwinder finds a sample's modules in the first snapshot taken after it. A sample
        in the vDSO (in no file: left unnamed) is in them too, so that it does not read them again.
        Each with the file's device and inode and the process's uid, which the unwinder checks."""
        try:
            mappings, uid = exec_mappings(pid), real_uid(pid)
        except (OSError, StopIteration):
            return  # it has exited: its earlier snapshot stands
        rows = [(m.start, m.end, m.offset, m.dev, m.inode, str(uid), m.path) for m in mappings if m.path != "[vdso]"]
        spans = sorted((int(m.start, 16), int(m.end, 16)) for m in mappings)
        self.ranges[pid] = ([a for a, _ in spans], [b for _, b in spans], time.monotonic())
        if rows != self.maps.get(pid):
            self.maps[pid], t = rows, kernel_now()
            self.out("ebpf_maps.tsv").writelines(f"{t}\t{pid}\t" + "\t".join(r) + "\n" for r in rows)

    def finish(self) -> None:
        self.drain()
        self.pay_maps(last=True)
        small, tgid_of = self.b["small"], self.b["tgid_of"]
        out = self.out("ebpf_small.tsv")
        for k, v in small.items():
            tid = k.value & 0xFFFFFFFF
            tgid = tgid_of.get(ctypes.c_uint32(tid))
            kind = ebpf_format.NAMES[k.value >> 32]
            out.write(f"{kind}\t{tgid.value if tgid else -1}\t{tid}\t{v.ns}\t{v.n}\n")
        self.program_costs()
        if self.args.offcpu:
            self.still_off()
        if self.args.offcpu or self.gil_at_switch:  # sched_switch's program is loaded
            self.say_unseen()
        lost = self.b["lost"][ctypes.c_int(0)].value
        if lost:
            self.out("ebpf_status.tsv").write(f"E\t-1\t{lost} events lost: the ring buffer was full\n")
        self.drain()

    def say_unseen(self) -> None:
        ins, outs = (self.b["unseen"][ctypes.c_int(i)].value for i in range(2))
        if ins:
            self.out("ebpf_status.tsv").write(
                f"A\t-1\t{ins} switches of watched threads back to a CPU were not in sched_switch; each one's "
                "interval off a CPU ends where its CPU time says\n")
        if outs:  # none seen here (a thread id reused by another process's thread counts too)
            self.out("ebpf_status.tsv").write(
                f"A\t-1\t{outs} switches of watched threads off a CPU were not in sched_switch: each seemed to "
                "run until its next switch back\n")

    def write_open(self) -> None:
        """What the captures hold up to now, the intervals still open too (see still_off)."""
        self.drain()
        if self.args.offcpu:
            self.still_off()
        self.drain()

    def still_off(self) -> None:
        """Threads off a CPU as recording ends, or as the captures are read while it goes on: BPF
        emits an interval only when a thread comes back, so theirs end now (a thread parked all
        along would otherwise count as running), or where their CPU time says they came back (a
        switch back that sched_switch did not show). Written again at a later read, and when the
        thread comes back: the reader keeps the longest record of each interval."""
        now, kind = kernel_now(), ebpf_format.KINDS["offcpu"][0]
        ended = []
        for k, o in self.b["off_start"].items():
            task = f"/proc/{o.tgid}/task/{k.value}"
            # a thread that exited was switched out for the last time: it was not waiting, it was gone
            if not o.out or now - o.out < OFFCPU_MIN_NS or not os.path.exists(task):
                continue
            ran = runtime(f"{task}/schedstat") - o.ran
            came = now - ran if o.ran and 0 < ran < now - o.out else now
            if (end := max(came, o.wake)) - o.out >= OFFCPU_MIN_NS:
                ended.append(ebpf_format.Event(kind=kind, pid=o.tgid, tid=k.value, t0=o.out, t1=o.wake, t2=end,
                                               v1=o.state))
        if ended:
            self.out("ebpf_events.bin", "ab").write(b"".join(map(ebpf_format.record, ended)))

    def program_costs(self) -> None:
        names = {fn.fd: name.decode() for name, fn in self.b.funcs.items()}
        if lines := ebpf_format.program_costs(os.getpid(), names):
            self.out(ebpf_format.PROGRAMS).write(lines)


class RingReader:
    """BPF's ring buffer read in place, with no Python callback per record (bcc's cost about 5 µs
    each, most of this agent's CPU). The layout and protocol are the kernel's (kernel/bpf/ringbuf.c),
    as libbpf reads them: a consumer page we advance; a producer page, then the data pages, mapped
    twice in a row so that a record that wraps around reads as one piece. Each record: a 32-bit
    length with a busy (not yet committed) and a discard bit, 4 bytes, the data, padding to 8."""
    BUSY, DISCARD, HEADER = 1 << 31, 1 << 30, 8

    def __init__(self, map_fd: int, size: int):
        assert size & (size - 1) == 0, "a ring buffer's size is a power of 2"
        self.page, self.mask = mmap.PAGESIZE, size - 1
        self.consumer = mmap.mmap(map_fd, self.page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.data = mmap.mmap(map_fd, self.page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=self.page)

    def records(self) -> list[bytes]:
        """Every committed record since the last call, in order; their space is handed back."""
        cons, = struct.unpack_from("<Q", self.consumer, 0)
        prod, = struct.unpack_from("<Q", self.data, 0)
        out = []
        while cons < prod:
            at = self.page + (cons & self.mask)
            header, = struct.unpack_from("<I", self.data, at)
            if header & self.BUSY:
                break  # reserved, not yet written: the next drain takes it
            length = header & ~(self.BUSY | self.DISCARD)
            if not header & self.DISCARD:
                out.append(self.data[at + self.HEADER:at + self.HEADER + length])
            cons += (self.HEADER + length + 7) & ~7
        struct.pack_into("<Q", self.consumer, 0, cons)
        return out

    def take(self, size: int, out) -> None:
        """Writes to `out`, as one piece and headers included, every record committed since the
        last call, in a ring whose records are all `size` bytes long: the headers are checked in
        one comparison, and no Python object is made per record."""
        cons, = struct.unpack_from("<Q", self.consumer, 0)
        prod, = struct.unpack_from("<Q", self.data, 0)
        n = (prod - cons) // size
        if not n:
            return
        at = self.page + (cons & self.mask)
        region = memoryview(self.data)[at:at + n * size]
        lengths = region.cast("I")[::size // 4].tobytes()
        committed = struct.pack("<I", size - self.HEADER)
        if lengths != committed * n:  # one still being written, and those after it: the next drain's
            n = next(i for i in range(n) if lengths[4 * i:4 * i + 4] != committed)
        out.write(region[:n * size])
        struct.pack_into("<Q", self.consumer, 0, cons + n * size)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", type=int, default=0, help="CPU samples per second per CPU (0: off)")
    ap.add_argument("--gil", action="store_true")
    ap.add_argument("--gil-per-process", type=int, default=0,
                    help="how many processes get a GIL probe of their own before one serves the machine "
                         "(0: one for the machine from the start)")
    ap.add_argument("--gil-traps", action="store_true",
                    help="time each GIL wait by probes at its call and return, as where the kernel lacks "
                         "bpf_task_pt_regs (5.15, BTF), rather than at the switches")
    ap.add_argument("--offcpu", action="store_true")
    ap.add_argument("--tcp", type=lambda s: [int(p) for p in s.split(",") if p], default=[])
    args = ap.parse_args()
    agent = Agent(args)
    # a signal writes to this pipe, so the wait for stdin or the next drain ends at once
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    print("ready", flush=True)
    next_drain, stdin_open, pending = time.monotonic() + POLL_S, True, b""
    while not stopping:
        wait = max(0.0, next_drain - time.monotonic())
        ready = select.select([0] * stdin_open + [wake_r], [], [], wait)[0]
        if wake_r in ready:
            os.read(wake_r, 512)
        if 0 in ready:
            chunk = os.read(0, 65536)
            stdin_open = bool(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in filter(None, (ln.decode().strip() for ln in lines)):
                if line == "open":  # the captures are about to be read (an agent's host): nothing left open
                    agent.write_open()
                    print("open", flush=True)
                    continue
                pid, python, name = line.split(" ", 2)
                agent.watch(int(pid), name, python == "python")
        if time.monotonic() >= next_drain:
            agent.retry_gil()
            if agent.gil_at_switch:
                agent.let_go_found()
            agent.drain()
            next_drain = time.monotonic() + POLL_S
    agent.finish()
    print("done", flush=True)  # every capture is written: daskprobe need not wait for the exit
    # From Linux 4.17 bcc attaches every probe through a perf event fd, which the kernel detaches when
    # the process exits; bcc's own detaching at exit, one probe at a time, took 0.5 s of the teardown.
    if tuple(map(int, re.findall(r"\d+", os.uname().release)[:2])) >= (4, 17):
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
