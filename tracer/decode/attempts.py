"""Join the task events into attempts: one row per compute-task the scheduler
sent, with how it ended on that worker.

An attempt is `finished` (task-finished), `erred` (task-erred), `stolen`
(a steal-request to its worker, then no result from there), `rescheduled`
(its worker asked for it to run elsewhere), `released` (free-keys before any
result) or `unfinished`. A result is matched to its dispatch by (key, run_id)
where the protocol carries run_id (distributed 2022+), else by (key, worker),
the first result after the dispatch. Startstops (wall seconds, on the
scheduler's clock by the worker's estimate) are mapped to the run's clock.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from dask.utils import key_split

SPAN_COLUMNS = ["compute_start_ns", "compute_stop_ns", "transfer_start_ns", "transfer_stop_ns"]
OUTCOMES = ("finished", "erred", "stolen", "rescheduled", "released", "unfinished")


def attempts_table(ev: dict, msgs: pd.DataFrame, anchor: dict) -> pd.DataFrame:
    first = msgs.drop_duplicates("msg_id").set_index("msg_id")
    at = lambda col, msg: first[col].reindex(msg).to_numpy()
    c = ev["compute"]
    c = c[c.key.notna()]  # a compute-task without a key dispatches nothing (its message row stays)
    a = pd.DataFrame({"key": c.key, "run_id": c.run_id.astype("Int64"), "worker": at("dst", c.message),
                      "deps": c.deps, "compute_sent_ns": at("t_first_ns", c.message).astype("int64"),
                      "compute_recv_ns": at("t_last_ns", c.message).astype("int64")})
    a = a.sort_values("compute_sent_ns", kind="stable", ignore_index=True)
    a.insert(1, "attempt", a.groupby("key").cumcount())
    a = _with_results(a, ev["finished"], first, anchor)
    a = _with_moves(a, ev["moves"], first)
    a["prefix"] = prefixes(a.key)
    return a


def _with_results(a: pd.DataFrame, f: pd.DataFrame, first: pd.DataFrame, anchor: dict) -> pd.DataFrame:
    offset_s = (anchor["wall_ns"] - anchor["monotonic_ns"]) / 1e9
    r = pd.DataFrame({"key": f.key, "run_id": f.run_id.astype("Int64"), "worker": first.src.reindex(f.message).to_numpy(),
                      "erred": f.erred.to_numpy(bool), "finished_sent_ns": first.t_first_ns.reindex(f.message).to_numpy(),
                      "finished_recv_ns": first.t_last_ns.reindex(f.message).to_numpy(),
                      "nbytes": f.nbytes.astype("Int64"), "thread": f.thread.astype("Int64"),
                      **{col: _to_ns(f[col.replace("_ns", "_s")], offset_s) for col in SPAN_COLUMNS}})
    if r.empty or a.empty:
        out = a.assign(**{c: pd.array([pd.NA] * len(a), dtype="Int64") for c in r.columns if c not in a and c != "erred"},
                       erred=False)
    elif a.run_id.notna().all() and r.run_id.notna().all():
        r = r.drop_duplicates(["key", "run_id"], keep="first").drop(columns="worker")
        out = a.merge(r, on=["key", "run_id"], how="left")
    else:  # the first result from the attempt's worker after its dispatch
        r = r.rename(columns={"finished_sent_ns": "t"}).dropna(subset=["t"]).astype({"t": "int64"})
        out = pd.merge_asof(a.reset_index().sort_values("compute_sent_ns", kind="stable"),
                            r.sort_values("t", kind="stable"), left_on="compute_sent_ns", right_on="t",
                            by=["key", "worker"], direction="forward")
        out = out.sort_values("index", kind="stable").drop(columns=["index", "run_id_y"])
        out = out.rename(columns={"t": "finished_sent_ns", "run_id_x": "run_id"})
        out = _one_result_per_event(out)
    for col in ("finished_sent_ns", "finished_recv_ns", *SPAN_COLUMNS):
        out[col] = out[col].astype("Int64")
    out["outcome"] = np.where(out.finished_recv_ns.isna(), "unfinished",
                              np.where(out.erred.fillna(False).astype(bool), "erred", "finished"))
    return out.drop(columns="erred")


def _one_result_per_event(a: pd.DataFrame) -> pd.DataFrame:
    """Without run_id, two dispatches of a key to one worker may find the same result:
    it belongs to the later one (the earlier was superseded)."""
    dup = a.dropna(subset=["finished_sent_ns"]).duplicated(["key", "worker", "finished_sent_ns"], keep="last")
    cols = ["finished_sent_ns", "finished_recv_ns", "nbytes", "thread", "erred", *SPAN_COLUMNS]
    a.loc[dup[dup].index, cols] = None
    return a


def _with_moves(a: pd.DataFrame, moves: pd.DataFrame, first: pd.DataFrame) -> pd.DataFrame:
    """For attempts without a result: the first move of the key on that worker after the dispatch."""
    a["moved_ns"] = pd.array([pd.NA] * len(a), dtype="Int64")
    open_ = a.outcome == "unfinished"
    if moves.empty or not open_.any():
        return a
    src, dst = first.src.reindex(moves.message).to_numpy(), first.dst.reindex(moves.message).to_numpy()
    mv = pd.DataFrame({"key": moves.key.to_numpy(), "how": moves.how.to_numpy(),
                       # a worker's own reschedule comes from it; the scheduler's steals and releases go to it
                       "worker": np.where(moves.how.to_numpy() == "rescheduled", src, dst),
                       "t": first.t_first_ns.reindex(moves.message).to_numpy()}).dropna(subset=["t"])
    mv = mv.astype({"t": "int64"}).sort_values("t", kind="stable")
    left = a[open_].reset_index().sort_values("compute_sent_ns", kind="stable")
    hit = pd.merge_asof(left, mv, left_on="compute_sent_ns", right_on="t", by=["key", "worker"],
                        direction="forward").set_index("index")
    found = hit.t.notna()
    a.loc[hit.index[found], "moved_ns"] = hit.t[found].astype("int64")
    a.loc[hit.index[found], "outcome"] = hit.how[found]
    return a


def _to_ns(wall: pd.Series, offset_s: float) -> np.ndarray:
    """Wall seconds to the run's clock; a time no run could have (a peer's 2**64-1, say) is unknown."""
    ns = ((wall.astype("float64") - offset_s) * 1e9).round()
    return ns.where((ns >= 0) & (ns < 2.0**62)).astype("Int64").to_numpy()


def prefixes(keys: pd.Series) -> pd.Series:
    """dask's key_split per key. A trailing -<digits> never changes it (key_split stops at the
    first word that is not alphabetic), so it runs once per stem, not once per key."""
    stems = keys.astype("str").str.replace(r"-\d+$", "", regex=True)
    unique = stems.unique()
    return stems.map(dict(zip(unique, map(key_split, unique))))


def clock_table(clock: list, first: pd.DataFrame) -> pd.DataFrame:
    """Heartbeats: the worker's `now` in its request, the scheduler's `time` in the reply."""
    rows = [(first.src.get(req), first.t_last_ns.get(rep), now, t) for req, now, rep, t in clock]
    return pd.DataFrame(rows, columns=["src", "t_last_ns", "now", "time"])


def undo_scheduler_delay(a: pd.DataFrame, clock: pd.DataFrame, anchor: dict) -> pd.DataFrame:
    """Workers add `scheduler_delay` to startstops: their estimate of the
    scheduler's clock offset, remade at each heartbeat as
    reply.time - (request.now + end) / 2, where `end` is when the worker read
    the reply. Both times travel on the wire; the proxy sees the reply a little
    before the worker reads it, so the wire estimate is an upper bound. Within
    one heartbeat epoch the delay is constant: take the wire estimate, clamped
    so that every compute span lies between its compute-task arriving and its
    task-finished leaving (per span where the epoch's cannot all fit). On one host the true offset is zero, so what is
    taken off is exactly the worker's own error."""
    a["scheduler_delay_ns"] = 0
    if clock.empty or a.compute_stop_ns.isna().all():
        return a
    offset_s = (anchor["wall_ns"] - anchor["monotonic_ns"]) / 1e9
    steps = clock.dropna().assign(delay_ns=lambda c: ((c.time - (c.now + c.t_last_ns / 1e9 + offset_s) / 2) * 1e9)
                                  .round().astype("int64"))
    steps = steps.assign(epoch=np.arange(len(steps)), finished_sent_ns=steps.t_last_ns.astype("int64"))
    steps = steps.rename(columns={"src": "worker"}).sort_values("finished_sent_ns", kind="stable")
    t = a[a.compute_stop_ns.notna() & a.finished_sent_ns.notna()].reset_index()
    t = t.assign(finished_sent_ns=t.finished_sent_ns.astype("int64")).sort_values("finished_sent_ns", kind="stable")
    t = pd.merge_asof(t, steps[["worker", "finished_sent_ns", "delay_ns", "epoch"]], on="finished_sent_ns",
                      by="worker", direction="backward")
    t["delay_ns"], t["epoch"] = t.delay_ns.fillna(0), t.epoch.fillna(-1)
    by = [t.worker, t.epoch]
    lo = (t.compute_stop_ns - t.finished_sent_ns).groupby(by).max()
    hi = (t.compute_start_ns - t.compute_recv_ns).groupby(by).min()
    wire_delay = t.delay_ns.groupby(by).first()
    chosen = np.where(lo <= hi, np.clip(wire_delay, lo, hi), lo).astype("int64")
    t["delay_ns"] = pd.Series(chosen, index=wire_delay.index).reindex(
        pd.MultiIndex.from_frame(t[["worker", "epoch"]])).to_numpy()
    # Where an epoch's spans cannot all fit (a heartbeat read late by a busy worker puts a task in
    # the wrong epoch), each span is still kept between its own messages.
    own_lo = (t.compute_stop_ns - t.finished_sent_ns).astype("float64")
    own_hi = (t.compute_start_ns - t.compute_recv_ns).astype("float64")
    t["delay_ns"] = np.where(own_lo <= own_hi, np.clip(t.delay_ns, own_lo, own_hi), own_lo)
    delay = t.set_index("index").delay_ns.reindex(a.index, fill_value=0).astype("int64")
    for col in SPAN_COLUMNS:
        a[col] = a[col] - delay
    a["scheduler_delay_ns"] = delay
    return a
