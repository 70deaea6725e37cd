"""Benchmark: what each probe costs per task where that cost is largest, bursts of no-op tasks
on a cluster whose CPUs they saturate (merge-10K's second phase, after update_graph).

    python -m daskprobe.experiments.burst_cost --settings none,tap,pyspy,cpu,gil,offcpu,tcp,all

Each round runs every --probes setting once (the order turned each round) as one `daskprobe
run`, 2 workers x 1 thread, whose command times --bursts bursts of --tasks no-op tasks. Each
burst is split evenly between the workers, each half restricted to one: left to itself Dask
sends a whole burst to one worker about half the time, which takes 1.6 times as long, and
that coin outweighs what is measured here. A run's figure is the median of its bursts; a
setting's, the median over rounds of its run's figure over the first setting's (the base) in
the same round, with a bootstrap 90% interval. Every setting is timed in a cluster of its
own, so startup and the first burst (not timed) stay out.

Writes results.csv (one row per run, each burst's time too) and results.json in --out and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from .overhead import SATURATION, _bootstrap_median_ci, steal_s

ALL = "tap,pyspy,proc,cpu,gil,offcpu,tcp"


def noop(i):
    return i


def client(bursts: int, tasks: int) -> dict:
    """Run inside the cluster: the bursts' wall times (s)."""
    from distributed import Client
    c = Client(os.environ["DASK_SCHEDULER_ADDRESS"])
    workers = sorted(c.scheduler_info()["workers"])
    c.gather(c.map(noop, range(-tasks, 0), pure=False))  # imports and connections, not timed
    times, half = [], range(tasks // len(workers))
    for _ in range(bursts):
        start = time.perf_counter()
        c.gather([f for w in workers for f in c.map(noop, half, pure=False, workers=[w], allow_other_workers=False)])
        times.append(time.perf_counter() - start)
    c.close()
    return {"burst_s": statistics.median(times), "bursts_s": times}


def run_once(probes: str, bursts: int, tasks: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "daskprobe.tracer.cli", "run", "--workers", "2", "--threads", "1",
           "--config", SATURATION, "--probes", probes, "--out", str(out), "--",
           sys.executable, "-m", "daskprobe.experiments.burst_cost", "client", str(bursts), str(tasks)]
    stolen = steal_s()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"--probes {probes} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1]) | {"steal_s": steal_s() - stolen}


def summarize(df: pd.DataFrame, base: str) -> pd.DataFrame:
    wide = df.pivot(index="round", columns="setting", values="burst_s")
    rows = []
    for setting in [s for s in df.setting.unique() if s != base]:
        ratio = (wide[setting] / wide[base]).dropna()
        low, high = _bootstrap_median_ci(ratio)
        rows.append({"setting": setting, "median_burst_s": wide[setting].median(), "ratio_median": ratio.median(),
                     "ratio_min": ratio.min(), "ratio_max": ratio.max(), "ratio_ci90_low": low,
                     "ratio_ci90_high": high, "rounds": len(ratio)})
    return pd.DataFrame(rows)


def print_table(df: pd.DataFrame, base: str, base_s: float, tasks: int, console: Console) -> None:
    t = Table(title=f"burst time of {tasks} no-op tasks over --probes {base}'s ({base_s:.3f} s median): "
                    "median of per-round ratios (range; bootstrap 90% interval)")
    for col in ("--probes", "burst, median (s)", "ratio", "range", "90% interval", "rounds"):
        t.add_column(col)
    for r in df.itertuples():
        t.add_row(r.setting, f"{r.median_burst_s:.3f}", f"{r.ratio_median:.3f}", f"{r.ratio_min:.3f}-{r.ratio_max:.3f}",
                  f"{r.ratio_ci90_low:.3f}-{r.ratio_ci90_high:.3f}", str(r.rounds))
    console.print(t)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        print(json.dumps(client(int(argv[1]), int(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(prog="python -m daskprobe.experiments.burst_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default="none,all",
                    help="--probes settings, comma-separated, the first the base; 'all' is every probe with the tap "
                         f"({ALL}); join several probes of one setting with '+' (default none,all)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--bursts", type=int, default=8, help="timed bursts per run")
    ap.add_argument("--tasks", type=int, default=2500, help="no-op tasks per burst, split between the 2 workers")
    ap.add_argument("--out", type=Path, default=Path("runs/burst-cost"))
    ap.add_argument("--keep-runs", action="store_true", help="keep each run's directory (by default only the "
                    "bursts' times are kept: a run with the tap writes about 60 MB)")
    args = ap.parse_args(argv)
    settings = {s: ALL if s == "all" else s.replace("+", ",") for s in args.settings.split(",")}
    if len(settings) < 2:
        ap.error("--settings wants a base and at least one setting to compare with it")
    args.out.mkdir(parents=True, exist_ok=True)
    console, rows = Console(), []
    names = list(settings)
    with console.status("") as status:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order[::-1] if r % 2 else order:
                status.update(f"round {r + 1}/{args.rounds}: --probes {settings[name]}")
                row = run_once(settings[name], args.bursts, args.tasks, args.out / f"{name}-{r}")
                rows.append({"round": r, "setting": name, "probes": settings[name]} | row)
                if not args.keep_runs:
                    shutil.rmtree(args.out / f"{name}-{r}")
                pd.DataFrame(rows).to_csv(args.out / "results.csv", index=False)
    df = pd.DataFrame(rows)
    table = summarize(df, names[0])
    (args.out / "results.json").write_text(json.dumps({"base": names[0], "tasks": args.tasks, "bursts": args.bursts,
                                                      "table": table.to_dict("records")}, indent=1))
    print_table(table, names[0], df[df.setting == names[0]].burst_s.median(), args.tasks, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
