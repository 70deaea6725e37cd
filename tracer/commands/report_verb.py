"""`daskprobe report`: the analysis again (summary.json, the terminal summary), optionally report.html."""

from __future__ import annotations

from pathlib import Path

from . import options

HELP = "summarize a run directory: makespan, jobs, where the time went, overhead per task"
EXAMPLES = """examples:
  daskprobe report runs/20261121-231500-python-my_flow.py          # print the summary, write summary.json
  daskprobe report --html runs/20261121-231500-python-my_flow.py   # and report.html
  daskprobe report --rules my_rules.toml runs/20261121-231500-python-my_flow.py
"""


def add_arguments(p) -> None:
    options.run_dir(p)
    p.add_argument("--html", action="store_true", help="also rewrite report.html")
    options.rules(p)


def main(args, command: list[str]) -> int:
    from ..pipeline.build import report
    from ..capture.say import say
    run = options.existing_run(args.run_dir)
    if not run.has_table("messages"):
        raise SystemExit(f"daskprobe: {run.path} has no tables yet: run 'daskprobe build {run.path}' first")
    if not report(run, [Path(r) for r in args.rules], html=args.html):
        return 1
    say(f"wrote {run / 'summary.json'}" + (f" and {run / 'report.html'}" if args.html else ""))
    return 0
