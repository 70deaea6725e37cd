"""The `daskprobe` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXAMPLES = {
    "run": """examples:
  daskprobe run                                   # built-in demo on 2 workers
  daskprobe run --workers 2 --threads 1 -- python my_flow.py
  daskprobe run --workers 4 --config distributed.scheduler.worker-saturation=inf -- python my_flow.py
  daskprobe run --probes none -- python my_flow.py          # same cluster, no capture (baseline)
  daskprobe run --server-cmd 'rsds-scheduler --port {port}' --python /path/to/old-env/bin/python -- python flow.py
""",
    "report": """examples:
  daskprobe report runs/20261121-231500-python-my_flow.py   # print the summary, write summary.json
  daskprobe report --html runs/20261121-231500-python-my_flow.py   # and report.html
""",
    "doctor": """examples:
  daskprobe doctor                 # which probes can run here, and why not
""",
    "open": """examples:
  daskprobe open runs/20261121-231500-python-my_flow.py   # serve trace.pftrace, print the ui.perfetto.dev link
""",
    "compare": """examples:
  daskprobe compare runs/w1 runs/w2 runs/w4 --by workers   # AOT and scheduler CPU per task vs workers
  daskprobe compare runs/bench-x/*-r0 --by worker-mode --baseline normal   # how much is runtime overhead
""",
    "bench": """examples:
  daskprobe bench --graphs merge-10K,tree-15 --workers 1,2,4,8 --scheduler ws,random --worker normal,zero --repeat 3
  daskprobe bench --graphs merge-1K,merge-5K,merge-20K --workers 2 --worker zero --probes none --out runs/aot
  daskprobe bench --graphs merge-10K --probes all --out runs/traced   # with the critical-path split per run
  (the same command again resumes: runs already in DIR/results.csv are skipped)
""",
    "build": """examples:
  daskprobe build runs/20261121-231500-python-my_flow.py   # re-decode captures into tables/ and trace.pftrace
  daskprobe build --no-trace runs/big-run                    # tables, summary.json and report.html only
""",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="daskprobe", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Trace and profile Dask clusters: every protocol message, on one clock.",
        epilog="\n".join(EXAMPLES.values()))
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="start a cluster behind the probes and run a command against it",
                       epilog=EXAMPLES["run"], formatter_class=argparse.RawDescriptionHelpFormatter,
                       usage="daskprobe run [options] [-- COMMAND ...]")
    r.add_argument("--workers", type=int, default=2, help="number of worker processes (default 2)")
    r.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    r.add_argument("--nanny", action=argparse.BooleanOptionalAction, default=False,
                   help="start workers under a nanny (default: no nanny)")
    r.add_argument("--python", default=sys.executable,
                   help="interpreter that runs the scheduler and workers (default: this one)")
    r.add_argument("--server-cmd", help="scheduler command instead of dask's, with {host} and {port} placeholders")
    r.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="Dask config for every process (and the command), e.g. "
                        "distributed.scheduler.worker-saturation=inf; repeatable")
    r.add_argument("--probes", default="all",
                   help="comma-separated probes: proxy, pyspy, proc, cpu, gil, offcpu, tcp; 'all' (default: "
                        "every probe, those this machine cannot run are skipped and recorded) or 'none' "
                        "for an untraced baseline")
    r.add_argument("--sample-rate", type=float, default=100.0, help="Python stack samples per second and process (default 100)")
    r.add_argument("--native", action="store_true", help="read Python stacks with py-spy, native frames too (pauses each process while it reads)")
    r.add_argument("--cpu-hz", type=int, default=99, help="eBPF CPU samples per second per CPU (default 99)")
    r.add_argument("--delay-ms", type=float, default=0.0,
                   help="what-if: the proxy holds every message this long before passing it on (default 0)")
    r.add_argument("--scheduler", default="ws", choices=["ws", "random"],
                   help="ws: Dask's own policy (default); random: each ready task to a uniformly random "
                        "worker, work stealing and queuing off (the paper's random scheduler, a preload)")
    r.add_argument("--worker", default="normal", choices=["normal", "zero"],
                   help="normal (default) or zero: every task completes at once with a placeholder "
                        "result, so only runtime overhead remains (the paper's zero worker, a preload)")
    r.add_argument("--out", help="run directory (default runs/<time>-<command>)")
    r.add_argument("--start-timeout", type=float, default=60.0, help="seconds for each process to start")

    rp = sub.add_parser("report", help="summarize a run directory: makespan, tasks, overhead per task",
                        epilog=EXAMPLES["report"], formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("run_dir")
    rp.add_argument("--html", action="store_true", help="also rewrite report.html")
    rp.add_argument("--rules", action="append", default=[], metavar="FILE",
                    help="extra function-to-category rules (TOML, see analyzers/rules/dask.toml); repeatable")

    sub.add_parser("doctor", help="say which probes can run on this machine, and why not",
                   epilog=EXAMPLES["doctor"], formatter_class=argparse.RawDescriptionHelpFormatter)

    o = sub.add_parser("open", help="serve a run's trace for the Perfetto UI and print the link that loads it",
                       epilog=EXAMPLES["open"], formatter_class=argparse.RawDescriptionHelpFormatter)
    o.add_argument("run_dir")
    o.add_argument("--port", type=int, default=9001,
                   help="port on 127.0.0.1 (default 9001: the only one the hosted UI fetches from)")
    o.add_argument("--once", action="store_true", help="exit after the trace has been fetched once")

    c = sub.add_parser("compare", help="compare run directories by workers, scheduler, server or worker mode",
                       epilog=EXAMPLES["compare"], formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("run_dirs", nargs="+")
    c.add_argument("--by", default="workers", choices=["workers", "scheduler", "server", "worker-mode"])
    c.add_argument("--baseline", help="the value of --by that speedups are relative to (default: the smallest)")
    c.add_argument("--out", help="where compare.html and the CSVs go (default runs/compare-<time>)")

    be = sub.add_parser("bench", help="sweep graphs x workers x scheduler x worker mode, one run each, "
                        "into results.csv/.parquet and bench.html", epilog=EXAMPLES["bench"],
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    be.add_argument("--graphs", required=True, type=_list,
                    help="comma-separated graph names: merge-N, merge_slow-N-T, tree-N, numpy-N-P, groupby-D-F-P, "
                         "join-D-F-P, bag-N-P, xarray-N (see README)")
    be.add_argument("--workers", type=_list, default=["2"], help="comma-separated worker counts (default 2)")
    be.add_argument("--scheduler", type=_list, default=["ws"], help="ws, random or both (default ws)")
    be.add_argument("--worker", type=_list, default=["normal"], help="normal, zero or both (default normal)")
    be.add_argument("--server", action="append", default=[], metavar="dask|CMD",
                    help="'dask' or a scheduler command with {host} and {port}; repeatable (default dask)")
    be.add_argument("--repeat", type=int, default=3, help="runs per point (default 3)")
    be.add_argument("--probes", default="none", help="as for run: none (default), proxy, all, or a list")
    be.add_argument("--timeout", type=float, default=300.0, help="seconds per run before it is stopped (default 300)")
    be.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    be.add_argument("--python", default=sys.executable, help="interpreter for the cluster and the workload")
    be.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="Dask config, as for run")
    be.add_argument("--out", help="directory for the runs and results (default runs/bench-<time>)")

    b = sub.add_parser("build", help="decode a run directory's captures into tables and a trace",
                       epilog=EXAMPLES["build"], formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("run_dir")
    b.add_argument("--no-trace", action="store_true",
                   help="tables, summary and report.html only: the trace of a million-task run takes minutes")
    return p


def _list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _probes(text: str) -> list[str]:
    from daskprobe.probes.registry import NAMES as PROBES
    if text == "all":
        return list(PROBES)
    if text == "none":
        return []
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = sorted(set(chosen) - set(PROBES))
    if unknown:
        raise SystemExit(f"daskprobe: unknown probe(s) {', '.join(unknown)}; known: {', '.join(PROBES)}")
    return chosen


def _config(pairs: list[str]) -> dict[str, str]:
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise SystemExit(f"daskprobe: --config wants KEY=VALUE, got {bad[0]!r}")
    return dict(p.split("=", 1) for p in pairs)


def cmd_run(args, command: list[str]) -> int:
    from daskprobe.probes import registry
    from daskprobe.tracer.build import finalize
    from daskprobe.tracer.session import default_command, run, say

    probes = _probes(args.probes)
    spec = _spec(args, probes)
    code, run_dir = run(spec, command or default_command(), args.out, probes,
                        registry.make(probes, args.sample_rate, args.native, args.cpu_hz),
                        sample_rate=args.sample_rate, cpu_hz=args.cpu_hz)
    finalize(run_dir)
    say(f"run directory: {run_dir.path}")
    return code


def _spec(args, probes: list[str]):
    from daskprobe.tracer.cluster import ClusterSpec
    try:
        return ClusterSpec(workers=args.workers, threads=args.threads, nanny=args.nanny, python=args.python,
                           server_cmd=args.server_cmd, config=_config(args.config), proxy="proxy" in probes,
                           proxy_delay_us=round(args.delay_ms * 1000), start_timeout=args.start_timeout,
                           scheduler=args.scheduler, worker=args.worker)
    except ValueError as e:
        raise SystemExit(f"daskprobe: {e}")


def _run_dir(path: str):
    from daskprobe.tracer.rundir import RunDir
    run = RunDir(path)
    if not (run / "run.json").exists():
        raise SystemExit(f"daskprobe: {run.path} is not a run directory (no run.json)")
    return run


def cmd_build(args) -> int:
    from daskprobe.tracer.build import finalize
    return 0 if finalize(_run_dir(args.run_dir), trace=not args.no_trace) else 1


def cmd_report(args) -> int:
    from daskprobe.tracer.build import report
    run = _run_dir(args.run_dir)
    if not run.has_table("messages"):
        raise SystemExit(f"daskprobe: {run.path} has no tables yet: run 'daskprobe build {run.path}' first")
    return 0 if report(run, [Path(r) for r in args.rules], html=args.html) else 1


def cmd_open(args) -> int:
    from daskprobe.dashboards.open_trace import serve
    run = _run_dir(args.run_dir)
    if not run.trace.exists():
        raise SystemExit(f"daskprobe: {run.path} has no trace.pftrace: run 'daskprobe build {run.path}' first")
    return serve(run.trace, args.port, args.once)


def cmd_compare(args) -> int:
    import time
    from daskprobe.dashboards.compare import compare
    runs = [_run_dir(d) for d in args.run_dirs]
    missing = [str(r.path) for r in runs if not (r / "summary.json").exists()]
    if missing:
        raise SystemExit(f"daskprobe: no summary.json in {', '.join(missing)}: run 'daskprobe report' on them")
    out = Path(args.out or f"runs/compare-{time.strftime('%Y%m%d-%H%M%S')}")
    table = compare([str(r.path) for r in runs], args.by, out, args.baseline)
    print(table.to_string(index=False))
    print(f"daskprobe: comparison in {out}/compare.html", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    import time
    from daskprobe.dashboards.bench_report import write_bench_report
    from daskprobe.experiments.bench import bench, plan
    from daskprobe.experiments.workloads import check_name
    from daskprobe.tracer.cluster import SCHEDULERS, WORKER_MODES

    for graph in args.graphs:
        try:
            check_name(graph)  # a typo must fail now, not after an hour of other runs
        except ValueError as e:
            raise SystemExit(f"daskprobe: {e}")
    _choices("--scheduler", args.scheduler, SCHEDULERS)
    _choices("--worker", args.worker, WORKER_MODES)
    _probes(args.probes)
    _config(args.config)
    workers = [int(w) for w in args.workers]
    points = plan(args.graphs, workers, args.scheduler, args.worker, args.server or ["dask"], args.repeat)
    out = Path(args.out or f"runs/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    extra = ["--threads", str(args.threads), *[a for c in args.config for a in ("--config", c)]]
    results = bench(points, out, args.probes, args.timeout, args.python, extra)
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


def cmd_doctor(args) -> int:
    from daskprobe.probes.registry import doctor
    from rich.console import Console
    from rich.table import Table
    table = Table(title="daskprobe doctor: probes on this machine")
    for col in ("probe", "status", "what it captures"):
        table.add_column(col, overflow="fold")
    for name, problem, what in doctor():
        table.add_row(name, "[green]ok[/]" if problem is None else f"[red]no[/]: {problem}", what)
    Console().print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    args = _parser().parse_args(argv)
    commands = {"run": lambda a: cmd_run(a, command), "build": cmd_build, "report": cmd_report,
                "doctor": cmd_doctor, "open": cmd_open, "compare": cmd_compare, "bench": cmd_bench}
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
