"""`daskprobe whatif` against real runs: run B predicted from run A, on this machine.

    python -m daskprobe.experiments.whatif_validation [--out DIR] [--workloads merge_slow,tree,etl]

Each workload runs once per configuration (CONFIGS), at nice 10; each pair (PAIRS) predicts B's
makespan from A's tables with B's settings as the change. A run already in DIR is reused. Prints
a markdown table and its summary (median and 90th percentile of |error|, and the unchanged
replays' errors), and writes DIR/pairs.csv. The pair w2 -> w2again (the same settings run twice)
is the machine's own noise: no prediction can beat it; it is left out of the summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ..analyzers.whatif import Changes, sweep
from ..probes.rundir import RunDir
from ..tracer.commands.whatif_verb import TABLES

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"w1": {"workers": 1, "threads": 1}, "w2": {"workers": 2, "threads": 1}, "w4": {"workers": 4, "threads": 1},
           "w1t2": {"workers": 1, "threads": 2}, "w2d5": {"workers": 2, "threads": 1, "delay_ms": 5.0},
           "w2r": {"workers": 2, "threads": 1, "scheduler": "random"},
           "w2again": {"workers": 2, "threads": 1}}  # w2 once more: how far a run is from its own repeat
PAIRS = [("w2", "w2again"), ("w2", "w1"), ("w1", "w2"), ("w2", "w4"), ("w4", "w2"), ("w2", "w2d5"), ("w2d5", "w2"), ("w2", "w2r"),
         ("w2r", "w2"), ("w1", "w1t2"), ("w1t2", "w1")]
WORKLOADS = {
    "merge_slow": ["-m", "daskprobe.tracer.bench.workloads", "merge_slow-100-0.02"],
    "tree": ["-m", "daskprobe.tracer.bench.workloads", "tree-9"],
    "numpy": ["-m", "daskprobe.tracer.bench.workloads", "numpy-2K-500"],
    "etl": ["/work/shared/workflows/etl_flow.py"],
    "stragglers": [str(ROOT / "experiments/diagnosis_flows/stragglers.py")],
    "transfers": [str(ROOT / "experiments/diagnosis_flows/transfers.py")],
}


def run(out: Path, workload: str, config: str) -> RunDir | None:
    """The run of a workload in a configuration: made (at nice 10) unless DIR has it."""
    d = out / f"{workload}-{config}"
    if (d / "tables" / "tasks.parquet").exists():
        return RunDir(d)
    c = CONFIGS[config]
    args = ["nice", "-n", "10", sys.executable, "-m", "daskprobe.tracer.commands", "run", "--no-trace", "--out", str(d),
            "--workers", str(c["workers"]), "--threads", str(c["threads"]),
            "--delay-ms", str(c.get("delay_ms", 0)), "--scheduler", c.get("scheduler", "ws"),
            "--", sys.executable, *WORKLOADS[workload]]
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if p.returncode or not (d / "tables" / "tasks.parquet").exists():
        print(f"{workload}-{config}: run failed ({p.returncode}): {p.stderr[-500:]}", file=sys.stderr)
        return None
    return RunDir(d)


def tables(r: RunDir) -> dict:
    return {name: r.table(name, missing_ok=True, columns=cols) for name, cols in TABLES.items()}


def measured(r: RunDir) -> float:
    jobs = r.table("jobs")
    return float(jobs.end_ns.max() - jobs.start_ns.min()) / 1e9


def change(config: str) -> Changes:
    c = CONFIGS[config]
    return Changes(workers=c["workers"], threads=c["threads"], delay_ms=c.get("delay_ms", 0.0),
                   scheduler=c.get("scheduler", "ws"))


def pairs(out: Path, workloads: list[str], samples: int) -> pd.DataFrame:
    rows = []
    for w in workloads:
        runs = {c: run(out, w, c) for c in CONFIGS}
        for a, b in PAIRS:
            if runs[a] is None or runs[b] is None:
                continue
            p = sweep(tables(runs[a]), runs[a].meta(), [change(b)], samples)[0]
            real = measured(runs[b])
            rows.append({"workload": w, "from": a, "to": b, "measured_a_s": p["measured_s"], "measured_b_s": real,
                         "predicted_s": p["makespan_s"], "lo_s": p["interval_s"][0], "hi_s": p["interval_s"][1],
                         "scaled_s": p["scaled_s"], "offset_s": p["offset_s"], "replay_error_a": p["replay_error"]})
            print(json.dumps(rows[-1]), flush=True)
    return pd.DataFrame(rows)


def report(df: pd.DataFrame) -> str:
    noise = df[df.to == "w2again"]
    df = df[df.to != "w2again"]
    df = df.assign(error=df.predicted_s / df.measured_b_s - 1, scaled_error=df.scaled_s / df.measured_b_s - 1,
                   offset_error=df.offset_s / df.measured_b_s - 1,
                   inside=(df.lo_s <= df.measured_b_s) & (df.measured_b_s <= df.hi_s))
    lines = ["| workload | A | B | A measured s | B measured s | B predicted s | 90% interval | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r.workload} | {r['from']} | {r.to} | {r.measured_a_s:.3f} | {r.measured_b_s:.3f} | "
              f"{r.predicted_s:.3f} | {r.lo_s:.3f}-{r.hi_s:.3f} | {r.error:+.1%} |" for _, r in df.iterrows()]
    replay = df.drop_duplicates(["workload", "from"]).replay_error_a.abs()
    lines += ["", f"pairs: {len(df)}; |error| median {_q(df.error, 50)}, p90 {_q(df.error, 90)}; "
              f"B inside the 90% interval: {int(df.inside.sum())} of {len(df)}",
              f"scaled by measured / unchanged replay: |error| median {_q(df.scaled_error, 50)}, p90 "
              f"{_q(df.scaled_error, 90)}; shifted by their difference: median {_q(df.offset_error, 50)}, p90 "
              f"{_q(df.offset_error, 90)}",
              f"replay of the unchanged run A, over {len(replay)} runs: |error| median "
              f"{_q(replay, 50)}, max {replay.max():.1%}",
              "the same settings run twice (w2 again): " + ", ".join(
                  f"{r.workload} {r.measured_b_s / r.measured_a_s - 1:+.1%}" for _, r in noise.iterrows())]
    return "\n".join(lines)


def _q(x: pd.Series, q: float) -> str:
    return f"{np.percentile(x.abs(), q):.1%}" if len(x) else "-"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/whatif-validation")
    p.add_argument("--workloads", default="merge_slow,tree,etl")
    p.add_argument("--samples", type=int, default=10)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df = pairs(out, args.workloads.split(","), args.samples)
    df.to_csv(out / "pairs.csv", index=False)
    print(report(df))
    return 0


if __name__ == "__main__":
    sys.exit(main())
