"""Benchmark: what native stacks without frame pointers cost and buy, per CPU sample.

    python -m daskprobe.experiments.unwind_cost [--repeat 5] [--hz 99] [--out runs/unwind-cost]

A C program built with -O2 -fomit-frame-pointer spins in a known call chain (main, chain_outer,
chain_middle, chain_leaf) while the eBPF agent samples it, watched alternately as a Python
process (user stacks walked by frame pointers in BPF, the agent symbolizing them) and as a native
one (the top 16 KiB of the user stack copied in BPF, unwound from .eh_frame by daskprobe-unwind
after the run). Per run: the samples, the share whose stack holds the whole chain, the BPF
program's time per sample (the kernel's own count, kernel.bpf_stats_enabled, set for the
benchmark and restored; all of the program's runs, including its early returns on other
processes' samples, over the program's samples), the agent's CPU per sample while sampling (/proc), the bytes written per
sample, and the unwinder's CPU per sample. Needs root, bcc and gcc. Writes runs.csv and
results.csv (median and range per mode) in --out.
"""

from __future__ import annotations

import argparse
import functools
import resource
import subprocess
import time
from pathlib import Path

import pandas as pd

from ..probes import ebpf_format, ebpf_tables, rates
from ..probes.ebpf import Ebpf
from ..probes.procfs import cpu_s
from ..probes.rundir import RunDir
from .repeats import run_all, show

CHAIN = ["chain_leaf", "chain_middle", "chain_outer", "main"]
CHAIN_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double on(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec / 1e9; }
__attribute__((noinline)) double chain_leaf(double x) { for (int i = 0; i < 2000000; i++) x = x * 1.0000001 + 1e-9; return x; }
__attribute__((noinline)) double chain_middle(double x) { volatile char pad[200]; pad[0] = 1; return chain_leaf(x) * 0.5 + pad[0]; }
__attribute__((noinline)) double chain_outer(double x) { x = chain_middle(x) + 2; __asm__ volatile("" ::: "memory"); return x * 0.5; }
int main(int argc, char **argv) {
    getchar();
    /* argv[1] (1.5) seconds of its own CPU, however busy the machine (at most a minute) */
    double x = 1, spend = argc > 1 ? atof(argv[1]) : 1.5, end = on(CLOCK_MONOTONIC) + 60;
    while (on(CLOCK_PROCESS_CPUTIME_ID) < spend && on(CLOCK_MONOTONIC) < end) x = chain_outer(x);
    printf("%f\n", x);
    return 0;
}
"""


def build_chain(folder: Path) -> Path:
    """CHAIN_C built without frame pointers, as a stock release build of a server is."""
    src, exe = folder / "chain.c", folder / "chain"
    src.write_text(CHAIN_C)
    subprocess.run(["gcc", "-O2", "-fomit-frame-pointer", "-o", str(exe), str(src)], check=True)
    return exe


def chain_share(samples: pd.DataFrame, stacks: pd.DataFrame, frames: pd.DataFrame, pid: int,
                chain: list[str]) -> tuple[int, float]:
    """The process's samples (read_cpu's tables), and the share whose stack holds `chain`,
    leaf first, frame after frame."""
    names = frames.set_index("frame_id").function
    held = stacks.set_index("stack_id").frame_ids.map(
        lambda ids: any([names[i] for i in ids[k:k + len(chain)]] == chain for k in range(len(ids))))
    mine = samples[samples.pid == pid].stack_id
    return len(mine), float(mine.map(held).mean()) if len(mine) else 0.0


def _watched(status: Path, pid: int) -> None:
    deadline = time.monotonic() + 60
    while not (status.exists() and f"A\t{pid}\t" in status.read_text()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the agent did not watch {pid}")
        time.sleep(0.05)


def one(exe: Path, mode: str, hz: int, seconds: float, out: Path) -> dict:
    run = RunDir(out)
    for sub in ("captures", "logs"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    probe = Ebpf(["cpu"], cpu_hz=hz)
    probe.start(run)
    probe.ready()
    cap = run / "captures"
    try:
        target = subprocess.Popen([str(exe), str(seconds)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        probe.watch_as(target.pid, {"fp": "python", "dwarf": "native"}[mode], "chain")
        _watched(cap / "ebpf_status.tsv", target.pid)
        agent_before = cpu_s(probe.proc.pid)
        target.communicate(b"\n", timeout=seconds + 60)
        agent_s = cpu_s(probe.proc.pid) - agent_before
    finally:
        probe.stop()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    unwound = ebpf_tables.unwind(cap)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    unwind_s = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
    samples, stacks, frames = ebpf_tables.read_cpu(cap / "ebpf_cpu.tsv", 0, 0)
    n, share = chain_share(samples, stacks, frames, target.pid, CHAIN)
    programs = pd.read_csv(cap / ebpf_format.PROGRAMS, sep="\t", names=["name", "runs", "ns"]).set_index("name")
    written = sum(f.stat().st_size for f in cap.glob("ebpf_*") if f.name != ebpf_format.PROGRAMS)
    return {"mode": mode, "samples": n, "chain_share": share,
            "bpf_us": programs.ns["on_cpu_sample"] / max(n, 1) / 1e3,
            "agent_us": agent_s / max(n, 1) * 1e6, "bytes": written / max(n, 1),
            "unwind_us": unwind_s / max(len(unwound), 1) * 1e6 if unwound else 0.0}


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in runs.columns if c not in ("mode", "repeat")]
    med = runs.groupby("mode")[cols].median()
    lo, hi = runs.groupby("mode")[cols].min(), runs.groupby("mode")[cols].max()
    out = med.add_suffix("_median").join(lo.add_suffix("_min")).join(hi.add_suffix("_max"))
    return out.reset_index()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--hz", type=int, default=rates.CPU_HZ,
                   help=f"CPU samples per second (default: daskprobe's, {rates.CPU_HZ})")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds of its own CPU the program spins each run")
    p.add_argument("--out", default="runs/unwind-cost")
    args = p.parse_args(argv)
    if why := Ebpf(["cpu"]).available():
        p.error(why)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exe = build_chain(out)
    was = ebpf_format.stats_enabled()
    plan = []
    for r in range(args.repeat):
        for mode in ("fp", "dwarf") if r % 2 == 0 else ("dwarf", "fp"):
            run = functools.partial(one, exe, mode, args.hz, args.seconds, out / f"{mode}-r{r}")
            plan.append((f"{mode} r{r}", lambda run=run, r=r: run() | {"repeat": r}))
    try:
        ebpf_format.stats_enabled(True)
        summary = run_all(out, plan, summarize)
    finally:
        ebpf_format.stats_enabled(was)
    show(summary, [("the chain found", ["mode", "chain_share_median", "chain_share_min", "samples_median"]),
                   ("per sample: in BPF (µs)", ["mode", "bpf_us_median", "bpf_us_min", "bpf_us_max"]),
                   ("per sample: agent CPU (µs), bytes written, unwinding CPU (µs)",
                    ["mode", "agent_us_median", "bytes_median", "unwind_us_median", "unwind_us_max"])])
    print(f"record size {ebpf_format.USTACK_SIZE} bytes (dwarf); results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
