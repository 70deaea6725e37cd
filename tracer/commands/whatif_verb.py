"""`daskprobe whatif`: the run's makespan predicted under other settings (analyzers/whatif)."""

from __future__ import annotations

import argparse
import itertools
import json

from . import options

HELP = "predict a run's makespan with other workers, threads, links, scheduler costs or policy"
EXAMPLES = """examples:
  daskprobe whatif runs/x --workers 4                    # the same jobs on 4 workers
  daskprobe whatif runs/x --workers 1,2,4,8 --threads 1  # a sweep: one row per combination
  daskprobe whatif runs/x --delay-ms 5 --network x2      # 5 ms links, wire times doubled
  daskprobe whatif runs/x --decisions 0 --bookkeeping x0.5 --gil 0 --json
  daskprobe whatif runs/x --scheduler random
  daskprobe whatif runs/x --findings                     # what each finding's advice would save
  daskprobe whatif runs/x --workers 64,256,1024 --scaling runs/bench  # the scheduler's costs as a bench's grow
what it models and how well: docs/whatif.md
"""
TABLES = {"tasks": None, "jobs": None, "graphs": None, "processes": None, "attempts": None,
          "messages": ["msg_id", "src", "src_role", "dst", "dst_role", "op", "key", "t_first_ns", "t_last_ns",
                       "msg_bytes", "reply_to"],
          "attempt_threads": None, "thread_states": None, "proc": None, "attribution": None,
          "cpu_samples": ["t_ns", "process", "on_cpu", "owns_gil", "category", "weight_s"]}
FACTOR = "0 (none of it), or xK: K times the run's (x0.5, x2)"


def factor(text: str) -> float:
    """0, xK or K: a factor on what the run measured."""
    return float(options.bounded(float, 0, 1000)(text[1:] if text.startswith("x") else text))


def listed(parse):
    def each(text: str) -> list:
        items = options.comma_list(text)
        if not items:
            raise argparse.ArgumentTypeError("an empty list")
        return [parse(x) for x in items]
    return each


def add_arguments(p) -> None:
    options.run_dir(p)
    p.add_argument("--workers", type=options.bounded_list(int, 1, 4096),
                   help="worker processes, or a comma-separated sweep (1,2,4,8)")
    p.add_argument("--threads", type=options.bounded_list(*options.THREADS), help="threads per worker, or a sweep")
    p.add_argument("--delay-ms", type=options.bounded_list(*options.DELAY_MS),
                   help="link latency as run's --delay-ms (replaces the run's), or a sweep")
    p.add_argument("--network", type=listed(factor), help=f"wire times: {FACTOR}")
    p.add_argument("--decisions", type=listed(factor), help=f"the scheduler's decisions: {FACTOR}")
    p.add_argument("--bookkeeping", type=listed(factor),
                   help=f"the runtime's other work (scheduler, workers, batched-send intervals): {FACTOR}")
    p.add_argument("--gil", choices=["0"], help="0: no thread waits for the GIL")
    p.add_argument("--scheduler", type=listed(_scheduler), help="ws (Dask's) or random, or both: ws,random")
    p.add_argument("--runtime", choices=["dask", "rsds"], help="the runtime (only dask is modelled)")
    p.add_argument("--samples", type=options.bounded(int, 1, 200), default=10,
                   help="replays per prediction: the run's durations, then resampled ones (default 10)")
    p.add_argument("--scaling", metavar="BENCH_DIR",
                   help="the scheduler's costs per task and per heartbeat as they grow with workers, fitted on a "
                        "bench's runs (daskprobe bench --worker zero --probes proxy,pyspy,proc, at several "
                        "--workers); without it, the run's own at any count")
    p.add_argument("--findings", action="store_true",
                   help="instead: what each finding of summary.json would save, where the model can replay its "
                        "advice")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON, one object per line")


def _scheduler(text: str) -> str:
    if text not in ("ws", "random"):
        raise argparse.ArgumentTypeError(f"{text!r}: ws or random")
    return text


def changes(args) -> list:
    """One Changes per combination of the options' values."""
    from ...analyzers.whatif import Changes
    axes = {name: getattr(args, name) or [None] for name in ("workers", "threads", "delay_ms", "network", "decisions",
                                                            "bookkeeping", "scheduler")}
    return [Changes(**dict(zip(axes, combo)), gil=args.gil != "0", runtime=args.runtime)
            for combo in itertools.product(*axes.values())]


