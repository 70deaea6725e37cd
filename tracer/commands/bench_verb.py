"""`daskprobe bench`: sweep graphs x workers x scheduler x worker mode x server (see tracer/bench/sweep.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from . import options
from .. import variants

HELP = ("sweep graphs x workers x scheduler x worker mode, --repeat runs of each (default 3), into "
        "results.csv/.parquet and bench.html")
EXAMPLES = """examples:
  daskprobe bench --graphs merge-10K,tree-15 --workers 1,2,4,8 --scheduler ws,random --worker normal,zero --repeat 3
  daskprobe bench --graphs merge-1K,merge-5K,merge-20K --workers 2 --worker zero --probes none --out runs/aot
  daskprobe bench --graphs merge-10K --probes all --out runs/traced   # with the critical-path split per run
  daskprobe bench --graphs merge-2K --workers 8,64,256,512 --workers-per-process 128 --worker zero \
      --probes proxy,pyspy,proc --repeat 1   # the scheduler's CPU per task, per message and by op
  (the same command again resumes: runs already in DIR/results.csv are skipped)
"""


def add_arguments(p) -> None:
    p.add_argument("--graphs", required=True, type=options.comma_list,
                   help="comma-separated graph names: merge-N, merge_slow-N-T, tree-N, numpy-N-P, groupby-D-F-P, "
                        "join-D-F-P, bag-N-P, xarray-N (see README)")
    p.add_argument("--workers", type=options.bounded_list(*options.WORKERS), default=[2],
                   help=f"comma-separated worker counts, each {options.span(options.WORKERS)} (default 2)")
    p.add_argument("--workers-per-process", type=options.bounded(int, 1, 1024), default=1, metavar="K",
                   help="K workers share each process (run --workers-per-process; with --worker zero: hundreds "
                        "of workers before one scheduler, docs/scaling.md) (default 1)")
    p.add_argument("--scheduler", type=options.comma_list, default=["ws"], help="ws, random or both (default ws)")
    p.add_argument("--worker", type=options.comma_list, default=["normal"], help="normal, zero or both (default normal)")
    p.add_argument("--server", action="append", default=[], metavar="dask|CMD",
                   help="'dask' or a scheduler command with {host} and {port}; repeatable (default dask)")
    p.add_argument("--repeat", type=options.bounded(*options.REPEAT), default=3, help=f"runs per point, {options.span(options.REPEAT)} (default 3)")
    options.probes(p, "none")
    p.add_argument("--timeout", type=options.bounded(*options.RUN_TIMEOUT_S), default=300.0,
                   help=f"seconds per run before it is stopped, {options.span(options.RUN_TIMEOUT_S)} (default 300)")
    options.cluster(p, threads=1)  # as in the paper's runs
    p.add_argument("--out", help="directory for the runs and results (default runs/bench-<time>)")


def main(args, command: list[str]) -> int:
    from ...dashboards.bench_report import write_bench_report
    from ..bench.sweep import bench, plan
    from ..bench.workloads import check_name

    for graph in args.graphs:
        try:
            check_name(graph)  # a typo must fail now, not after an hour of other runs
        except ValueError as e:
            raise SystemExit(f"daskprobe: {e}")
    _choices("--scheduler", args.scheduler, variants.SCHEDULERS)
    _choices("--worker", args.worker, variants.WORKERS)
    options.parse_probes(args.probes)
    options.parse_config(args.config)
    if args.scheduler_cpu is not None:
        from ..capture.cluster import check_scheduler_cpu
        try:
            check_scheduler_cpu(args.scheduler_cpu)  # now, not as every point's failure
        except ValueError as e:
            raise SystemExit(f"daskprobe: {e}")
    points = plan(args.graphs, args.workers, args.scheduler, args.worker, args.server or ["dask"], args.repeat)
    out = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    extra = ["--threads", str(args.threads), *[a for c in args.config for a in ("--config", c)],
             *(["--scheduler-cpu", str(args.scheduler_cpu)] if args.scheduler_cpu is not None else [])]
    results = bench(points, out, args.probes, args.timeout, args.python, extra, args.workers_per_process)
    table = write_bench_report(results, out)
    if len(table):
        print(table.to_string(index=False))
    failed = int((results.status != "ok").sum())
    print(f"daskprobe: {len(results)} runs ({failed} not ok) in {out}/results.csv; figures in {out}/bench.html",
          file=sys.stderr)
    return 0 if failed == 0 else 1


def _choices(flag: str, values: list[str], known) -> None:
    bad = sorted(set(values) - set(known))
    if bad:
        raise SystemExit(f"daskprobe: {flag} {','.join(bad)}: not one of {', '.join(known)}")
