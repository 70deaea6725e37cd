"""Tasks: one row per key and job, from the attempts (one per dispatch).

A task's attempt is the last one of its job that finished (else its last).
It was ready when the last of its dependencies had finished at the scheduler
and its graph had arrived (its last byte at the proxy), whichever came later:
`ready_by` names which (a dependency's key, or "graph"). Its graph is the one
that asked for its key, else the job's latest graph to arrive before its
first dispatch (graphs are pickled: which graph holds a key is not visible).

A key computed again, in a later job or a second time in one job, is
recomputed: each computation is an attempt of its own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .jobs import asks, job_of


def assign_jobs(attempts: pd.DataFrame, jobs: pd.DataFrame) -> pd.DataFrame:
    return attempts.assign(job=job_of(attempts.compute_sent_ns, jobs))


def tasks_table(attempts: pd.DataFrame, graphs: pd.DataFrame) -> pd.DataFrame:
    a = attempts[attempts.job >= 0]
    done = a.outcome.eq("finished")
    a = a.assign(_done=done).sort_values(["_done", "compute_sent_ns"], kind="stable")
    t = a.groupby(["job", "key"], sort=False).tail(1).set_index(["job", "key"])
    per = attempts[attempts.job >= 0].groupby(["job", "key"], sort=False)
    t = t.drop(columns=["_done", "attempt"]).assign(
        attempts=per.size(), first_sent_ns=per.compute_sent_ns.min())
    t = t.reset_index()
    t = _with_graph(t, graphs)
    t = _with_ready(t, attempts)
    return t.join(task_times(t))


def _with_graph(t: pd.DataFrame, graphs: pd.DataFrame) -> pd.DataFrame:
    """The graph that brought each task: the one asking for its key, else the latest before its dispatch."""
    g = graphs.sort_values("t_last_ns", kind="stable")
    asked = asks(g).drop_duplicates(["job", "key"], keep="last")
    t = t.merge(asked[["job", "key", "graph_id", "t_last_ns"]].rename(
        columns={"graph_id": "graph", "t_last_ns": "graph_ns"}), on=["job", "key"], how="left")
    latest = pd.merge_asof(t[["first_sent_ns"]].reset_index().sort_values("first_sent_ns", kind="stable"),
                           g[["t_last_ns", "graph_id"]].astype("int64"), left_on="first_sent_ns",
                           right_on="t_last_ns", direction="backward").set_index("index").sort_index()
    late = t.graph_ns.isna() | (t.graph_ns > t.first_sent_ns)
    t.loc[late, "graph"] = latest.graph_id[late]
    t.loc[late, "graph_ns"] = latest.t_last_ns[late]
    return t.astype({"graph": "Int64", "graph_ns": "Int64"})


def _with_ready(t: pd.DataFrame, attempts: pd.DataFrame) -> pd.DataFrame:
    """ready_ns and ready_by: the later of the last dependency's finish and the graph's arrival."""
    fin = attempts[attempts.outcome == "finished"][["key", "finished_recv_ns"]].astype(
        {"finished_recv_ns": "int64", "key": "str"})
    deps = t[["job", "key", "first_sent_ns", "deps"]].explode("deps").dropna(subset=["deps"]).reset_index()
    deps = deps.rename(columns={"deps": "dep"}).astype({"dep": "str"}).sort_values("first_sent_ns", kind="stable")
    # each dependency's latest finish at or before the task's first dispatch
    fin = fin.rename(columns={"key": "dep", "finished_recv_ns": "dep_ns"}).sort_values("dep_ns", kind="stable")
    hit = pd.merge_asof(deps, fin, left_on="first_sent_ns", right_on="dep_ns", by="dep", direction="backward")
    hit = hit.dropna(subset=["dep_ns"])
    last = hit.loc[hit.groupby("index").dep_ns.idxmax()].set_index("index") if len(hit) else hit.set_index("index")
    dep_ns = last.dep_ns.reindex(t.index).to_numpy("float64")
    graph_ns = t.graph_ns.to_numpy("float64", na_value=np.nan)
    by_dep = ~np.isnan(dep_ns) & ~(graph_ns > dep_ns)
    ready = np.where(by_dep, dep_ns, graph_ns)
    t["ready_ns"] = pd.array(np.where(np.isnan(ready), pd.NA, ready), dtype="Int64") if len(t) else \
        pd.array([], dtype="Int64")
    t["ready_by"] = np.where(by_dep, last.dep.reindex(t.index).to_numpy(object), "graph")
    return t


def recomputed(attempts: pd.DataFrame) -> pd.DataFrame:
    """Finished attempts of keys that had already finished before: key, job, prefix, compute seconds."""
    f = attempts[attempts.outcome == "finished"].sort_values("finished_recv_ns", kind="stable")
    again = f[f.duplicated("key", keep="first")]
    span = (again.compute_stop_ns - again.compute_start_ns).astype("float64") / 1e9
    return pd.DataFrame({"key": again.key, "job": again.job, "prefix": again.prefix, "compute_s": span.fillna(0.0)})


def moved_bytes(tasks: pd.DataFrame) -> pd.Series:
    """By prefix, bytes of results that other workers needed: each result's size once per other worker
    that ran, in the same job, a task depending on it (from where tasks ran, not from the wire)."""
    t = tasks.dropna(subset=["worker"])
    uses = t[["job", "worker", "deps"]].explode("deps").dropna(subset=["deps"])
    made = t[["job", "key", "worker", "prefix", "nbytes"]].rename(columns={"key": "deps", "worker": "worker_made"})
    uses = uses.merge(made, on=["job", "deps"])
    moved = uses[uses.worker != uses.worker_made].drop_duplicates(["job", "deps", "worker"])
    return moved.nbytes.astype("float64").groupby(moved.prefix).sum()


def task_times(tasks: pd.DataFrame) -> pd.DataFrame:
    """Per finished task (tasks' index; NaN for the others), seconds: compute_s, its compute span; wait_s,
    time in a queue (from ready to its compute-task leaving the scheduler, and on the worker from its
    arrival and inputs to a thread starting it); overhead_s, the rest of (task-finished reaching the
    scheduler - ready): the messages' hops, fetching inputs and reporting the result."""
    t = tasks[tasks.outcome == "finished"].dropna(subset=["ready_ns", "compute_start_ns", "compute_stop_ns"])
    f = t[["ready_ns", "compute_sent_ns", "compute_recv_ns", "transfer_stop_ns", "compute_start_ns",
           "compute_stop_ns", "finished_recv_ns"]].astype("float64")
    compute = f.compute_stop_ns - f.compute_start_ns
    wait = (f.compute_sent_ns - f.ready_ns).clip(lower=0) + \
        (f.compute_start_ns - np.fmax(f.compute_recv_ns, f.transfer_stop_ns)).clip(lower=0)
    total = f.finished_recv_ns - f.ready_ns
    return pd.DataFrame({"compute_s": compute / 1e9, "wait_s": wait / 1e9,
                         "overhead_s": (total - compute - wait).clip(lower=0) / 1e9},
                        index=t.index).reindex(tasks.index).astype("float64")


def prefix_costs(tasks: pd.DataFrame, path: pd.DataFrame, session_s: float) -> pd.DataFrame:
    """Per prefix (table prefixes): tasks, attempts, compute, overhead and waiting per task, bytes, critical path."""
    t = tasks.assign(compute_s=(tasks.compute_stop_ns - tasks.compute_start_ns).astype("float64") / 1e9,
                     nbytes=tasks.nbytes.astype("float64"))
    on_path = ((path.end_ns - path.start_ns) / 1e9).groupby(path.key.map(dict(zip(t.key, t.prefix)))).sum()
    g = t.groupby("prefix").agg(tasks=("key", "size"), attempts=("attempts", "sum"), compute_s=("compute_s", "sum"),
                                compute_per_task_s=("compute_s", "mean"), overhead_per_task_s=("overhead_s", "median"),
                                wait_per_task_s=("wait_s", "median"), result_bytes=("nbytes", "sum"))
    g["moved_bytes"] = moved_bytes(t).reindex(g.index).fillna(0.0)
    g["critical_path_s"] = on_path.reindex(g.index).fillna(0.0)
    g["critical_path_share"] = g.critical_path_s / session_s if session_s else np.nan
    return g.sort_values("critical_path_s", ascending=False).reset_index()
