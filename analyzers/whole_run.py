"""Views of the whole run beside the critical path (definitions in summary.DEFINITIONS)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .categories import UNCATEGORIZED


def whole_run(tables: dict, window: tuple[int, int], n_tasks: int, meta: dict, category: pd.Series) -> dict:
    return {"cpu_by_category_s": cpu_by_category(tables, window, meta, category),
            "worker_idle_s": worker_idle(tables["tasks"], window),
            "task_overhead_s": task_overhead(tables["tasks"], tables["messages"]),
            "scheduler_cpu_per_task_s": scheduler_cpu(tables, window, n_tasks)}


def cpu_by_category(tables: dict, window: tuple[int, int], meta: dict, category: pd.Series) -> dict:
    s = tables["samples"]
    s = s[s.active.astype(bool) & (s.t_ns >= window[0]) & (s.t_ns <= window[1])].dropna(subset=["process"])
    if s.empty:
        return {}
    period = {"pyspy": 1 / meta.get("sample_rate", 100.0), "ebpf": 1 / meta.get("cpu_hz", 99)}
    # a process sampled by py-spy is counted from its Python samples only
    python = set(s[s.source == "pyspy"].process)
    s = s[(s.source == "pyspy") | ~s.process.isin(python)]
    s = s.assign(category=s.stack_id.map(category).fillna(UNCATEGORIZED), seconds=s.source.map(period))
    by = s.groupby(["process", "category"]).seconds.sum()
    return {proc: {cat: float(v) for cat, v in part.droplevel(0).items()} for proc, part in by.groupby(level=0)}


def worker_idle(tasks: pd.DataFrame, window: tuple[int, int]) -> dict:
    """Per worker, seconds in the window holding no task (from compute-task reaching it
    to its task-finished leaving): the window minus the union of those spans."""
    out = {}
    for worker, t in tasks.dropna(subset=["compute_recv_ns", "finished_sent_ns"]).groupby("worker"):
        iv = t[["compute_recv_ns", "finished_sent_ns"]].astype("int64").clip(*window).sort_values("compute_recv_ns")
        s, e = iv.compute_recv_ns.to_numpy(), iv.finished_sent_ns.to_numpy()
        reach = np.maximum.accumulate(e)  # the union's end so far
        first = np.r_[True, s[1:] > reach[:-1]]  # a span that starts a new piece of the union
        last = np.r_[first[1:], True]
        busy = int((reach[last] - s[first]).sum())
        out[worker] = (window[1] - window[0] - busy) / 1e9
    return out


def task_overhead(tasks: pd.DataFrame, msgs: pd.DataFrame) -> dict:
    over = task_overheads(tasks, msgs)
    return {"mean": float(over.mean()), "p50": float(np.percentile(over, 50)),
            "p90": float(np.percentile(over, 90)), "p99": float(np.percentile(over, 99)),
            "max": float(over.max())} if len(over) else {}


def task_overheads(tasks: pd.DataFrame, msgs: pd.DataFrame) -> np.ndarray:
    """Per task, seconds: (task-finished reaching the scheduler - ready) - compute span.
    Ready is the last dependency's task-finished reaching the scheduler, or for a task
    without dependencies the client's last graph before its dispatch."""
    t = tasks.dropna(subset=["finished_recv_ns", "compute_start_ns", "compute_stop_ns"])
    if t.empty:
        return np.empty(0)
    done = t.set_index("key").finished_recv_ns.astype("float64")
    deps = t[["key", "deps"]].explode("deps")
    ready = deps.deps.map(done).groupby(deps.key, sort=False).max().reindex(t.key).to_numpy("float64")
    graphs = np.sort(msgs[(msgs.src_role == "client") & (msgs.op == "update-graph")].t_last_ns.to_numpy("float64"))
    i = np.searchsorted(graphs, t.compute_sent_ns.to_numpy("float64", na_value=np.nan), side="right") - 1
    graph = np.where(i >= 0, graphs[np.clip(i, 0, None)] if len(graphs) else np.nan, np.nan)
    ready = np.where(np.isnan(ready), graph, ready)
    over = ((t.finished_recv_ns.to_numpy("float64") - ready)
            - (t.compute_stop_ns - t.compute_start_ns).to_numpy("float64")) / 1e9
    return over[~np.isnan(over)]


def scheduler_cpu(tables: dict, window: tuple[int, int], n_tasks: int) -> float | None:
    p = tables["proc"]
    p = p[p.process == "scheduler"]
    if p.empty or not n_tasks:
        return None
    cpu = np.interp(list(window), p.t_ns.to_numpy("float64"), p.cpu_s.to_numpy("float64"))
    return float(cpu[1] - cpu[0]) / n_tasks
