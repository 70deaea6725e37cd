"""Jobs: the computations a script submits, and the session around them.

A graph is one update-graph. It is in the cluster from its first byte at the
proxy until the last key it asks for is told to its sender (key-in-memory or
task-erred); a graph whose keys are never told ends when it arrives. A job is
a maximal stretch in which some graph is in the cluster: graphs whose
stretches overlap (a futures loop that submits while results come back) form
one job. The session runs from the client's first byte to its last; time in
it with no job in the cluster is the client's own.

In a run whose messages were not all recorded (its capture stopped, the tap
lost packets), a job some of whose keys were never told is incomplete: its
end may be among what was lost. Its time runs on to the next job's start,
or to the client's last message: time whose owner is unknown, not the
client's. In a run that lost nothing, a key never told was let go by the
client (cancelled, fire_and_forget, a future dropped): its job ends as above.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .intervals import intersect, subtract

TOLD = ("key-in-memory", "task-erred")
JOB_COLUMNS = ["job", "start_ns", "end_ns", "graphs", "graph_bytes", "requested", "end_key", "end_told", "complete",
               "untold", "last_told_ns"]


def told(msgs: pd.DataFrame) -> pd.DataFrame:
    """Keys the scheduler told a submitter about: key, to whom, first and last byte, message."""
    m = msgs[(msgs.src_role == "scheduler") & msgs.op.isin(TOLD) & msgs.key.notna()]
    m = m[["key", "dst", "t_first_ns", "t_last_ns", "msg_id", "op"]].reset_index(drop=True)
    return m.assign(told_id=np.arange(len(m)))


def graph_jobs(graphs: pd.DataFrame, msgs: pd.DataFrame, lossy: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(graphs with done_ns, done_key, done_msg and job; the jobs table). `lossy`: the run's messages
    were not all recorded, so keys never told make their jobs incomplete."""
    g = graphs.sort_values("t_first_ns", kind="stable", ignore_index=True)
    g = g.assign(t_first_ns=g.t_first_ns.astype("int64"), t_last_ns=g.t_last_ns.astype("int64"))
    g = _done(g, told(msgs))
    reach = np.maximum.accumulate(g.done_ns.to_numpy("int64")) if len(g) else np.empty(0, "int64")
    new = np.r_[True, g.t_first_ns.to_numpy()[1:] > reach[:-1]] if len(g) else np.empty(0, bool)
    g["job"] = np.cumsum(new) - 1
    last = g.loc[g.groupby("job").done_ns.idxmax()].set_index("job")
    untold = g.groupby("job").untold.sum().to_numpy("int64")
    jobs = pd.DataFrame({"job": last.index, "start_ns": g.groupby("job").t_first_ns.min().to_numpy(),
                         "end_ns": last.done_ns.to_numpy(), "graphs": g.groupby("job").size().to_numpy(),
                         # one batched message can carry many update-graphs: its bytes count once
                         "graph_bytes": g.drop_duplicates(["job", "msg_id"]).groupby("job").msg_bytes.sum().to_numpy(),
                         "requested": g.groupby("job")["keys"].agg(lambda k: sum(map(len, k))).to_numpy(),
                         "end_key": last.done_key.to_numpy(), "end_told": last.done_told.to_numpy(),
                         "complete": (untold == 0) | (not lossy), "untold": untold, "last_told_ns": last.done_ns.to_numpy()},
                        columns=JOB_COLUMNS)
    return g, _unknown_ends(jobs, msgs)


def _unknown_ends(jobs: pd.DataFrame, msgs: pd.DataFrame) -> pd.DataFrame:
    """An incomplete job ends where the next starts, or with the recording's last message."""
    if jobs.complete.all():
        return jobs
    client = msgs[(msgs.src_role == "client") | (msgs.dst_role == "client")]  # not the cluster's teardown
    recorded = int((client if len(client) else msgs).t_last_ns.max()) if len(msgs) else 0
    upto = np.r_[jobs.start_ns.to_numpy("int64")[1:], recorded]
    end = np.where(jobs.complete, jobs.end_ns, np.maximum(jobs.end_ns.to_numpy("int64"), upto))
    return jobs.assign(end_ns=end.astype("int64"))


