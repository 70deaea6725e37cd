"""The analysis: a run's tables in, result tables and summary.json out (pure).

Every number has a unit (in its name or its definition) and a definition: its key's in
summary_json.py (copied into summary.json and shown by `daskprobe explain`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import local, local_summary
from .attribution import attribute
from .categories import DEFINITIONS as CATEGORY_DEFINITIONS, classify_stacks, default_rules, load_rules
from .cpu import classify_samples, cpu_by_category, cpu_time
from .critical_path import critical_paths
from .evidence import client_split, compute_profile, path_samples, stragglers
from .findings import findings
from .jobs import client_gaps, exchanges, graph_jobs, session, told
from .tasks import assign_jobs, prefix_costs, recomputed, tasks_table
from .strings import in_python_strings
from .summary_json import DEFINITIONS, SCHEMA
from .transfers import moved, transfers
from .thread_state import attempt_threads, thread_states, threads_table
from .results import Analysis, job_entries, recomputed_keys, split
from .whatif.advice import quote
from .whole_run import cpu_check, in_flight, scheduler_cpu, task_overhead, worker_idle, workers_ended
from ..probes.run_json import Meta

INPUTS = ("processes", "messages", "attempts", "graphs", "samples", "stacks", "frames", "gil_waits", "offcpu", "proc",
          "thread_names", "task_stream", "connections", "local_jobs", "local_tasks")


SAMPLED = ("thread_states", "stack_categories", "cpu_samples", "threads")


@in_python_strings
def sampled(t: dict, meta: dict, rules: list[Path] = ()) -> dict:
    """What the samples and thread states say, apart from the messages' side (it needs no job or
    path, so it can be computed beside them): the SAMPLED tables."""
    t = local.for_samples(t) if local.is_local(t) else t
    states = thread_states(t["offcpu"], t["gil_waits"])
    category = classify_stacks(t["stacks"], t["frames"], load_rules([*rules, *default_rules(meta)]))
    rates = Meta(meta)  # an older run.json without its rates: the defaults, which it was taken at
    cpu = classify_samples(t["samples"], t["processes"], states, category, t["attempts"], rates.sample_rate,
                           rates.cpu_hz)
    return {"thread_states": states, "threads": threads_table(t["samples"], states, t["thread_names"]),
            "cpu_samples": cpu, "stack_categories": category.rename("category").rename_axis("stack_id").reset_index()}


@in_python_strings
def analyze(t: dict, meta: dict, rules: list[Path] = (), side=None) -> Analysis:
    """side(): the SAMPLED tables, if computed (and written) elsewhere; else they are computed here,
    by sampled(), and are among the tables returned."""
    base = {"schema": SCHEMA, "definitions": DEFINITIONS | {
        f"critical_path_s.{cat}": text for cat, text in CATEGORY_DEFINITIONS.items()}} | command_seconds(meta)
    graphs, jobs = graph_jobs(t["graphs"], t["messages"], lossy=lossy(meta))
    window = session(t["messages"], jobs)
    if (jobs.empty or t["attempts"].empty or window is None) and local.is_local(t) and len(t["local_jobs"]):
        sides = side() if side else sampled(t, meta, rules)  # a local scheduler's run (analyzers/local.py)
        out = local_summary.analyze(t, meta, base, sides)
        out.summary["findings"] = quote(out.summary.get("findings", []), {}, meta, local=True)
        return Analysis(out.tables | ({} if side else sides), out.summary)
    if jobs.empty or t["attempts"].empty or window is None:
        return Analysis({}, base | {"error": _nothing(t, meta)}
                        | (task_stream_numbers(t["task_stream"]) if "task_stream" in t else {}))
    attempts = assign_jobs(t["attempts"], jobs)
    tasks = tasks_table(attempts, graphs)
    fetched = exchanges(t["messages"])
    path = critical_paths(jobs, tasks, attempts, graphs, told(t["messages"]), fetched)
    path = pd.concat([path, client_gaps(window, jobs, t["messages"])], ignore_index=True)
    path = path.sort_values("start_ns", kind="stable", ignore_index=True)
    if meta.get("cluster", {}).get("server_cmd"):  # a server of its own (RSDS) sends at once: no batched-send
        path["batch_ns"] = path.batch_ns.where(path.kind != "scheduler", 0)  # interval to hold its messages
    numbers, again, span = _numbers(t, jobs, tasks, attempts, window), recomputed(attempts), _makespan(jobs)
    ended = workers_ended(t.get("connections"), span)
    whole = {"recomputed": recomputed_keys(again), "worker_idle_s": worker_idle(attempts, span, ended),
             "workers_ended_s": {w: (ns - window[0]) / 1e9 for w, ns in ended.items()},
             "task_overhead_s": task_overhead(tasks), "scheduler_cpu_per_task_s": scheduler_cpu(t["proc"], span, len(tasks))}
    moves = transfers(t["messages"], fetched)
    whole["moved"] = moved(moves)
    out = {"jobs": jobs, "tasks": tasks, "in_flight": in_flight(attempts), "transfers": moves,
           "prefixes": prefix_costs(tasks, path, numbers["session_s"]), "critical_path": path}
    sides = side() if side else sampled(t, meta, rules)  # all above needs no samples: done while they are read
    states, cpu, threads = sides["thread_states"], sides["cpu_samples"], sides["threads"]
    task_tids = attempt_threads(attempts, threads)  # attempts is t["attempts"] with its jobs: the same rows
    attr = attribute(path, t["processes"], states, cpu, threads, attempts, task_tids)
    cpu_in_window = cpu_time(cpu, states, threads[threads.pid.isin(_pids(t["processes"], CLUSTER))], span)
    summary = base | numbers | split(attr) | {
        "jobs": job_entries(jobs, tasks, attempts, attr, window, again), "recomputed": whole["recomputed"],
        "cpu_by_category_s": cpu_by_category(cpu_in_window),
        "cpu_check": cpu_check(cpu_in_window, cpu, t["proc"], span)} | whole | {
        "thread_states": "ebpf" if len(states) else "samples"}
    seen = t | {"cpu_samples": cpu, "thread_states": states, "critical_path": path, "tasks": tasks, "threads": threads,
                "stack_categories": sides["stack_categories"]}
    seen |= {"path_samples": path_samples(seen), "stragglers": stragglers(seen),  # several findings read them
             "client_split": client_split(seen)}
    profile = compute_profile(seen, attempts, task_tids)
    if local.is_local(t) and len(t["local_jobs"]):  # jobs of a local scheduler beside the cluster's: not analysed
        summary["local_scheduler"] = {"schedulers": sorted({k["scheduler"] for k in local.scheduler_kind(t).values()}),
                                      "ignored_jobs": len(t["local_jobs"])}
    summary["findings"] = quote(findings(summary, seen | {"compute_profile": profile, "attempt_threads": task_tids,
                                                          "attempts": attempts}, meta),
                                {"tasks": tasks, "jobs": jobs, "graphs": t["graphs"], "job_graphs": graphs,
                                 "messages": t["messages"],
                                 "processes": t["processes"], "attempts": attempts, "attempt_threads": task_tids,
                                 "thread_states": states, "proc": t["proc"], "attribution": attr,
                                 "cpu_samples": cpu}, meta)
    out |= {"attempt_threads": task_tids, "attribution": attr, "compute_profile": profile}
    return Analysis(out | ({} if side else sides), summary)


def lossy(meta: dict) -> bool:
    """Whether the run's messages were not all recorded: its recorder lost some (run.json `lost`, from
    the tables stage), or stopped before the end."""
    return bool(meta.get("lost")) or bool({"proxy", "tap"} & set(meta.get("probe_errors", {})))


def task_stream_numbers(ts: pd.DataFrame) -> dict:
    """What Dask's own task stream says, where it stands in for the messages."""
    compute = ts[ts.action == "compute"].assign(s=lambda d: (d.stop_ns - d.start_ns) / 1e9)
    if compute.empty:
        return {}
    return {"task_stream": {
        "tasks": int(compute.key.nunique()), "span_s": (compute.stop_ns.max() - compute.start_ns.min()) / 1e9,
        "compute_s": float(compute.s.sum()),
        "compute_s_by_worker": compute.groupby("worker").s.sum().round(3).to_dict(),
        "compute_s_by_prefix": compute.groupby("prefix").s.sum().nlargest(10).round(3).to_dict()}}


