"""`daskprobe whatif --scaling` against held-out bench runs: fit on some worker counts, predict the others.

    daskprobe bench --graphs merge-5K --workers 8,32,64,128,256 --workers-per-process 128 --worker zero \\
        --probes proxy,pyspy,proc --repeat 1 --out runs/whatif-scaling5k
    python -m daskprobe.experiments.whatif_scaling runs/whatif-scaling5k --fit 8,32,64 --source 8,64

The scheduler's costs are fitted on the bench's rows at --fit; each run at a --source count predicts
each run at a count not in --fit. Prints the markdown table of docs/whatif.md: makespan predicted (with
its interval) against the held-out run's (its jobs' span, as whatif measures it), and the scheduler's
CPU predicted against the bench's (proc, over the makespan). Reads the bench; runs nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ..analyzers.whatif import Changes, sweep
from ..analyzers.whatif.scaling import fit, usable
from ..dashboards import bench_results
from ..probes.rundir import RunDir
from ..tracer.commands.whatif_verb import TABLES


def tables(run: RunDir) -> dict:
    return {name: run.table(name, missing_ok=True, columns=cols) for name, cols in TABLES.items()}


def makespan_s(run: RunDir) -> float:
    """The run's jobs' span, as the model's measured_s."""
    jobs = run.table("jobs")
    return float(jobs.end_ns.max() - jobs.start_ns.min()) / 1e9


def rows(bench: Path, fit_counts: list[int], sources: list[int], samples: int) -> list[dict]:
    results = usable(bench_results.load(bench))
    f = fit(results[results.workers.isin(fit_counts)], source=f"{bench} at {fit_counts}")
    held = results[~results.workers.isin(fit_counts)]
    out = []
    for source in sources:
        src = RunDir(results[results.workers == source].run_dir.iloc[0])
        preds = sweep(tables(src), src.meta(), [Changes(workers=int(w)) for w in held.workers], samples, f)
        for p, (_, h) in zip(preds, held.iterrows()):
            out.append({"from": source, "to": int(h.workers), "predicted_s": p["makespan_s"], "lo_s": p["interval_s"][0],
                        "hi_s": p["interval_s"][1], "measured_s": makespan_s(RunDir(h.run_dir)),
                        "cpu_predicted_s": p["scheduler_cpu_s"], "cpu_measured_s": h.scheduler_cpu_s,
                        "ground": p["ground"]})
    return out


def report(df: pd.DataFrame) -> str:
    lines = ["| from workers | to workers | makespan predicted s (90%) | measured s | error | scheduler CPU predicted s "
             "| measured s | error | ground |", "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['from']} | {r.to} | {r.predicted_s:.2f} ({r.lo_s:.2f}-{r.hi_s:.2f}) | {r.measured_s:.2f} | "
              f"{r.predicted_s / r.measured_s - 1:+.0%} | {r.cpu_predicted_s:.2f} | {r.cpu_measured_s:.2f} | "
              f"{r.cpu_predicted_s / r.cpu_measured_s - 1:+.1%} | {r.ground} |" for _, r in df.iterrows()]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", help="a bench directory (results.csv)")
    p.add_argument("--fit", default="8,32,64", help="worker counts to fit on")
    p.add_argument("--source", default="8", help="worker counts whose runs predict the others")
    p.add_argument("--samples", type=int, default=3)
    args = p.parse_args()
    df = pd.DataFrame(rows(Path(args.bench), [int(x) for x in args.fit.split(",")],
                           [int(x) for x in args.source.split(",")], args.samples))
    print(report(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
