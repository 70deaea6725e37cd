"""Benchmark: how long analysing a large run takes, and how much memory.

    python -m daskprobe.experiments.analysis_scale --tasks 1M            # the issue's target: 60 s, 4 GB
    python -m daskprobe.experiments.analysis_scale --tasks 100K,1M --trace

For each size, a synthetic run directory (experiments/synthetic.py) is made
once, then `daskprobe build --no-trace` (decode into tables, summary.json,
report.html) runs in a fresh process, --repeat times; reported are the median
wall time (and the fastest and slowest), the median time of each stage (from
run.json's finalize_seconds), the largest peak RSS of that process, and the
size of report.html. With
--trace, the trace stage is timed too (separately: it is not analysis).
With --browser, headless Chromium opens report.html: the figures drawn are
counted, and the page's load-and-draw time is the wall time of Chromium on it
less that on an empty page, in 3 alternating pairs (median and largest).
Targets at 100K tasks: report.html under 20 MB, drawn in under 5 s. Prints a
table; writes results.csv in --out.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from ..dashboards import browser
from ..probes.rundir import RunDir
from .synthetic import write_run
from ..tracer.bench.workloads import count


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="1M", help="comma-separated leaf-task counts (default 1M)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--trace", action="store_true", help="also time the trace stage")
    p.add_argument("--browser", action="store_true", help="open report.html in headless Chromium")
    p.add_argument("--out", default="runs/analysis-scale")
    args = p.parse_args(argv)
    out, console, rows = Path(args.out), Console(), []
    for size in args.tasks.split(","):
        run = out / f"synthetic-{size}"
        if not (run / "run.json").exists():
            console.log(f"writing a synthetic run of {size} leaf tasks to {run}")
            write_run(run, count(size), args.workers)
        build = [sys.executable, "-m", "daskprobe.tracer.commands", "build", "--no-trace", str(run)]
        runs, stages = [], []
        for _ in range(args.repeat):
            runs.append(_measured(build))
            stages.append(RunDir(run).meta()["finalize_seconds"])
        row = {"tasks": size, "build_s": statistics.median(r[0] for r in runs),
               "min_s": min(r[0] for r in runs), "max_s": max(r[0] for r in runs),
               "peak_rss_gb": max(r[1] for r in runs) / 1e9,
               "report_mb": (run / "report.html").stat().st_size / 1e6}
        row |= {f"{stage}_s": statistics.median(s[stage] for s in stages) for stage in stages[0]}
        if args.trace:
            row["trace_s"] = _measured([sys.executable, "-c", "import sys; from daskprobe.tracer import trace_writer;"
                                        " from daskprobe.probes.rundir import RunDir;"
                                        " trace_writer.write(RunDir(sys.argv[1]))", str(run)])[0]
        if args.browser:
            row |= _drawn(run / "report.html", out)
        rows.append(row)
        console.log(row)
    df = pd.DataFrame(rows)
    df.to_csv(out / "results.csv", index=False)
    table = Table(title="analysis time and memory (daskprobe build --no-trace; median wall, max peak RSS)")
    for col in df.columns:
        table.add_column(col, overflow="fold")
    for r in df.itertuples(index=False):
        table.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r))
    console.print(table)
    return 0


def _drawn(page: Path, out: Path) -> dict:
    """Figures drawn, errors, and the seconds Chromium spends on the page over an empty one."""
    if not browser.available():
        return {"browser": "no chromium"}
    blank = out / "blank.html"
    blank.write_text("<!doctype html><html><body></body></html>")
    extra, body = [], ""
    for _ in range(3):
        start = time.perf_counter()
        body = browser.body(page, out / "profile")
        mid = time.perf_counter()
        browser.body(blank, out / "profile")
        extra.append((mid - start) - (time.perf_counter() - mid))
    figures = re.search(r'data-figures="(\d+)"', body)
    return {"figures_drawn": int(figures.group(1)) if figures else 0, "js_errors": "data-errors" in body,
            "draw_s": statistics.median(extra), "draw_max_s": max(extra)}


def _measured(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and the child's own peak RSS in bytes (os.wait4 reports it per child)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.read().decode(errors='replace')[-2000:]}")
    return wall, usage.ru_maxrss * 1024


if __name__ == "__main__":
    raise SystemExit(main())