def command_seconds(meta: dict) -> dict:
    start, end = meta.get("command_started_ns"), meta.get("command_ended_ns")
    return {"command_s": (end - start) / 1e9} if start and end else {}


def _nothing(t: dict, meta: dict) -> str:
    if unread := meta.get("skipped", {}).get("messages"):
        missing = meta.get("task_stream_missing")
        return (f"{unread}: no critical path, no overhead per task; Dask's own task stream is in "
                "tables/task_stream.parquet" + (f" (without {missing} tasks that fell out of it before they "
                                                "were read: see run.json task_stream_missing)" if missing else "")
                + ", the processes' samples in the tables and the trace")
    if t["messages"].empty:
        return "no messages were captured: nothing to measure"
    if not ((t["messages"].src_role == "client") & (t["messages"].op == "update-graph")).any():
        if meta.get("attached"):
            return ("no client submitted a computation while recording (no update-graph reached the scheduler), "
                    "and no local scheduler (threads, processes, sync) ran a job in the command: nothing to measure")
        if meta.get("exit_code"):
            return (f"the command failed (exit code {meta['exit_code']}, see its output above) before a client "
                    "submitted a computation through daskprobe's proxy: nothing to measure")
        return ("the command computed nothing with Dask that daskprobe could see: no update-graph from a client "
                "reached daskprobe's cluster, and no local scheduler (threads, processes, sync) ran a job in the command's "
                "Python. Nothing to measure (a Client connected to another address than DASK_SCHEDULER_ADDRESS, "
                "or a compute given callbacks= of its own, is not recorded)")
    return "no task was dispatched: nothing to measure"


CLUSTER = ("scheduler", "worker", "nanny", "client")


def _pids(processes: pd.DataFrame, roles) -> list[int]:
    return processes[processes.role.isin(roles)].pid.dropna().astype("int64").tolist()


def _makespan(jobs: pd.DataFrame) -> tuple[int, int]:
    return int(jobs.start_ns.min()), int(jobs.end_ns.max())


def _numbers(t: dict, jobs, tasks, attempts, window) -> dict:
    start, end = _makespan(jobs)
    msgs = t["messages"]
    inside = msgs[(msgs.t_first_ns >= start) & (msgs.t_first_ns <= end)]
    per_msg = inside.drop_duplicates("msg_id")
    n = len(tasks)
    spans = (attempts.compute_stop_ns - attempts.compute_start_ns).dropna()
    makespan = (end - start) / 1e9
    return {"session_s": (window[1] - window[0]) / 1e9, "session_window_ns": list(window),
            "makespan_s": makespan, "window_ns": [start, end], "tasks": n, "dispatches": len(attempts),
            "aot_s": float((jobs.end_ns - jobs.start_ns).sum()) / 1e9 / n if n else None,
            "compute_s": float(spans.sum()) / 1e9,
            "messages": len(per_msg), "ops": len(inside),
            "messages_per_task": len(per_msg) / n if n else None,
            "bytes_per_task": float(per_msg.msg_bytes.sum()) / n if n else None,
            "ops_by_name": inside.op.value_counts().to_dict()}
