"""Benchmark: does the split name the cause? Workloads x injected causes x repeats.

    python -m daskprobe.experiments.attribution --repeat 3
    python -m daskprobe.experiments.attribution --flows chain,etl --causes none,decisions --repeat 1
    python -m daskprobe.experiments.attribution --repeat 3 --reanalyze   # today's analysis on the same runs

Each repeat runs every workload (experiments/flows.py) unperturbed, then with
each cause, adjacent in time, as `daskprobe run --workers 2` with every probe.
A cause is added in the shape real code has it and must land in one category:

    decisions  a worker choice that costs more, inside the scheduler's own
               worker-choice methods                       -> scheduler_decisions
    gil-spin   a scheduler thread spinning in pure Python  -> gil_contention (target 80%)
    gil-c      a scheduler thread holding the GIL in C calls -> gil_contention
    delay      links with 5-20 ms of latency (--delay-ms)      -> network
    tasks      every task working longer                  -> compute
    think      the client working 1-5 s between its computations -> client

Each cause's size is set per workload (TASK_S, DECISION_S, THINK_S, DELAY_MS) so
that it stands out of the workload's run-to-run noise.

Reported per cell, median over repeats: the share of the added session time
(perturbed minus its own baseline) that landed in each category; for think,
whose size is known, also the client time added over the time injected. For `none`:
network's share of the session (target: at most 2%), and per process the CPU
the analysis reports over the kernel's count (/proc; target within 10% for
processes with at least 200 on-CPU samples; every ratio is printed with its
sample count). Writes runs.csv, cells.csv and unperturbed.csv in --out and
prints the matrix.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..analyzers import summary_json
from ..probes.rundir import RunDir

INJECT = Path(__file__).with_name("inject.py")
EXPECTED = {"decisions": "scheduler_decisions", "gil-spin": "gil_contention", "gil-c": "gil_contention",
            "delay": "network", "tasks": "compute", "think": "client"}
TARGET = {"gil-spin": 0.8}  # else 0.9
# per workload, the size of each cause: big enough to stand out of run-to-run noise (the etl and
# futures scripts vary by a few seconds between identical runs on this 2-core machine)
TASK_S = {"chain": 0.02, "merge": 0.01, "tree": 0.01, "etl": 0.2, "futures": 0.1}
DECISION_S = {"chain": 0.02, "merge": 0.001, "tree": 0.002, "etl": 0.01, "futures": 0.02}
THINK_S = {"chain": 1.0, "merge": 3.0, "tree": 3.0, "etl": 5.0, "futures": 5.0}
DELAY_MS = {"chain": 5, "merge": 5, "tree": 5, "etl": 20, "futures": 20}
FLOWS = ("chain", "merge", "tree", "etl", "futures")
ROUNDS = 2  # each flow's computations (experiments/flows.py's default)
CAUSES = ("none", *EXPECTED)


def cause_options(flow: str, cause: str) -> tuple[list[str], dict]:
    """(extra `daskprobe run` options, extra environment) for a cause."""
    preload = ["--config", f"distributed.scheduler.preload=['{INJECT}']"]
    return {"none": ([], {}),
            "decisions": (preload, {"DASKPROBE_INJECT": f"decisions:{DECISION_S[flow]}"}),
            "gil-spin": (preload, {"DASKPROBE_INJECT": "gil-spin"}),
            "gil-c": (preload, {"DASKPROBE_INJECT": "gil-c:0.03"}),
            "delay": (["--delay-ms", str(DELAY_MS[flow])], {}),
            "tasks": ([], {"TASK_S": str(TASK_S[flow])}),
            "think": ([], {"THINK_S": str(THINK_S[flow])})}[cause]


def run_one(flow: str, cause: str, out: Path, workers: int = 2) -> dict:
    opts, env = cause_options(flow, cause)
    cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", str(workers), "--out", str(out), *opts,
           "--", sys.executable, "-m", "daskprobe.experiments.flows", flow]
    p = subprocess.run(cmd, env=os.environ | env, capture_output=True, text=True, timeout=900)
    return measured({"flow": flow, "cause": cause, "run_dir": str(out), "exit_code": p.returncode}, p.stderr)


def reanalyzed(row: dict) -> dict:
    """The row of a run already made, from its captures analysed again by today's code."""
    p = subprocess.run([sys.executable, "-m", "daskprobe.tracer.commands", "report", row["run_dir"]],
                       capture_output=True, text=True, timeout=900)
    keep = {k: row[k] for k in ("flow", "cause", "run_dir", "exit_code", "repeat")}
    return measured(keep, p.stderr)


def measured(row: dict, stderr: str) -> dict:
    out = Path(row["run_dir"])
    try:
        s = summary_json.read(RunDir(out))
    except (OSError, ValueError):
        return row | {"error": stderr[-500:]}
    row |= {"session_s": s.get("session_s"), **{f"cat.{c}": v for c, v in s.get("critical_path_s", {}).items()}}
    for proc, c in s.get("cpu_check", {}).items():
        row |= {f"cpu_ratio.{proc}": c.get("ratio"), f"cpu_samples.{proc}": c.get("on_cpu_samples")}
    return row


def cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (flow, cause): the median over repeats of each category's share of the added session time."""
    cats = [c for c in runs.columns if c.startswith("cat.")]
    base = runs[runs.cause == "none"].set_index(["flow", "repeat"])
    rows = []
    for (flow, cause), g in runs[runs.cause != "none"].groupby(["flow", "cause"]):
        shares = []
        for r in g.to_dict("records"):
            if (flow, r["repeat"]) not in base.index:
                continue  # its baseline has not run (yet)
            b = base.loc[(flow, r["repeat"])]
            added = r["session_s"] - b.session_s
            landed = _or0(r[f"cat.{EXPECTED[cause]}"]) - _or0(b[f"cat.{EXPECTED[cause]}"])
            shares.append({c[4:]: (_or0(r[c]) - _or0(b[c])) / added for c in cats} | {"added_s": added,
                          "landed_s": landed})
        med = pd.DataFrame(shares).median()
        expected = EXPECTED[cause]
        # a cause whose size is known exactly (the client's thinking between its computations) is also
        # compared with that size: the added session is noisier than the cause on long workloads
        injected = THINK_S[flow] * (ROUNDS - 1) if cause == "think" else None
        rows.append({"flow": flow, "cause": cause, "expected": expected, "added_s": med.added_s,
                     "landed_s": med.landed_s, "of_injected": med.landed_s / injected if injected else None,
                     "share": med.get(expected, 0.0), "target": TARGET.get(cause, 0.9),
                     "met": (med.landed_s / injected if injected else med.get(expected, 0.0)) >= TARGET.get(cause, 0.9),
                     "repeats": len(shares),
                     **{f"share_{k}": v for k, v in med.drop(["added_s", "landed_s"]).items()}})
    return pd.DataFrame(rows)


def _or0(v) -> float:
    return 0.0 if pd.isna(v) else float(v)


def unperturbed(runs: pd.DataFrame) -> pd.DataFrame:
    """Per workload: network's share of the session, and CPU ratios of well-sampled processes."""
    rows = []
    for flow, g in runs[runs.cause == "none"].groupby("flow"):
        net = (g["cat.network"].fillna(0) / g.session_s).median()
        ratios, samples = {}, {}
        for c in [c for c in g.columns if c.startswith("cpu_ratio.")]:
            proc = c.split(".", 1)[1]
            ratios[proc], samples[proc] = g[c].median(), int(g[f"cpu_samples.{proc}"].fillna(0).median())
        held = {p: r for p, r in ratios.items() if samples[p] >= 200}  # the target's scope
        worst = max(ratios.values(), key=lambda r: abs(r - 1)) if ratios else None
        rows.append({"flow": flow, "network_share": net, "network_met": net <= 0.02,
                     "cpu_ratio_worst": worst, "cpu_met": all(abs(r - 1) <= 0.1 for r in held.values()),
                     "cpu_ratios (samples)": json.dumps({p: f"{r:.3f} ({samples[p]})" for p, r in ratios.items()})})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flows", default=",".join(FLOWS))
    p.add_argument("--causes", default=",".join(CAUSES))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="workers of each run (1 thread each on a 2-core machine)")
    p.add_argument("--out", default="runs/attribution")
    p.add_argument("--reanalyze", action="store_true",
                   help="analyse the runs already in --out again (daskprobe report) before the matrix")
    args = p.parse_args(argv)
    flows, causes = args.flows.split(","), args.causes.split(",")
    if "none" not in causes:
        causes = ["none", *causes]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = pd.read_csv(out / "runs.csv") if (out / "runs.csv").exists() else pd.DataFrame()
    todo = [(r, f, c) for r in range(args.repeat) for f in flows for c in causes
            if done.empty or not ((done.repeat == r) & (done.flow == f) & (done.cause == c)).any()]
    with Progress(console=Console(stderr=True)) as progress:
        bar = progress.add_task("attribution", total=len(todo))
        for r, flow, cause in todo:
            progress.update(bar, description=f"r{r} {flow} {cause}")
            row = run_one(flow, cause, out / f"{flow}-{cause}-r{r}", args.workers) | {"repeat": r}
            done = pd.concat([done, pd.DataFrame([row])], ignore_index=True)
            done.to_csv(out / "runs.csv", index=False)  # resumable: the same command again goes on
            progress.advance(bar)
    if args.reanalyze and len(done):
        with Progress(console=Console(stderr=True)) as progress:
            rows = [reanalyzed(r) for r in progress.track(done.to_dict("records"), description="analysing again")]
        done = pd.DataFrame(rows)
        done.to_csv(out / "runs.csv", index=False)
    matrix, quiet = cells(done), unperturbed(done)
    matrix.to_csv(out / "cells.csv", index=False)
    quiet.to_csv(out / "unperturbed.csv", index=False)
    _print(matrix, quiet)
    return 0


def _print(matrix: pd.DataFrame, quiet: pd.DataFrame) -> None:
    console = Console()
    t = Table(title="share of the added session time in the expected category (median over repeats)")
    for col in ("flow", "cause", "expected", "added s", "share", "of injected", "target", "met", "largest other"):
        t.add_column(col)
    for _, r in matrix.iterrows():
        others = {k[6:]: v for k, v in r.items() if k.startswith("share_") and k[6:] != r.expected}
        other = max(others.items(), key=lambda kv: kv[1]) if others else ("-", 0)
        t.add_row(r.flow, r.cause, r.expected, f"{r.added_s:.2f}", f"{r.share:.0%}",
                  "-" if pd.isna(r.of_injected) else f"{r.of_injected:.0%}", f"{r.target:.0%}",
                  "yes" if r.met else "NO", f"{other[0]} {other[1]:.0%}")
    console.print(t)
    q = Table(title="unperturbed runs")
    for col in quiet.columns:
        q.add_column(col)
    for r in quiet.itertuples(index=False):
        q.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r))
    console.print(q)


if __name__ == "__main__":
    sys.exit(main())