def asks(graphs: pd.DataFrame) -> pd.DataFrame:
    """One row per key a graph asks for, with the graph's columns."""
    a = graphs.drop(columns="keys").join(graphs["keys"].explode().rename("key")).dropna(subset=["key"])
    return a.astype({"key": "str"}).reset_index(drop=True)


def _done(g: pd.DataFrame, t: pd.DataFrame) -> pd.DataFrame:
    """Per graph, the last of its keys' first telling after the graph was sent."""
    want = asks(g)[["graph_id", "src", "t_first_ns", "key"]].rename(columns={"src": "dst"})
    want = want.astype({"dst": "str"}).sort_values("t_first_ns", kind="stable")
    t = t[["key", "dst", "t_first_ns", "t_last_ns", "told_id"]].rename(
        columns={"t_first_ns": "told_first", "t_last_ns": "told_ns"}).astype({"key": "str", "dst": "str"})
    hit = pd.merge_asof(want, t.sort_values("told_first", kind="stable"), left_on="t_first_ns", right_on="told_first",
                        by=["key", "dst"], direction="forward")
    g["untold"] = hit.told_ns.isna().groupby(hit.graph_id).sum().reindex(g.graph_id, fill_value=0).to_numpy("int64")
    hit = hit.dropna(subset=["told_ns"])
    last = hit.loc[hit.groupby("graph_id").told_ns.idxmax()].set_index("graph_id")
    done = last.told_ns.reindex(g.graph_id).to_numpy("float64")
    g["done_ns"] = np.where(np.isnan(done), g.t_last_ns.to_numpy("float64"), done).astype("int64")
    g["done_key"] = last.key.reindex(g.graph_id).to_numpy()  # none told: null (summary.json's job entries)
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


def exchanges(msgs: pd.DataFrame, src_role: str = "worker", op: str | None = "get_data") -> pd.DataFrame:
    """Requests from a process of `src_role` to a worker (of `op`, or any) with their replies: requester
    (src), server (dst), request and reply times, the reply's bytes. get_data between workers by default."""
    req = msgs[(msgs.src_role == src_role) & (msgs.dst_role == "worker") & (op is None or msgs.op == op)]
    req = req.drop_duplicates("msg_id").set_index("msg_id")
    rep = msgs[msgs.reply_to.isin(req.index)].drop_duplicates("reply_to").set_index("reply_to")
    x = req.join(rep[["t_first_ns", "t_last_ns", "msg_bytes"]].rename(
        columns={"t_first_ns": "rep_first", "t_last_ns": "rep_last", "msg_bytes": "rep_bytes"}), how="inner")
    return pd.DataFrame({"src": x.src, "dst": x.dst, "req_first": x.t_first_ns, "req_last": x.t_last_ns,
                         "rep_first": x.rep_first, "rep_last": x.rep_last,
                         "rep_bytes": x.rep_bytes}).reset_index(drop=True)


ANSWERS = ("reply", "handshake", "stream-start")  # what the scheduler sends a client that is waiting for it


def client_waits(msgs: pd.DataFrame) -> pd.DataFrame:
    """The client's requests the scheduler answered next on the same connection (a handshake, an
    identity or gather and its reply, register-client and stream-start), with both messages' bytes:
    time in which the client waited on the scheduler, not on itself. Disjoint, in time order."""
    c = msgs[((msgs.src_role == "client") & (msgs.dst_role == "scheduler")) |
             ((msgs.src_role == "scheduler") & (msgs.dst_role == "client"))].drop_duplicates("msg_id")
    c = c.sort_values(["conn", "t_first_ns"], kind="stable")
    nxt = c.groupby("conn")[["src_role", "op", "t_first_ns", "t_last_ns"]].shift(-1)
    hit = (c.src_role == "client") & (nxt.src_role == "scheduler") & nxt.op.isin(ANSWERS)
    req_last = c.t_last_ns[hit].astype("int64")
    # Handshakes cross: on a slow link the scheduler's can reach the proxy before the client's has
    # left it. The overlap is the request's wire time, counted once.
    rep_first = np.maximum(nxt.t_first_ns[hit].astype("int64"), req_last)
    w = pd.DataFrame({"op": c.op[hit], "req_first": c.t_first_ns[hit], "req_last": req_last,
                      "rep_first": rep_first, "rep_last": np.maximum(nxt.t_last_ns[hit].astype("int64"), rep_first)})
    w = w.sort_values("req_first", kind="stable", ignore_index=True)
    return w[w.req_first.to_numpy() >= np.r_[0, np.maximum.accumulate(w.rep_last.to_numpy())[:-1]]]


