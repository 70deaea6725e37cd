"""`daskprobe open`: serve a run's trace for the Perfetto UI."""

from __future__ import annotations

from . import options

HELP = "serve a run's trace for the Perfetto UI and print the link that loads it"
EXAMPLES = """examples:
  daskprobe open runs/20261121-231500-python-my_flow.py   # serve trace.pftrace, print the ui.perfetto.dev link
"""


def add_arguments(p) -> None:
    options.run_dir(p)
    p.add_argument("--port", type=int, default=9001,
                   help="port on 127.0.0.1 (default 9001: the only one the hosted UI fetches from)")
    p.add_argument("--once", action="store_true", help="exit after the trace has been fetched once")


def main(args, command: list[str]) -> int:
    from ...dashboards.open_trace import serve
    run = options.existing_run(args.run_dir)
    if not run.trace.exists():
        raise SystemExit(f"daskprobe: {run.path} has no trace.pftrace: run 'daskprobe build {run.path}' first")
    return serve(run.trace, args.port, args.once)
