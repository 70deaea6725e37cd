"""Benchmark: what each sampling rate buys. The error of the critical-path split at lower rates.

    python -m daskprobe.experiments.sample_rate                         # runs merge-1K and tree-12, 3 each
    python -m daskprobe.experiments.sample_rate --runs runs/finalize-latency/*   # runs you have (100 Hz)

A run taken at the default rates (Python sampler 100 Hz, eBPF CPU sampler 99 Hz) is
analysed again with its samples thinned to every k-th read (k = 2: 50 Hz, k = 5: 20 Hz),
once per phase (k thinned copies that share no sample). Only the samples are thinned:
eBPF's thread states are exact at any rate. For each category, the share of the session
the thinned analysis gives is compared with the full-rate one:

    error     thinned share - full-rate share, in percentage points of the session
    covered   the full-rate seconds lie within the thinned analysis's own 90% interval

Reported per rate: the median and 90th percentile of |error| over runs x phases x categories
that rest on samples, the largest, and how often the claimed interval covered the full-rate
value (about 90% expected, since the full-rate value has a sampling error of its own too).
At the full rate, the analysis's own interval half-width is reported. Writes errors.csv and
rates.csv in --out.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from ..analyzers.summary import INPUTS, analyze
from ..probes.rundir import RunDir

THIN = {50: 2, 20: 5}  # nominal Python-sampler rate -> keep every k-th read


def thinned(samples: pd.DataFrame, k: int, phase: int) -> pd.DataFrame:
    """Every k-th read of each process (Python sampler) and of each CPU (eBPF), from `phase`."""
    py = samples[samples.source == "pyspy"]
    reads = py[["pid", "t_ns"]].drop_duplicates().sort_values(["pid", "t_ns"])
    keep = reads[reads.groupby("pid").cumcount() % k == phase]
    py = py.merge(keep, on=["pid", "t_ns"])
    if "period_ns" in py:  # a tick kept stands for the k ticks of its CPU it was one of
        py["period_ns"] = py.period_ns * k
    cpu = samples[samples.source == "ebpf"].sort_values("t_ns")
    cpu = cpu[cpu.groupby(cpu.cpu.fillna(-1)).cumcount() % k == phase]
    return pd.concat([py, cpu], ignore_index=True).sort_values("t_ns", ignore_index=True)


def shares(tables: dict, meta: dict) -> pd.DataFrame:
    """Per category: seconds, the 90% interval, the samples behind it, and the share of the session."""
    s = analyze(tables, meta).summary
    if "error" in s:
        raise RuntimeError(s["error"])
    rows = [{"category": c, "seconds": v, "lo": s["critical_path_interval_s"][c]["lo"],
             "hi": s["critical_path_interval_s"][c]["hi"], "samples": s["critical_path_interval_s"][c]["samples"]}
            for c, v in s["critical_path_s"].items()]
    return pd.DataFrame(rows).assign(share=lambda d: d.seconds / s["session_s"], session_s=s["session_s"])


def one_run(path: Path) -> pd.DataFrame:
    run = RunDir(path)
    tables = {name: run.table(name, missing_ok=True) for name in INPUTS}
    meta = run.meta()
    full = shares(tables, meta).assign(rate=meta.sample_rate, phase=0)
    out = [full]
    for rate, k in THIN.items():
        m = meta | {"sample_rate": meta.sample_rate / k, "cpu_hz": meta.cpu_hz / k}
        for phase in range(k):
            t = tables | {"samples": thinned(tables["samples"], k, phase)}
            out.append(shares(t, m).assign(rate=rate, phase=phase))
    d = pd.concat(out, ignore_index=True).assign(run=path.name)
    ref = full.set_index("category")
    d["error_pp"] = 100 * (d.share - d.category.map(ref.share))
    d["covered"] = (d.lo <= d.category.map(ref.seconds)) & (d.category.map(ref.seconds) <= d.hi)
    return d


def summarize(d: pd.DataFrame) -> pd.DataFrame:
    sampled = d[d.samples.notna() & (d.samples > 0)]
    rows = []
    for rate, g in sampled.groupby("rate", sort=False):
        err = g.error_pp.abs()
        half = 100 * (g.hi - g.lo) / 2 / g.session_s
        rows.append({"rate_hz": rate, "estimates": len(g), "median_abs_error_pp": err.median() if rate != 100 else 0.0,
                     "p90_abs_error_pp": err.quantile(0.9) if rate != 100 else 0.0, "max_abs_error_pp": err.max(),
                     "median_interval_half_pp": half.median(),
                     "covered": g.covered.mean() if rate != 100 else np.nan})
    return pd.DataFrame(rows)


def _take_runs(graphs: list[str], repeat: int, out: Path) -> list[Path]:
    runs = []
    for r in range(repeat):
        for g in graphs:
            path = out / f"{g}-r{r}-{time.strftime('%H%M%S')}"
            cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "2", "--no-trace",
                   "--out", str(path), "--", sys.executable, "-m", "daskprobe.tracer.bench.workloads", g]
            subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
            runs.append(path)
    return runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="*", help="run directories taken at the default rates (else new runs)")
    p.add_argument("--graphs", default="merge-1K,tree-12")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="runs/sample-rate")
    args = p.parse_args(argv)
    out, console = Path(args.out), Console()
    out.mkdir(parents=True, exist_ok=True)
    runs = [Path(r) for r in args.runs] if args.runs else _take_runs(args.graphs.split(","), args.repeat, out)
    with console.status("analysing each run at 100, 50 and 20 Hz"):
        d = pd.concat([one_run(r) for r in runs], ignore_index=True)
    d.to_csv(out / "errors.csv", index=False)
    s = summarize(d)
    s.to_csv(out / "rates.csv", index=False)
    table = Table(title=f"critical-path shares at lower sampling rates ({len(runs)} runs; pp: percentage "
                        "points of the session)")
    for c in ("rate (Hz)", "estimates", "median |error|, pp", "p90 |error|, pp", "max |error|, pp",
              "own 90% half-width, pp", "interval covered the 100 Hz value"):
        table.add_column(c)
    for r in s.itertuples(index=False):
        table.add_row(*[f"{v:.3g}" if isinstance(v, float) else str(v) for v in r])
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