def main(args, command: list[str]) -> int:
    from ...analyzers.whatif import NotModelled, sweep
    run = options.existing_run(args.run_dir)
    if not run.has_table("tasks"):
        raise SystemExit(f"daskprobe: {run.path} has no analysis tables: run 'daskprobe build {run.path}' first")
    t = {name: run.table(name, missing_ok=True, columns=cols) for name, cols in TABLES.items()}
    meta = run.meta()
    try:
        if args.findings:
            out = _findings(run, t, args.samples)
        else:  # the bench read after the run: reading it, root may become its owner
            out = sweep(t, meta, changes(args), args.samples, scaling(args.scaling) if args.scaling else None)
    except NotModelled as e:
        raise SystemExit(f"daskprobe: whatif: {e}")
    if args.json:
        for p in out:
            print(json.dumps(p))
    else:
        print(render_savings(out) if args.findings else render(out))
    return 0


def scaling(path: str):
    """The fit of a bench directory's results (analyzers/whatif/scaling.py); as root in another user's
    directory, this process becomes that user first."""
    from pathlib import Path

    from ...analyzers.whatif.scaling import fit
    from ...dashboards import bench_results
    from ...probes import users
    bench = Path(path)
    if not (bench / "results.csv").is_file():
        raise SystemExit(f"daskprobe: whatif: {bench} is not a bench directory (no results.csv)")
    users.work_as_owner_of(bench)
    try:
        return fit(bench_results.load(bench), source=str(bench))
    except ValueError as e:
        raise SystemExit(f"daskprobe: whatif: --scaling: {e}")


def _findings(run, t: dict, samples: int) -> list[dict]:
    from ...analyzers.whatif.advice import savings
    path = run / "summary.json"
    if not path.exists():
        raise SystemExit(f"daskprobe: no summary.json in {run.path}: run 'daskprobe report {run.path}' first")
    found = json.loads(path.read_text()).get("findings", [])
    if found and not any("what_if" in f for f in found):
        raise SystemExit(f"daskprobe: {run.path}'s summary.json predates the what-if model (its findings have no "
                         f"what_if): run 'daskprobe report {run.path}' first")
    return savings(t, run.meta(), found, samples)


def render_savings(out: list[dict]) -> str:
    if not out:
        return "no finding whose advice the model replays (docs/whatif.md)"
    return "\n".join(f"{p['id']}: {p['change']}: {p['measured_s']:.2f} s -> {p['makespan_s']:.2f} s predicted (90% "
                     f"interval {p['interval_s'][0]:.2f}-{p['interval_s'][1]:.2f} s)" for p in out)


def render(out: list[dict]) -> str:
    first = out[0]
    head = (f"measured makespan {first['measured_s']:.3f} s; the model's replay of the run unchanged "
            f"{first['replay_s']:.3f} s ({first['replay_error']:+.1%}), the error a prediction may have before any other")
    cats = list(first["split_s"])
    rows = [["", "makespan s", "90% interval", "vs run", "ground", "scheduler CPU s", *cats]]
    measured = first["measured_split_s"]
    if measured:
        rows.append(["measured", f"{first['measured_s']:.3f}", "", "1.00", "", "",
                     *(f"{measured.get(c, 0):.3f}" for c in cats)])
    for p in out:
        lo, hi = p["interval_s"]
        rows.append([p["changes"], f"{p['makespan_s']:.3f}", f"{lo:.3f}-{hi:.3f}",
                     f"{p['makespan_s'] / p['measured_s']:.2f}", p["ground"], f"{p['scheduler_cpu_s']:.3f}",
                     *(f"{p['split_s'][c]:.3f}" for c in cats)])
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [head, "", *("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, width)))
                         for r in rows)]
    costs = [f"scheduler costs from {p['scaling']}" for p in out if p["scaling"]]
    costs += [f"scheduler costs at {p['workers']} workers: {p['scheduler_costs']}" if p["scaling"]
              else f"scheduler costs: {p['scheduler_costs']}" for p in out]
    notes = sorted({n for p in out for n in p["notes"]})
    return "\n".join(lines + list(dict.fromkeys(costs)) + [f"note: {n}" for n in notes])
