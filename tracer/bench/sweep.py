"""`daskprobe bench`: sweep graphs x workers x scheduler x worker mode x server,
--repeat `daskprobe run`s per point (default 3), into one results table.

    DIR/<graph>-w<W>-<scheduler>-<worker>-<server>-r<R>/   the run directory of each run, with its own row
                                                          (bench.parquet) and daskprobe's output
                                                          (logs/bench-command.log)
    DIR/results.csv, DIR/results.parquet                 one row per run, rewritten after each
                                                          (dashboards/bench_results.py defines the rows)
    DIR/bench.html, DIR/speedups.csv                      the comparison figures
    DIR/scheduler_ops.csv                                 the scheduler's messages and CPU by op, per traced
                                                          run (analyzers/scheduler_ops.py's rows, with the
                                                          point's graph, workers and repeat before them);
                                                          DIR/<point>/scheduler_ops.csv each run's own

A row's makespan_s is the workload's own clock: the client's wall time from
compute() to the result in hand, the same with or without probes. Resuming
(the same command again) skips every point already in results.csv, whatever
its status; a point interrupted half-way has no row and is run again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ...analyzers import scheduler_ops, summary_json
from ...analyzers.categories import CATEGORIES, UNCATEGORIZED
from ...dashboards import bench_results
from ...probes.procs import stop
from ...probes.rundir import RunDir

KILL_GRACE_S = 60  # after SIGTERM at the timeout, daskprobe gets this long to tear down


@dataclass(frozen=True)
class Point:
    graph: str
    workers: int
    scheduler: str
    worker: str
    server: str  # "dask" or a scheduler command with {host} and {port}
    repeat: int

    @property
    def name(self) -> str:
        # a digest, not a prefix: two commands that start alike must not share run directories
        server = "dask" if self.server == "dask" else "cmd" + hashlib.sha1(self.server.encode()).hexdigest()[:8]
        return f"{self.graph}-w{self.workers}-{self.scheduler}-{self.worker}-{server}-r{self.repeat}"


def plan(graphs, workers, schedulers, worker_modes, servers, repeat) -> list[Point]:
    """Every combination, a whole sweep per repeat, so drift spreads over all points alike.
    A custom server brings its own policy, so only `ws` (meaning: as the server does) runs on it."""
    return [Point(g, w, s, m, srv, r)
            for r, g, w, s, m, srv in itertools.product(range(repeat), graphs, workers, schedulers, worker_modes, servers)
            if srv == "dask" or s == "ws"]


def run_point(p: Point, out: Path, probes: str, timeout: float, python: str, extra: list[str],
              per_process: int = 1) -> dict:
    run_dir = out / p.name
    shutil.rmtree(run_dir, ignore_errors=True)  # what an interrupted bench left of this point
    cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", str(p.workers),
           "--workers-per-process", str(min(per_process, p.workers)),
           "--scheduler", p.scheduler, "--worker", p.worker, "--probes", probes, "--python", python,
           "--out", str(run_dir), *extra, *([] if p.server == "dask" else ["--server-cmd", p.server]),
           "--", python, "-m", "daskprobe.tracer.bench.workloads", p.graph]
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        # Files, not pipes: a run that fills a pipe while being stopped would hang the bench.
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, text=True, start_new_session=True)
        status = None
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            status = "timeout"
            stop([proc], grace=KILL_GRACE_S)  # SIGTERM: daskprobe tears down and keeps what it captured
        stdout, stderr = (_read(f) for f in (out_f, err_f))
    row = asdict(p) | {"workers_per_process": min(per_process, p.workers), "status": status, "elapsed_s": time.monotonic() - started, "run_dir": str(run_dir),
                       "exit_code": proc.returncode, "error": None}
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)  # for a person: nothing reads it
    output = f"$ {' '.join(cmd)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    (run_dir / "logs" / "bench-command.log").write_text(output)
    row |= _outcome(row, stdout, stderr, run_dir)
    bench_results.write_row(run_dir, row)
    return row


def _read(f) -> str:
    f.seek(0)
    return f.read()


def _outcome(row: dict, stdout: str, stderr: str, run_dir: Path) -> dict:
    result = _last_json(stdout)
    if row["status"] == "timeout":
        out = {"error": "timed out; the run directory keeps what was captured"}
    elif row["exit_code"] != 0 or result is None:
        tail = [line for line in stderr.splitlines() if line.strip()][-3:]
        out = {"status": "failed", "error": " | ".join(tail) or f"exit code {row['exit_code']}"}
    else:
        out = {"status": "ok", "makespan_s": result["makespan_s"], "tasks": result["tasks"],
               "aot_s": result["makespan_s"] / result["tasks"], "check": result.get("check")}
    return out | _traced(run_dir)


def _last_json(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def _traced(run_dir: Path) -> dict:
    """The proxy's makespan and the critical-path split, when probes ran."""
    try:
        summary = summary_json.read(RunDir(run_dir))
    except (OSError, ValueError):
        return {}
    path = summary.get("critical_path_s") or {}
    return {"traced_makespan_s": summary.get("makespan_s"),
            **{f"critical_path_s.{c}": path.get(c) for c in (*CATEGORIES, UNCATEGORIZED)}} | _load(run_dir)


def _load(run_dir: Path) -> dict:
    """The scheduler's load (analyzers/scheduler_ops.py), its rows by op in the run's scheduler_ops.csv."""
    try:
        load, ops = scheduler_ops.of_run(RunDir(run_dir))
    except (OSError, ValueError, KeyError) as e:  # a run too broken to read: its row says the rest
        print(f"daskprobe bench: {run_dir.name}: no scheduler load: {e}", file=sys.stderr)
        return {}
    if len(ops):
        ops.to_csv(run_dir / OPS, index=False)
    return load


OPS = "scheduler_ops.csv"


def _all_ops(results: pd.DataFrame, out: Path) -> None:
    """DIR/scheduler_ops.csv: each run's rows by op, after its point's graph, workers and repeat."""
    parts = [pd.read_csv(Path(r.run_dir) / OPS).assign(graph=r.graph, workers=r.workers, repeat=r.repeat)
             for r in results.itertuples() if (Path(r.run_dir) / OPS).exists()]
    if parts:
        df = pd.concat(parts, ignore_index=True)
        df[["graph", "workers", "repeat", *scheduler_ops.COLUMNS]].to_csv(out / OPS, index=False)


def bench(points: list[Point], out: Path, probes: str, timeout: float, python: str,
          extra: list[str] = (), per_process: int = 1) -> pd.DataFrame:
    out.mkdir(parents=True, exist_ok=True)
    results = bench_results.load(out)
    done = set(results.run_dir.map(lambda d: Path(d).name))
    todo = [p for p in points if p.name not in done]
    if done:
        print(f"daskprobe bench: resuming in {out}: {len(points) - len(todo)} of {len(points)} runs already done",
              file=sys.stderr)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, transient=False) as progress:
        bar = progress.add_task("bench", total=len(todo))
        for p in todo:
            progress.update(bar, description=p.name)
            row = run_point(p, out, probes, timeout, python, list(extra), per_process)
            results = pd.concat([results, bench_results.frame([row])], ignore_index=True)
            bench_results.save(results, out)
            if row["status"] != "ok":
                progress.console.print(f"[red]{p.name}: {row['status']}[/]: {row['error']}")
            progress.advance(bar)
    _all_ops(results, out)
    return results
