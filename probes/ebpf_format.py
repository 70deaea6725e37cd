"""The eBPF agent's event record and its ebpf_events.bin framing, defined once.

FIELDS and KINDS give the C the BPF program is compiled with (C_DECLARATIONS),
the agent's ctypes class (Event) and the readers' numpy dtypes (numpy_dtype, and
numpy_record_dtype for a record of ebpf_events.bin).
Stdlib only: the agent, a script under Debian's python3, imports it as a
sibling, and numpy is imported only by the readers' call.
"""

import ctypes
import os
import struct

# In order, each at its natural alignment, as C, BPF, ctypes and numpy (align=True) all place them.
FIELDS = (("kind", "u32"), ("pid", "u32"), ("tid", "u32"), ("cpu", "u32"), ("t0", "u64"), ("t1", "u64"),
          ("t2", "u64"), ("v1", "s64"), ("v2", "s64"))
TYPES = {"u32": (ctypes.c_uint32, "<u4"), "u64": (ctypes.c_uint64, "<u8"), "s64": (ctypes.c_int64, "<i8")}

# kind: (number, what its fields hold, named as the readers' columns, notes)
KINDS = {
    "cpu": (1, {"pid": "pid", "tid": "tid", "cpu": "cpu", "t0": "t_ns", "v1": "user_stack", "v2": "kernel_stack"},
            "written to ebpf_cpu.tsv (the kernel stack symbolized, the user stack as addresses), never to ebpf_events.bin"),
    "gil": (2, {"pid": "pid", "tid": "tid", "t0": "start_ns", "t1": "end_ns"},
            "a sleep in take_gil on the GIL's condition of at least GIL_MIN_NS; shorter ones are summed into ebpf_small.tsv"),
    "offcpu": (3, {"pid": "pid", "tid": "tid", "t0": "out_ns", "t1": "wakeup_ns", "t2": "in_ns", "v1": "prev_state"},
               "off-CPU for at least OFFCPU_MIN_NS (shorter: ebpf_small.tsv); wakeup_ns 0: none seen; "
               "prev_state 0: preempted; a thread asleep when watched is off from then, one still off at the "
               "end until the end, and (an agent's on another host) at each read until then, written again "
               "later: the reader keeps each interval's longest record (written by the agent); one whose "
               "return the kernel did not trace until the thread's CPU time says it returned"),
    "tcp": (4, {"t0": "t_ns", "v1": "ports", "v2": "data_len", "t1": "seqs", "t2": "next"},
            "a segment received (tcp:tcp_probe); ports: (local << 16) + remote; data_len: 16 bits; "
            "seqs: (seq << 32) + end_seq, from the skb; next: (the socket's rcv_nxt << 32) + 0x100 + "
            "the TCP flags; seqs and next 0 where the kernel's BTF was not read"),
    "ustack": (5, {"pid": "pid", "tid": "tid", "cpu": "cpu", "t0": "t_ns", "v2": "kernel_stack"},
               "a CPU sample of a native process, its user stack to be unwound after the run: the head of "
               "a struct ustack (USTACK_FIELDS), written whole to ebpf_ustacks.bin"),
}
NAMES = {number: kind for kind, (number, _, _) in KINDS.items()}
CPU, USTACK = KINDS["cpu"][0], KINDS["ustack"][0]

# After the struct event of a ustack record: the user registers at the sample (the three that
# unwinding from .eh_frame starts from) and the top of the user stack, copied from sp up in
# USTACK_CHUNK pieces until one cannot be read; size: the bytes copied. perf copies 8 KiB by default;
# a tokio server's poll chain can run deeper.
USTACK_BYTES, USTACK_CHUNK = 16384, 512
USTACK_FIELDS = (("ip", "u64"), ("sp", "u64"), ("bp", "u64"), ("size", "u64"))

Event = type("Event", (ctypes.Structure,), {"_fields_": [(name, TYPES[t][0]) for name, t in FIELDS]})
SIZE = ctypes.sizeof(Event)
Ustack = type("Ustack", (ctypes.Structure,), {"_fields_": [("e", Event)]
                                             + [(name, TYPES[t][0]) for name, t in USTACK_FIELDS]
                                             + [("stack", ctypes.c_uint8 * USTACK_BYTES)]})
USTACK_SIZE = ctypes.sizeof(Ustack)

# ebpf_events.bin holds the events ring buffer's records as the kernel lays them out, appended in
# bulk so that the agent does no work per record: an 8-byte header (u32 length, its busy and discard
# bits clear by then; u32 the kernel's own page offset, meaningless here), then the struct event.
RING_HEADER = 8
RECORD_SIZE = RING_HEADER + SIZE
assert RECORD_SIZE % 8 == 0, "the kernel pads ring records to 8 bytes: none here, so they lie back to back"


