"""Whole-run numbers from the tables: makespan, tasks, overhead per task,
messages and bytes per task. Every number has a unit (in its name) and a
definition (DEFINITIONS, copied into summary.json and the README)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .breakdown import breakdown
from .categories import DEFINITIONS as CATEGORY_DEFINITIONS, classify_stacks, default_rules, load_rules
from .whole_run import whole_run
from ..probes.rundir import RunDir

SCHEMA = 1
DEFINITIONS = {
    "makespan_s": "seconds from the first byte of the client's first update-graph at the proxy to the last "
                  "key-in-memory of a requested output reaching the client (if the client was told of no "
                  "requested output: the last key-in-memory of any task; failing that, the last task-finished "
                  "reaching the scheduler)",
    "tasks": "task keys the scheduler sent to a worker with compute-task",
    "aot_s": "average overhead per task as in Böhm & Beránek: makespan_s / tasks, in seconds",
    "compute_s": "sum over tasks of the worker's compute span (stop - start), in seconds",
    "messages": "Dask messages seen by the proxy in the makespan window (a batch counts once)",
    "ops": "ops in those messages (each op of a batch counts)",
    "messages_per_task": "messages / tasks",
    "bytes_per_task": "bytes on the wire (framing included) in the makespan window / tasks",
    "critical_path_s": "the makespan split along the critical path (see analyzers/critical_path.py) into "
                       "scheduler_decisions, runtime_bookkeeping, gil_contention, network, compute, idle and "
                       "uncategorized, in seconds; they sum to makespan_s",
    "critical_path_parts_s": "the same path by finer part (kind: part), in seconds",
    "cpu_by_category_s": "per process, CPU seconds by category: on-CPU samples x sampling period (py-spy for "
                         "Python processes, eBPF for native ones)",
    "worker_idle_s": "per worker, seconds of the makespan in which it held no task (between a compute-task "
                     "arriving and its task-finished leaving)",
    "task_overhead_s": "distribution over tasks of (task-finished reaching the scheduler - the task being ready) "
                       "- its compute span, in seconds; ready = its last dependency's task-finished reaching the "
                       "scheduler, or the graph's arrival",
    "scheduler_cpu_per_task_s": "scheduler CPU seconds (from /proc) in the makespan window / tasks",
}


def makespan_window(msgs: pd.DataFrame, tasks: pd.DataFrame) -> tuple[int, int, str, str] | None:
    """(start, end, which event ended it, the key whose arrival ended it), per DEFINITIONS."""
    graphs = msgs[(msgs.src_role == "client") & (msgs.op == "update-graph")]
    if graphs.empty or tasks.empty:
        return None
    start = int(graphs.t_first_ns.min())
    for label, ends in (("requested key-in-memory", tasks[tasks.requested].in_memory_ns),
                        ("any key-in-memory", tasks.in_memory_ns),
                        ("last task-finished", tasks.finished_recv_ns)):
        ends = ends.dropna()
        if not ends.empty:
            last = ends.idxmax()
            return start, int(ends[last]), label, tasks.key[last]
    return None


TABLES = ("processes", "messages", "tasks", "samples", "stacks", "frames", "gil_waits", "proc")


def summarize(run: RunDir, rules: list[Path] = ()) -> dict:
    tables = {name: run.table(name) for name in TABLES}
    msgs, tasks = tables["messages"], tables["tasks"]
    window = makespan_window(msgs, tasks)
    out = {"schema": SCHEMA, "run": str(run.path), "definitions": DEFINITIONS | {
        f"critical_path_s.{cat}": text for cat, text in CATEGORY_DEFINITIONS.items()}}
    if window is None:
        return out | {"error": "no update-graph and finished task seen: nothing to measure"}
    start, end, end_event, end_key = window
    inside = msgs[(msgs.t_first_ns >= start) & (msgs.t_first_ns <= end)]
    per_msg = inside.drop_duplicates("msg_id")
    n = int(tasks.compute_sent_ns.notna().sum())
    makespan = (end - start) / 1e9
    spans = (tasks.compute_stop_ns - tasks.compute_start_ns).dropna()
    out |= {
        "makespan_s": makespan, "makespan_end_event": end_event, "window_ns": [start, end],
        "tasks": n, "aot_s": makespan / n if n else None,
        "compute_s": float(spans.sum()) / 1e9,
        "messages": len(per_msg), "ops": len(inside),
        "messages_per_task": len(per_msg) / n if n else None,
        "bytes_per_task": float(per_msg.msg_bytes.sum()) / n if n else None,
        "ops_by_name": inside.op.value_counts().to_dict(),
    }
    meta = run.meta()
    category = classify_stacks(tables["stacks"], tables["frames"], load_rules([*rules, *default_rules(meta)]))
    split = breakdown(tables, (start, end), end_key, category)
    run.write_table("critical_path", split.pop("path"))
    out |= split
    out |= whole_run(tables, (start, end), n, meta, category)
    return out


def write_summary(run: RunDir, rules: list[Path] = ()) -> dict:
    summary = summarize(run, rules)
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
