"""Benchmark: how long from `daskprobe run` to the user's command starting?

    python -m daskprobe.experiments.startup                         # proxy only and every probe, 5 repeats
    python -m daskprobe.experiments.startup --vs /path/to/other     # against another version, in pairs

The benchmark reads CLOCK_MONOTONIC, starts `daskprobe run --workers 2 -- python -c ...`, and the
command's first statement prints the same clock: the start-up is the difference (it includes
daskprobe's own imports and checks, the probes, the cluster and the probes' getting ready). The
command then computes one task, so each run is a normal one. Reported per probe set (and per
build with --vs, whose folder holds another `daskprobe` package, run first in every other pair so
that neither always follows the other): median start-up, its range, and the median of each phase
run.json's `startup_s` records. Writes runs.csv and results.csv in --out.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from ..probes.rundir import RunDir
from .repeats import run_all, show

CHILD = ("import time; print('CLOCK', time.monotonic(), flush=True)\n"
         "import distributed\n"
         "print(distributed.Client().submit(sum, [1, 2]).result())\n")


def one(version: str, path: str | None, probes: str, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=path) if path else None
    cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "2", "--probes", probes,
           "--out", str(out), "--", sys.executable, "-c", CHILD]
    started = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    clock = next((float(line.split()[1]) for line in p.stdout.splitlines() if line.startswith("CLOCK ")), None)
    if p.returncode or clock is None:
        raise RuntimeError(f"{version} {probes}: exit {p.returncode}\n{p.stderr[-2000:]}")
    phases = RunDir(out).meta().get("startup_s", {})
    return {"build": version, "probe_set": probes, "startup_s": clock - started,
            **{f"{k}_s": v for k, v in phases.items()}}


def _repeat(version: str, path: str | None, probes: str, r: int, out: Path) -> dict:
    return one(version, path, probes, out / f"{probes}-{version}-r{r}") | {"repeat": r}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probes", default="proxy,all", help="probe sets, comma-separated (each as run's --probes)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--vs", help="a folder holding another daskprobe package, run alternately with this one")
    p.add_argument("--out", default="runs/startup")
    args = p.parse_args(argv)
    out = Path(args.out)
    versions = [("this", None)] + ([("vs", args.vs)] if args.vs else [])
    plan = [(f"r{r} {probes} {version}", functools.partial(_repeat, version, path, probes, r, out))
            for r in range(args.repeat) for probes in args.probes.split(",")
            for version, path in (versions[::-1] if r % 2 else versions)]
    summary = run_all(out, plan, summarize)
    _print(summary)
    return 0


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    phases = [c for c in runs.columns if c.endswith("_s") and c != "startup_s"]
    g = runs.groupby(["probe_set", "build"], sort=False)
    return pd.concat([g.size().rename("runs"), g.startup_s.median(), g.startup_s.min().rename("startup_min_s"),
                      g.startup_s.max().rename("startup_max_s"), g[phases].median()], axis=1).reset_index()


def _print(df: pd.DataFrame) -> None:
    head = ["probe_set", "build", "runs", "startup_s", "startup_min_s", "startup_max_s"]
    show(df, [("from `daskprobe run` to the command's first statement, s (median, range)", head),
              ("each phase of run.json's startup_s, s (median)",
               ["probe_set", "build", *(c for c in df.columns if c not in head)])])


if __name__ == "__main__":
    raise SystemExit(main())