def record(event) -> bytes:
    """An event as one ebpf_events.bin record, for those the agent makes itself."""
    return struct.pack("<II", SIZE, 0) + bytes(event)


def _c_declarations() -> str:
    """struct event, EVENT_<KIND> per kind, and asserts that the BPF compiler lays the
    struct out as ctypes does (each field's offset and size): should their rules ever
    differ, the program fails to load instead of its events being misread."""
    fields = " ".join(f"{t} {name};" for name, t in FIELDS)
    lines = [f"struct event {{ {fields} }};"]
    lines += [f"#define EVENT_{kind.upper()} {number}" for kind, (number, _, _) in KINDS.items()]
    lines.append(f'_Static_assert(sizeof(struct event) == {SIZE}, "struct event: see ebpf_format.py");')
    lines += [f"_Static_assert(__builtin_offsetof(struct event, {name}) == {field.offset} "
              f'&& sizeof(((struct event *)0)->{name}) == {field.size}, "event.{name}");'
              for name, field in ((name, getattr(Event, name)) for name, _ in FIELDS)]
    fields = " ".join(f"{t} {name};" for name, t in USTACK_FIELDS)
    lines.append(f"#define USTACK_BYTES {USTACK_BYTES}\n#define USTACK_CHUNK {USTACK_CHUNK}")
    lines.append(f"struct ustack {{ struct event e; {fields} u8 stack[USTACK_BYTES]; }};")
    lines.append(f'_Static_assert(sizeof(struct ustack) == {USTACK_SIZE}, "struct ustack: see ebpf_format.py");')
    lines += [f"_Static_assert(__builtin_offsetof(struct ustack, {name}) == {field.offset} "
              f'&& sizeof(((struct ustack *)0)->{name}) == {field.size}, "ustack.{name}");'
              for name, field in ((name, getattr(Ustack, name)) for name in [n for n, _ in USTACK_FIELDS] + ["stack"])]
    return "\n".join(lines) + "\n"


C_DECLARATIONS = _c_declarations()


def numpy_dtype():
    import numpy as np
    return np.dtype([(name, TYPES[t][1]) for name, t in FIELDS], align=True)


def numpy_record_dtype():
    """An ebpf_events.bin record: the ring's header (ring_len, ring_pgoff), then `event`."""
    import numpy as np
    return np.dtype([("ring_len", "<u4"), ("ring_pgoff", "<u4"), ("event", numpy_dtype())])


def ustack_offsets() -> dict[str, int]:
    """Where the unwinder (daskprobe-unwind) finds each field in a ustack record."""
    head = {name: getattr(Event, name).offset for name in ("pid", "tid", "t0")}
    return head | {name: getattr(Ustack, name).offset for name in [n for n, _ in USTACK_FIELDS] + ["stack"]}


def timens_ns() -> int:
    """How far this process's CLOCK_MONOTONIC is ahead of the kernel's, which BPF stamps the
    records with: its time namespace's offset (0 outside one)."""
    try:
        with open("/proc/self/timens_offsets") as f:
            for line in f:
                clock, seconds, nanos = line.split()
                if clock == "monotonic":
                    return int(seconds) * 10**9 + int(nanos)
    except (OSError, ValueError):
        pass
    return 0


# Each BPF program's cost, counted by the kernel only while sysctl kernel.bpf_stats_enabled is 1
# (the overhead and unwinding benchmarks turn it on): written at their end by the agent and the
# sampler, one line per program that ran.
PROGRAMS = "ebpf_programs.tsv"  # name  runs  run_time_ns
STATS = "/proc/sys/kernel/bpf_stats_enabled"


def stats_enabled(on: bool | None = None) -> bool:
    """Whether the kernel counts BPF programs' runs and run time; `on` sets it first (root)."""
    if on is not None:
        with open(STATS, "w") as f:
            f.write("1" if on else "0")
    with open(STATS) as f:
        return f.read().strip() == "1"


def program_costs(pid: int, names: dict[int, str], other: str = "bpf") -> str:
    """PROGRAMS' lines for the BPF programs process `pid` holds open that ran: by `names` (fd ->
    name), the others named `other` (its lines are summed by name)."""
    lines = []
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:  # closed meanwhile
            continue
        if "prog_type" in info and int(info.get("run_cnt", 0)):
            lines.append(f"{names.get(int(fd), other)}\t{info['run_cnt']}\t{info['run_time_ns']}\n")
    return "".join(lines)
