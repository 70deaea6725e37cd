"""Benchmark: how long after the user's command ends is the run directory complete?

    python -m daskprobe.experiments.finalize_latency                      # 1K to 10K tasks, 3 repeats
    python -m daskprobe.experiments.finalize_latency --graphs merge-1K --repeat 5

Each graph (tracer/bench/workloads.py) runs as `daskprobe run --workers 2 -- python ...` with every
probe. The command notes CLOCK_MONOTONIC when it starts; daskprobe notes when the command's process
exited (run.json's command_ended_ns: after the workload, its interpreter still has to exit), and
daskprobe's own exit is noted on the same clock. The latency is the time from the command's
process's end to daskprobe's exit, when
tables, summary.json, trace.pftrace and report.html are written and the cluster is gone. Target: at
most 2 s + 5% of the command's duration. Reported per graph: tasks, median command duration,
median latency with its range, the budget, whether the median meets it, and the median time of
each finalize stage (run.json's finalize_seconds). Writes results.csv in --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from ..probes.rundir import RunDir
from .repeats import run_all, show

# the command: a workload between two readings of the clock daskprobe's exit is read on
CHILD = ("import json, runpy, sys, time\n"
         "start = time.monotonic()\n"
         "sys.argv = ['workloads', sys.argv[1]]\n"
         "try:\n"
         "    runpy.run_module('daskprobe.tracer.bench.workloads', run_name='__main__')\n"
         "finally:\n"
         "    print('CLOCK', json.dumps([start, time.monotonic()]), flush=True)\n")


def one(graph: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "2", "--out", str(out), "--",
           sys.executable, "-c", CHILD, graph]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    exited = time.monotonic()
    clock = next((json.loads(line[6:]) for line in p.stdout.splitlines() if line.startswith("CLOCK ")), None)
    result = next((json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")), {})
    if p.returncode or clock is None:
        raise RuntimeError(f"{graph}: exit {p.returncode}\n{p.stderr[-2000:]}")
    meta = RunDir(out).meta()
    ended = meta["command_ended_ns"] / 1e9
    return {"graph": graph, "tasks": result.get("tasks"), "command_s": ended - clock[0],
            "latency_s": exited - ended, "command_exit_s": ended - clock[1], **{f"{k}_s": v for k, v in meta.get("finalize_seconds", {}).items()}}


def _repeat(graph: str, r: int, out: Path) -> dict:
    return one(graph, out / f"{graph}-r{r}-{time.strftime('%H%M%S')}") | {"repeat": r}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graphs", default="merge-1K,tree-12,merge-10K")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="runs/finalize-latency")
    args = p.parse_args(argv)
    out, graphs = Path(args.out), args.graphs.split(",")
    # repeats interleaved: a slow spell of the machine hits every graph
    plan = [(f"r{r} {g}", functools.partial(_repeat, g, r, out)) for r in range(args.repeat) for g in graphs]
    summary = run_all(out, plan, summarize)
    _print(summary)
    return 0


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    stages = [c for c in runs.columns if c.endswith("_s") and c not in ("command_s", "latency_s")]
    out = []
    for graph, g in runs.groupby("graph", sort=False):
        command = statistics.median(g.command_s)
        budget = 2 + 0.05 * command
        latency = statistics.median(g.latency_s)
        out.append({"graph": graph, "tasks": g.tasks.iloc[0], "runs": len(g), "command_s": command,
                    "latency_s": latency, "latency_min_s": g.latency_s.min(), "latency_max_s": g.latency_s.max(),
                    "budget_s": budget, "met": latency <= budget, **{c: g[c].median() for c in stages}})
    return pd.DataFrame(out)


def _print(df: pd.DataFrame) -> None:
    """One row per graph; the stages' medians on a second table."""
    head = ["graph", "tasks", "runs", "command_s", "latency_s", "latency_min_s", "latency_max_s", "budget_s", "met"]
    show(df, [("from the command's end to a complete run directory, s (median; budget 2 s + 5% of the command)", head),
              ("finalize stages, s (median)", ["graph", *df.columns.difference(head)])])


if __name__ == "__main__":
    raise SystemExit(main())
