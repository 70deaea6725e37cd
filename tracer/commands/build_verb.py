"""`daskprobe build`: decode a run directory's captures again: tables, trace, summary, report."""

from __future__ import annotations

from . import options

HELP = "decode a run directory's captures into tables, a trace, summary.json and report.html"
EXAMPLES = """examples:
  daskprobe build runs/20261121-231500-python-my_flow.py   # re-decode captures into tables/ and trace.pftrace
  daskprobe build --no-trace runs/big-run                    # tables, summary.json and report.html only
"""


def add_arguments(p) -> None:
    options.run_dir(p)
    p.add_argument("--no-trace", action="store_true",
                   help="tables, summary and report.html only: the trace of a million-task run takes minutes")


def main(args, command: list[str]) -> int:
    from ..pipeline.build import finalize
    return 0 if finalize(options.existing_run(args.run_dir), trace=not args.no_trace) else 1
