"""`daskprobe compare`: runs side by side by one dimension."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from . import options

HELP = "compare run directories by workers, scheduler, server or worker mode"
EXAMPLES = """examples:
  daskprobe compare runs/w1 runs/w2 runs/w4 --by workers   # AOT and scheduler CPU per task vs workers
  daskprobe compare runs/bench-x/*-r0 --by worker-mode --baseline normal   # how much is runtime overhead
  daskprobe compare runs/bench-x/merge-1K-* --by workers   # a bench's repeats, traced or not (--probes none)
"""


def add_arguments(p) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directories, each with a summary.json (daskprobe run, or each point of a bench: "
                        "untraced bench runs are compared by the makespan bench recorded)")
    p.add_argument("--by", default="workers", choices=["workers", "scheduler", "server", "worker-mode"],
                   help="the dimension compared: runs are grouped by its value, and runs that also differ in "
                        "another dimension are warned about (default workers)")
    p.add_argument("--baseline", help="the value of --by that speedups are relative to (default: the smallest)")
    p.add_argument("--out", help="where compare.html and the CSVs go (default runs/compare-<time>)")


def main(args, command: list[str]) -> int:
    from ...dashboards.compare import compare
    runs = [options.existing_run(d) for d in args.run_dirs]
    missing = [str(r.path) for r in runs if not (r / "summary.json").exists()]
    if missing:
        raise SystemExit(f"daskprobe: no summary.json in {', '.join(missing)}: run 'daskprobe report' on them")
    out = Path(args.out or f"runs/compare-{time.strftime('%Y%m%d-%H%M%S')}")
    table, notes = compare([str(r.path) for r in runs], args.by, out, args.baseline)
    if len(table):
        print(table.to_string(index=False))
    else:  # an empty table printed is pandas' "Empty DataFrame" dump, not an answer
        print(f"daskprobe: no speedups: no makespan with {args.by} = the baseline for any command", file=sys.stderr)
    for note in notes:
        print(f"daskprobe: note: {note}", file=sys.stderr)
    print(f"daskprobe: comparison in {out}/compare.html", file=sys.stderr)
    return 0
