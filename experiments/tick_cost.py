"""Benchmark: what a perf-event tick costs the thread it interrupts, on this machine.

    python -m daskprobe.experiments.tick_cost [--rates 2000] [--pairs 60]   (root)

The sampler and the eBPF agent each keep a cpu-clock perf event on every CPU
(about 100 Hz), with a BPF program on it: each tick is a timer interrupt,
which on a VM without a PMU is a software timer and the hypervisor's exits
around it. That time lands in whatever thread the tick interrupts, the
cluster's mostly; the measuring processes' CPU does not show it, nor does the
kernel's count of BPF run time (`overhead --bpf-time`), which starts inside
the program.

A pure-Python loop runs pinned to the last CPU while this process, pinned to
the first, switches a cpu-clock event on every CPU on and off in alternate
windows of 0.5 s (PERF_EVENT_IOC_ENABLE / DISABLE), on-off then off-on so
that a drift of the machine's speed hits both alike; once with no BPF
program (the interrupt and the timer alone) and once with an empty one (two
instructions: what attaching any program adds, before it does any work).
Per pair of windows, the slowdown is the loop's median iteration time with
ticks over without, minus 1; the cost of a tick, the time it added per
second of the loop's (s / (1 + s)) over the rate. The rates are far above
daskprobe's so that the slowdown stands out of this machine's noise;
reported are the median and quartiles over pairs, and what the default
rates cost at that price.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import itertools
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from ..probes import rates

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_PROG_LOAD, BPF_PROG_TYPE_PERF_EVENT = 5, 7
EMPTY_PROGRAM = struct.pack("<BBhiBBhi", 0xB7, 0, 0, 0, 0x95, 0, 0, 0)  # r0 = 0; exit
PERF_EVENT_IOC_SET_BPF = 0x40042408  # _IOW('$', 8, __u32)
PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK = 1, 0
DISABLED = 1  # perf_event_attr's first flag bit: created off
IOC_ENABLE, IOC_DISABLE = 0x2400, 0x2401  # _IO('$', 0), _IO('$', 1)
WINDOW_S, SETTLE_S = 0.5, 0.05
DEFAULT_TICKS_HZ = rates.SAMPLE_RATE + rates.CPU_HZ  # sampler's + eBPF agent's, per CPU
LOOP = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t0 = time.monotonic_ns()
    d = {}
    for i in range(5000):
        d[("task", i)] = (sum, [("dep", i - 1), i], {"k": str(i)})
    sorted(d, key=lambda k: -k[1])
    print(t0, time.monotonic_ns() - t0)
"""


def _syscall(table: dict, *args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(table[platform.machine()]), *args)
    if r < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return r


def empty_program() -> int:
    """A perf-event BPF program that returns at once: its fd."""
    insns, license = ctypes.create_string_buffer(EMPTY_PROGRAM), ctypes.create_string_buffer(b"GPL")
    # union bpf_attr for BPF_PROG_LOAD, up to kern_version: prog_type, insn_cnt, insns, license,
    # log_level, log_size, log_buf, kern_version
    packed = struct.pack("<IIQQIIQI4x", BPF_PROG_TYPE_PERF_EVENT, 2, ctypes.addressof(insns),
                         ctypes.addressof(license), 0, 0, 0, 0)
    return _syscall(SYS_BPF, BPF_PROG_LOAD, ctypes.create_string_buffer(packed, len(packed)), len(packed))


def tick_events(rate: int, cpus: list[int]) -> list[int]:
    """A cpu-clock event ticking at `rate` on each of `cpus`, created disabled: their fds."""
    # perf_event_attr as of its first version (64 bytes): type, size, config, sample_period,
    # sample_type, read_format, flags, wakeup_events, bp_type, config1
    attr = ctypes.create_string_buffer(struct.pack("<IIQQQQQIIQ", PERF_TYPE_SOFTWARE, 64, PERF_COUNT_SW_CPU_CLOCK,
                                                   int(1e9 / rate), 0, 0, DISABLED, 0, 0, 0), 64)
    fds = []
    try:
        for cpu in cpus:
            fds.append(_syscall(SYS_PERF_EVENT_OPEN, attr, -1, cpu, -1, 0))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def alternate(fds: list[int], pairs: int) -> list[tuple[str, int, int]]:
    """Ticks on then off, and off then on, in turn, `pairs` times: each window's (state, start, end),
    CLOCK_MONOTONIC ns."""
    windows = []
    for i in range(pairs):
        for state in ("on", "off") if i % 2 == 0 else ("off", "on"):
            for fd in fds:
                fcntl.ioctl(fd, IOC_ENABLE if state == "on" else IOC_DISABLE, 0)
            time.sleep(SETTLE_S)
            start = time.monotonic_ns()
            time.sleep(WINDOW_S)
            windows.append((state, start, time.monotonic_ns()))
    return windows


