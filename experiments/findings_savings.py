"""What the findings' advice would save, against ground truth: the diagnosis benchmark's twins.

    python -m daskprobe.experiments.findings_savings DIAGNOSIS_RUNS --out DIR

DIAGNOSIS_RUNS holds a diagnosis benchmark's runs (experiments/diagnosis.py: FLOW-planted-rK and
FLOW-twin-rK). Each planted run is copied to DIR and analysed again with this code; its first
finding's predicted saving (summary.json `findings[0].saving`) is set against what fixing the cause
saved: the planted makespan less its twin's. Prints the markdown table of docs/whatif.md and the
median and 90th percentile of |error| as a share of the planted makespan; writes DIR/savings.csv.
Runs no cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from ..analyzers import summary_json
from ..probes.rundir import RunDir
from ..tracer.pipeline.build import report


def savings(runs: Path, out: Path) -> pd.DataFrame:
    rows = []
    for planted in sorted(runs.glob("*-planted-r*")):
        flow, repeat = re.fullmatch(r"(.+)-planted-r(\d+)", planted.name).groups()
        twin = runs / f"{flow}-twin-r{repeat}"
        if not twin.exists():
            continue
        copy = out / planted.name
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(planted, copy)
        with contextlib.redirect_stdout(io.StringIO()):
            report(RunDir(copy))
        rows.append(_row(flow, summary_json.read(RunDir(copy)), summary_json.read(RunDir(twin))))
    return pd.DataFrame(rows)


def _row(flow: str, planted, twin) -> dict:
    first = (planted.get("findings") or [{}])[0]
    s = first.get("saving") or {}
    measured = planted["makespan_s"] - twin["makespan_s"]
    row = {"flow": flow, "first": first.get("id"), "change": s.get("change") or s.get("not_modelled"),
           "predicted_s": s.get("saving_s"), "measured_s": measured, "makespan_s": planted["makespan_s"]}
    if s.get("saving_s") is not None:
        lo, hi = s["interval_s"]
        row |= {"lo_s": s["measured_s"] - hi, "hi_s": s["measured_s"] - lo,
                "error": (s["saving_s"] - measured) / planted["makespan_s"]}
    return row


def table(df: pd.DataFrame) -> str:
    lines = ["| flow | first finding | the change replayed | predicted saving s (90% interval) | measured saving s "
             "| error s | error, % of the makespan |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in df.itertuples():
        if pd.isna(r.predicted_s):
            lines.append(f"| {r.flow} | `{r.first}` | not modelled: {r.change} | - | {r.measured_s:.2f} | - | - |")
        else:
            lines.append(f"| {r.flow} | `{r.first}` | {r.change} | {r.predicted_s:.2f} ({r.lo_s:.2f}-{r.hi_s:.2f}) | "
                         f"{r.measured_s:.2f} | {r.predicted_s - r.measured_s:+.2f} | {r.error:+.0%} |")
    e = df.error.dropna().abs() if "error" in df else pd.Series(dtype=float)
    lines += ["", f"{len(e)} of {len(df)} first findings have a number; |error| as a share of the planted makespan: "
              + (f"median {np.median(e):.0%}, 90th percentile {np.percentile(e, 90):.0%}" if len(e) else "none")]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="a diagnosis benchmark's runs (FLOW-planted-rK, FLOW-twin-rK)")
    ap.add_argument("--out", type=Path, required=True, help="where the planted runs are copied and analysed")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    df = savings(args.runs, args.out)
    df.to_csv(args.out / "savings.csv", index=False)
    print(table(df))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
