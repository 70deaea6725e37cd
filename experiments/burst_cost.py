"""Benchmark: what each probe costs per task where that cost is largest, bursts of no-op tasks
on a cluster whose CPUs they saturate (like merge-10K's second phase, after update_graph).

    python -m daskprobe.experiments.burst_cost --settings none,tap,pyspy,proc,cpu,gil,offcpu,tcp,every

Each round runs every --probes setting once as one `daskprobe run` (2 workers x 1 thread,
worker-saturation=inf), the order rotated by one each round (so each setting takes each place
equally often; with two settings, ABAB becomes AB BA AB ...). Its command times --bursts bursts
of --tasks no-op tasks after an untimed one. Each burst is split evenly between the workers,
each half restricted to one: left to itself Dask sent a whole burst to one worker in about
half the bursts, which took 1.8 times as long, a coin that outweighed what is measured here.
The restrictions cost the scheduler some work of its own, so a burst is slower than one Dask
splits by itself. A run's figure is the median of its bursts; a setting's, the median over
rounds of its run's figure over the first setting's (the base) in the same round, with a
bootstrap 90% interval. A setting may repeat (none,none: what the pairing leaves, A/A). A run
with a probe skipped (no root, say) stops the benchmark.

Writes results.csv (one row per run, each burst's time too) and results.json in --out and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

from .overhead import bootstrap_median_ci, print_table, run_cluster

EVERY = "tap,pyspy,proc,cpu,gil,offcpu,tcp"  # every probe, with the tap (daskprobe's 'all' has the proxy)


def noop(i):
    return i


def client(bursts: int, tasks: int) -> dict:
    """Run inside the cluster: the bursts' wall times (s)."""
    from distributed import Client
    c = Client(os.environ["DASK_SCHEDULER_ADDRESS"])
    workers = sorted(c.scheduler_info()["workers"])
    if len(workers) != 2:
        raise SystemExit(f"burst_cost wants 2 workers, found {len(workers)}")
    c.gather(c.map(noop, range(-tasks, 0), pure=False))  # imports and connections, not timed
    times, half = [], range(tasks // 2)
    for _ in range(bursts):
        start = time.perf_counter()
        c.gather([f for w in workers for f in c.map(noop, half, pure=False, workers=[w], allow_other_workers=False)])
        times.append(time.perf_counter() - start)
    c.close()
    return {"burst_s": statistics.median(times), "bursts_s": times}


def run_once(probes: str, bursts: int, tasks: int, out: Path) -> dict:
    got = run_cluster(probes, out, [sys.executable, "-m", "daskprobe.experiments.burst_cost", "client",
                                    str(bursts), str(tasks)])
    return got | {"bursts_s": json.dumps(got["bursts_s"])}


def labels(settings: list[str]) -> dict[str, str]:
    """Each setting's label (a repeated one numbered: none, none#2) and its --probes."""
    out = {}
    for s in settings:
        label = s if s not in out else f"{s}#{sum(k.split('#')[0] == s for k in out) + 1}"
        out[label] = EVERY if s == "every" else s.replace("+", ",")
    return out


def summarize(df: pd.DataFrame, base: str) -> pd.DataFrame:
    wide = df.pivot(index="round", columns="setting", values="burst_s")
    rows = []
    for setting in [s for s in df.setting.unique() if s != base]:
        ratio = (wide[setting] / wide[base]).dropna()
        low, high = bootstrap_median_ci(ratio)
        rows.append({"setting": setting, "median_burst_s": wide[setting].median(), "ratio_median": ratio.median(),
                     "ratio_min": ratio.min(), "ratio_max": ratio.max(), "ratio_ci90_low": low,
                     "ratio_ci90_high": high, "rounds": len(ratio),
                     "steal_s_max": df[df.setting.isin([setting, base])].steal_s.max()})
    return pd.DataFrame(rows)


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """The summary as printed: ranges and intervals as low-high."""
    return pd.DataFrame({
        "--probes": df.setting, "burst, median (s)": df.median_burst_s, "ratio": df.ratio_median,
        "range": [f"{lo:.3f}-{hi:.3f}" for lo, hi in zip(df.ratio_min, df.ratio_max)],
        "90% interval": [f"{lo:.3f}-{hi:.3f}" for lo, hi in zip(df.ratio_ci90_low, df.ratio_ci90_high)],
        "rounds": df.rounds, "steal, most in a run (CPU-s)": df.steal_s_max})


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        print(json.dumps(client(int(argv[1]), int(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(prog="python -m daskprobe.experiments.burst_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="none,every",
                    help="--probes settings, comma-separated, the first the base; join several probes of one "
                         f"setting with '+'; 'every' is every probe with the tap ({EVERY}) (default none,every)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--bursts", type=int, default=8, help="timed bursts per run")
    ap.add_argument("--tasks", type=int, default=2500, help="no-op tasks per burst, half on each worker (even)")
    ap.add_argument("--out", type=Path, help="a new or empty directory (default runs/burst-cost-TIME)")
    ap.add_argument("--keep-runs", action="store_true", help="keep each run's directory (by default only the "
                    "bursts' times are kept: a run with the tap writes about 60 MB)")
    args = ap.parse_args(argv)
    settings = labels(args.settings.split(","))
    if len(settings) < 2:
        ap.error("--settings wants a base and at least one setting to compare with it")
    if args.tasks % 2:
        ap.error("--tasks must be even: half of each burst goes to each worker")
    out = args.out or Path("runs") / f"burst-cost-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and any(out.iterdir()):
        ap.error(f"--out {out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    console, rows, names = Console(stderr=True), [], list(settings)
    with console.status("") as status:
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                status.update(f"round {r + 1}/{args.rounds}: --probes {settings[name]}")
                run = out / f"{name.replace('#', '-')}-{r}"
                row = run_once(settings[name], args.bursts, args.tasks, run)
                rows.append({"round": r, "setting": name, "probes": settings[name]} | row)
                console.log(f"round {r + 1} {name}: {row['burst_s']:.3f} s a burst (median of {args.bursts})")
                if not args.keep_runs:
                    shutil.rmtree(run)
                pd.DataFrame(rows).to_csv(out / "results.csv", index=False)
    df = pd.DataFrame(rows)
    table = summarize(df, names[0])
    (out / "results.json").write_text(json.dumps({"base": names[0], "settings": settings, "tasks": args.tasks,
                                                 "bursts": args.bursts, "table": table.to_dict("records")}, indent=1))
    print_table(f"burst time of {args.tasks} no-op tasks over --probes {names[0]}'s "
                f"({df[df.setting == names[0]].burst_s.median():.3f} s median): median of per-round ratios "
                "(range; bootstrap 90% interval)", readable(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
