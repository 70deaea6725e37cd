"""A bench's results, defined once: one row per `daskprobe run` of a bench point, as
tracer/bench/sweep.py writes them and compare.py and bench_report.py read them (a Table, checked
as probes/schema.py checks a run's tables). The rows are in

    DIR/results.csv, DIR/results.parquet    every run of the bench, rewritten after each
    DIR/<point>/bench.parquet               the run's own row: a run directory moved out of its bench keeps it

A column an older bench did not write reads as null. A run directory of a bench from before
bench.parquet has bench.log (the command's output), from which its workload's line is read."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..analyzers.categories import CATEGORIES, UNCATEGORIZED
from ..probes.rundir import open_whole
from ..probes.schema import Column as C, SchemaError, Table, arrow_schema, conform as _conform

RUN_ROW = "bench.parquet"
SPLIT = [f"critical_path_s.{c}" for c in (*CATEGORIES, UNCATEGORIZED)]
RESULTS = Table("One row per run of a bench point.", (
    C("graph", "str", "", "the workload's graph (tracer/bench/workloads.py)"),
    C("workers", "int64", "count", "workers"),
    C("workers_per_process", "Int64", "count", "workers sharing a process (--workers-per-process); null: 1, an older bench"),
    C("scheduler", "str", "", "the scheduling policy (ws, random, ...)"),
    C("worker", "str", "", "the worker mode (normal, zero)"),
    C("server", "str", "", "dask, or the scheduler command (--server-cmd)"),
    C("repeat", "int64", "", "the repeat's number, from 0"),
    C("status", "str", "", "ok, failed or timeout"),
    C("makespan_s", "float64", "s", "the workload's own clock: compute() to the result in hand; NaN unless ok"),
    C("tasks", "Int64", "count", "the graph's tasks; null unless ok"),
    C("aot_s", "float64", "s", "makespan_s / tasks"),
    C("traced_makespan_s", "float64", "s", "the makespan at the proxy (summary.json's); NaN without probes"),
    *(C(name, "float64", "s", "summary.json's critical_path_s of that category") for name in SPLIT),
    C("scheduler_cpu_s", "float64", "s", "the scheduler's CPU over the makespan (/proc); NaN without the proc probe"),
    C("scheduler_cpu_per_task_s", "float64", "s", "scheduler_cpu_s / tasks"),
    C("scheduler_messages", "Int64", "count", "ops the scheduler received and sent over the makespan (each op of a "
      "batch counts); null without messages"),
    C("scheduler_cpu_per_msg_s", "float64", "s", "scheduler_cpu_s / scheduler_messages"),
    C("administrative_msg_share", "float64", "", "the share of scheduler_messages that are administrative "
      "(heartbeats, keep-alives, registration, handshakes: analyzers/scheduler_ops.py)"),
    C("administrative_cpu_s", "float64", "s", "the scheduler's CPU in administrative ops' handlers, from its "
      "samples; NaN without samples"),
    C("check", "str", "", "the workload's check of its result (ok, or why it was skipped)"),
    C("error", "str", "", "why it is not ok: the last lines of daskprobe's stderr, or the timeout"),
    C("exit_code", "Int64", "", "daskprobe's exit code; null if it was killed"),
    C("elapsed_s", "float64", "s", "wall time of the whole daskprobe run, finalizing included"),
    C("run_dir", "str", "", "the run directory, as bench was given it"),
))
NAMES = RESULTS.names


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows as the table: a key that is not a column, or a value that does not fit its column, is a SchemaError."""
    extra = sorted({k for r in rows for k in r} - set(NAMES))
    if extra:
        raise SchemaError(f"bench results: column {extra[0]!r} is not in its schema (dashboards/bench_results.py)")
    return conform(pd.DataFrame(rows, columns=NAMES))


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """df's columns cast to the table's, those it lacks (an older bench's) null."""
    return _conform("bench results", df.reindex(columns=NAMES), RESULTS)


def write_row(run_dir: Path, row: dict) -> None:
    _parquet(frame([row]), run_dir / RUN_ROW)


def save(df: pd.DataFrame, out: Path) -> None:
    """results.csv and results.parquet, each written whole: a kill leaves the previous ones."""
    df = conform(df)
    with open_whole(out / "results.csv", fresh=False) as f:
        f.write(df.to_csv(index=False).encode())
    _parquet(df, out / "results.parquet")


def load(out: Path) -> pd.DataFrame:
    """A bench's results (none yet: no rows)."""
    path = out / "results.csv"
    return conform(pd.read_csv(path) if path.exists() else pd.DataFrame(columns=NAMES))


def run_row(run_dir: Path) -> dict | None:
    """A run directory's own row: its bench.parquet, else its row in its bench's results.csv (the parent
    directory: an older bench's), else what its bench.log says (older still); None if none."""
    if (run_dir / RUN_ROW).exists():
        return conform(pd.read_parquet(run_dir / RUN_ROW)).iloc[-1].to_dict()
    results = run_dir.parent / "results.csv"
    if results.exists():
        df = load(run_dir.parent)
        mine = df[df.run_dir.fillna("").map(lambda d: Path(d).name) == run_dir.name]
        if len(mine):
            return mine.iloc[-1].to_dict()
    return _bench_log(run_dir / "bench.log")


def _bench_log(log: Path) -> dict | None:
    """The workload's JSON line in an older bench's bench.log (the command, then its stdout and stderr)."""
    out = log.read_text().partition("--- stdout\n")[2].partition("\n--- stderr")[0] if log.exists() else ""
    for line in reversed(out.strip().splitlines()):
        try:
            result = json.loads(line)
            return {"status": "ok", "makespan_s": result["makespan_s"], "tasks": result["tasks"],
                    "aot_s": result["makespan_s"] / result["tasks"]}
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            continue
    return None


def _parquet(df: pd.DataFrame, path: Path) -> None:
    table = pa.Table.from_pandas(df, schema=arrow_schema("bench results", RESULTS), preserve_index=False)
    with open_whole(path, fresh=False) as f:
        pq.write_table(table, f)