def client_gaps(window: tuple[int, int], jobs: pd.DataFrame, msgs: pd.DataFrame) -> pd.DataFrame:
    """The session's stretches with no job in the cluster, as critical-path segments: the client's own
    time, less the requests it waited on the scheduler for (their wire time and the scheduler's)."""
    edges = [window[0], *np.ravel(jobs[["start_ns", "end_ns"]].to_numpy("int64")), window[1]]
    starts, ends = np.array(edges[0::2]), np.array(edges[1::2])
    names = np.array(["before the first job"] + ["between jobs"] * (len(jobs) - 1) + ["after the last job"])
    keep = ends > starts
    starts, ends, names = starts[keep], ends[keep], names[keep]
    w = client_waits(msgs)
    pieces = [("network", "client request"), ("scheduler", "answering the client"), ("network", "reply to the client")]
    cols = [("req_first", "req_last"), ("req_last", "rep_first"), ("rep_first", "rep_last")]
    seg = pd.concat([pd.DataFrame({"start_ns": w[a], "end_ns": w[b], "kind": k, "part": p})
                     for (k, p), (a, b) in zip(pieces, cols)]).sort_values("start_ns", kind="stable")
    seg = seg[seg.end_ns > seg.start_ns]
    s0, s1, which = intersect(seg.start_ns, seg.end_ns, starts, ends)
    waited = pd.DataFrame({"start_ns": s0, "end_ns": s1, "kind": seg.kind.to_numpy()[which],
                           "part": seg.part.to_numpy()[which]})
    own0, own1 = subtract(starts, ends, s0, s1)
    own = pd.DataFrame({"start_ns": own0, "end_ns": own1, "kind": "client",
                        "part": "client: " + names[np.searchsorted(starts, own0, side="right") - 1]})
    waited = _through_workers(waited.assign(process=waited.kind.map({"scheduler": "scheduler"})),
                              exchanges(msgs, "scheduler", None))
    out = pd.concat([own.assign(process="client"), waited], ignore_index=True)
    return out.assign(job=-1, key=None, batch_ns=0)[["job", "start_ns", "end_ns", "kind", "part", "key", "process",
                                                     "batch_ns"]]


def _through_workers(waited: pd.DataFrame, x: pd.DataFrame) -> pd.DataFrame:
    """The scheduler answering the client after asking a worker itself (a gather): the exchange whose
    reply came last is the wire's and that worker's time, not the scheduler's."""
    rows = []
    for seg in waited.itertuples(index=False):
        inside = x[(x.req_first >= seg.start_ns) & (x.rep_last <= seg.end_ns)] if seg.kind == "scheduler" else x.iloc[:0]
        if inside.empty:
            rows.append(seg._asdict())
            continue
        e = inside.loc[inside.rep_last.idxmax()]
        for start, end, kind, part, process in (
                (seg.start_ns, e.req_first, "scheduler", seg.part, "scheduler"),
                (e.req_first, e.req_last, "network", "scheduler's request to a worker", None),
                (e.req_last, e.rep_first, "worker", "answering the scheduler", e.dst),
                (e.rep_first, e.rep_last, "network", "worker's reply to the scheduler", None),
                (e.rep_last, seg.end_ns, "scheduler", seg.part, "scheduler")):
            if end > start:
                rows.append({"start_ns": start, "end_ns": end, "kind": kind, "part": part, "process": process})
    return pd.DataFrame(rows, columns=["start_ns", "end_ns", "kind", "part", "process"])