def slowdowns(iterations: pd.DataFrame, windows: list[tuple[str, int, int]]) -> np.ndarray:
    """Per pair of windows, the loop's median iteration time with ticks over without, minus 1 (only
    iterations wholly inside a window count)."""
    medians = {}
    for i, (state, start, end) in enumerate(windows):
        inside = iterations[(iterations.t0 >= start) & (iterations.t0 + iterations.ns <= end)]
        medians[(i // 2, state)] = inside.ns.median()
    return np.array([medians[(p, "on")] / medians[(p, "off")] - 1 for p in range(len(windows) // 2)])


def run_windows(rate: int, pairs: int, bpf: bool, cpus: list[int]) -> tuple[pd.DataFrame, list]:
    """The loop's iterations (t0, ns) on the last CPU, and the windows, ticks on every CPU."""
    fds, program = tick_events(rate, cpus), None
    try:
        if bpf:
            program = empty_program()
            for fd in fds:
                fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, program)
        return loop_beside(fds, pairs, cpus[-1])
    finally:
        for fd in fds + [program] * (program is not None):
            os.close(fd)


def loop_beside(events: list[int], pairs: int, cpu: int) -> tuple[pd.DataFrame, list]:
    """The windows (alternate), with the loop running on `cpu` meanwhile; its iterations (t0, ns)."""
    seconds = pairs * 2 * (WINDOW_S + SETTLE_S) + 60
    with tempfile.TemporaryFile("w+") as out:  # a pipe, unread until the end, would fill and stall the loop
        loop = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", LOOP, str(seconds)], stdout=out)
        try:
            time.sleep(1.0)
            windows = alternate(events, pairs)
        finally:
            loop.kill()
            loop.wait()
        out.seek(0)
        return pd.read_csv(out, sep=" ", names=["t0", "ns"]), windows


def measure(rate: int, pairs: int, bpf: bool, cpus: list[int]) -> dict:
    s = slowdowns(*run_windows(rate, pairs, bpf, cpus))
    q = np.nanpercentile(s / (1 + s) / rate * 1e6, [25, 50, 75])
    return {"rate_hz": rate, "program": "empty" if bpf else "none", "pairs": int(np.isfinite(s).sum()),
            "slowdown_median_percent": float(np.nanmedian(s)) * 100,
            "us_per_tick_q25": q[0], "us_per_tick_median": q[1], "us_per_tick_q75": q[2],
            "default_rates_percent_of_cpu": q[1] * DEFAULT_TICKS_HZ / 1e4}


def print_table(df: pd.DataFrame) -> None:
    table = Table(title="CPU time a cpu-clock tick costs the thread it interrupts. slowdown: the loop's median "
                        "iteration time with ticks over without, minus 1 (%, median over window pairs); µs per "
                        f"tick: median and quartiles; last: that median at the default {DEFAULT_TICKS_HZ:g} Hz "
                        "per CPU, % of each CPU")
    for col in df.columns:
        table.add_column(col)
    for r in df.itertuples(index=False):
        table.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r])
    Console().print(table)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="2000", help="tick rates per CPU, Hz, comma-separated")
    ap.add_argument("--pairs", type=int, default=60, help="on/off window pairs per rate and program")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error("needs two CPUs: one for the loop, one for this process")
    rates = [int(r) for r in args.rates.split(",")]
    limit = int(Path("/proc/sys/kernel/perf_event_max_sample_rate").read_text())
    if max(rates) > limit:  # the kernel would tick slower than asked, and the cost per tick read high
        ap.error(f"--rates above kernel.perf_event_max_sample_rate ({limit})")
    os.sched_setaffinity(0, {cpus[0]})
    console, rows = Console(stderr=True), []
    for rate, bpf in itertools.product(rates, (False, True)):
        with console.status(f"ticks at {rate} Hz{' with an empty BPF program' * bpf}, {args.pairs} window pairs"):
            try:
                rows.append(measure(rate, args.pairs, bpf, cpus))
            except OSError as e:
                console.print(f"[red]{e}[/red] (system-wide perf events and BPF need root)")
                return 1
    print_table(pd.DataFrame(rows))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tick_cost.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
