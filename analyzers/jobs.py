"""Jobs: the computations a script submits, and the session around them.

A graph is one update-graph. It is in the cluster from its first byte at the
proxy until the last key it asks for is told to its sender (key-in-memory or
task-erred); a graph whose keys are never told ends when it arrives. A job is
a maximal stretch in which some graph is in the cluster: graphs whose
stretches overlap (a futures loop that submits while results come back) form
one job. The session runs from the client's first byte to its last; time in
it with no job in the cluster is the client's own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TOLD = ("key-in-memory", "task-erred")
JOB_COLUMNS = ["job", "start_ns", "end_ns", "graphs", "requested", "end_key", "end_told"]


def told(msgs: pd.DataFrame) -> pd.DataFrame:
    """Keys the scheduler told a submitter about: key, to whom, first and last byte, message."""
    m = msgs[(msgs.src_role == "scheduler") & msgs.op.isin(TOLD) & msgs.key.notna()]
    m = m[["key", "dst", "t_first_ns", "t_last_ns", "msg_id", "op"]].reset_index(drop=True)
    return m.assign(told_id=np.arange(len(m)))


def graph_jobs(graphs: pd.DataFrame, msgs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(graphs with done_ns, done_key, done_msg and job; the jobs table)."""
    g = graphs.sort_values("t_first_ns", kind="stable", ignore_index=True)
    g = g.assign(t_first_ns=g.t_first_ns.astype("int64"), t_last_ns=g.t_last_ns.astype("int64"))
    g = _done(g, told(msgs))
    reach = np.maximum.accumulate(g.done_ns.to_numpy("int64")) if len(g) else np.empty(0, "int64")
    new = np.r_[True, g.t_first_ns.to_numpy()[1:] > reach[:-1]] if len(g) else np.empty(0, bool)
    g["job"] = np.cumsum(new) - 1
    last = g.loc[g.groupby("job").done_ns.idxmax()].set_index("job")
    jobs = pd.DataFrame({"job": last.index, "start_ns": g.groupby("job").t_first_ns.min().to_numpy(),
                         "end_ns": last.done_ns.to_numpy(), "graphs": g.groupby("job").size().to_numpy(),
                         "requested": g.groupby("job")["keys"].agg(lambda k: sum(map(len, k))).to_numpy(),
                         "end_key": last.done_key.to_numpy(), "end_told": last.done_told.to_numpy()},
                        columns=JOB_COLUMNS)
    return g, jobs


def asks(graphs: pd.DataFrame) -> pd.DataFrame:
    """One row per key a graph asks for, with the graph's columns."""
    a = graphs.drop(columns="keys").join(graphs["keys"].explode().rename("key")).dropna(subset=["key"])
    return a.astype({"key": "str"}).reset_index(drop=True)


def _done(g: pd.DataFrame, t: pd.DataFrame) -> pd.DataFrame:
    """Per graph, the last of its keys' first telling after the graph was sent."""
    want = asks(g)[["graph_id", "src", "t_first_ns", "key"]].rename(columns={"src": "dst"})
    want = want.astype({"dst": "str"}).sort_values("t_first_ns")
    t = t[["key", "dst", "t_first_ns", "t_last_ns", "told_id"]].rename(
        columns={"t_first_ns": "told_first", "t_last_ns": "told_ns"}).astype({"key": "str", "dst": "str"})
    hit = pd.merge_asof(want, t.sort_values("told_first"), left_on="t_first_ns", right_on="told_first",
                        by=["key", "dst"], direction="forward").dropna(subset=["told_ns"])
    last = hit.loc[hit.groupby("graph_id").told_ns.idxmax()].set_index("graph_id")
    done = last.told_ns.reindex(g.graph_id).to_numpy("float64")
    g["done_ns"] = np.where(np.isnan(done), g.t_last_ns.to_numpy("float64"), done).astype("int64")
    g["done_key"] = last.key.reindex(g.graph_id).to_numpy()
    g["done_told"] = last.told_id.reindex(g.graph_id).astype("Int64").to_numpy()
    return g


def session(msgs: pd.DataFrame, jobs: pd.DataFrame) -> tuple[int, int] | None:
    """The client's first and last byte to or from the scheduler, widened to hold every job."""
    c = msgs[(msgs.src_role == "client") | (msgs.dst_role == "client")]
    times = [c.t_first_ns.min(), c.t_last_ns.max(), jobs.start_ns.min(), jobs.end_ns.max()]
    times = [int(t) for t in times if pd.notna(t)]
    return (min(times), max(times)) if times else None


def job_of(times, jobs: pd.DataFrame) -> np.ndarray:
    """The job each time belongs to: the latest that started at or before it (-1: before any)."""
    starts = jobs.start_ns.to_numpy("int64")
    return np.searchsorted(starts, np.asarray(times, dtype="float64"), side="right") - 1


def client_gaps(window: tuple[int, int], jobs: pd.DataFrame) -> pd.DataFrame:
    """The session's stretches with no job in the cluster, as critical-path segments of the client."""
    edges = [window[0], *np.ravel(jobs[["start_ns", "end_ns"]].to_numpy("int64")), window[1]]
    starts, ends = np.array(edges[0::2]), np.array(edges[1::2])
    names = ["before the first job"] + ["between jobs"] * (len(jobs) - 1) + ["after the last job"]
    keep = ends > starts
    return pd.DataFrame({"job": -1, "start_ns": starts[keep], "end_ns": ends[keep], "kind": "client",
                         "part": [f"client: {n}" for n in np.array(names)[keep]], "key": None,
                         "process": "client", "batch_ns": 0})
