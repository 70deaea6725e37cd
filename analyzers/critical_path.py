"""The critical path of a run, walked backwards from the last requested output
reaching the client, through tasks and messages, to the client's first graph.

Per task, backwards: task-finished on the wire (network) <- its wait in the
worker's send batch (network: batching delay) <- worker work after compute
<- compute <- worker work before compute, with input fetches from other
workers (network) <- compute-task on the wire (network) <- its wait in the
scheduler's send batch (network: batching delay) <- scheduler work since the
task's trigger. A batching delay is measured from the stimulus timestamp the
sender puts in the message (when it built it) to its first byte at the proxy. The trigger is what
the task waited for: the dependency whose task-finished reached the scheduler
last; for a task without dependencies, the latest of the graph's arrival and
the last task-finished from the same worker (which freed the slot a queued
root task waited for). A task that waited for a worker thread follows the task
that held the thread. Every step moves one cursor back, so the segments are
contiguous and sum to the makespan exactly.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import namedtuple

import numpy as np
import pandas as pd

COLUMNS = ["start_ns", "end_ns", "kind", "part", "key"]


class _Lookup:
    """Sorted times per group, for 'the latest event of this group before t'."""

    def __init__(self, df: pd.DataFrame, group: list[str], time: str):
        self.index = {}
        for g, part in df.dropna(subset=[time]).groupby(group):
            part = part.sort_values(time)
            self.index[g if len(group) > 1 else g[0]] = (part[time].to_numpy("float64").tolist(),
                                                         part.key.tolist())

    def latest(self, group, before: float, after: float = -np.inf, exclude=None):
        # bisect on lists: a scalar lookup per walk step, where numpy's call overhead dominates
        times, keys = self.index.get(group, ((), ()))
        i = bisect_right(times, before) - 1
        while i >= 0 and times[i] > after:
            if keys[i] != exclude:
                return keys[i], times[i]
            i -= 1
        return None, None


class _Walk:
    def __init__(self, start: int, end: int):
        self.start, self.cursor, self.rows = start, end, []

    def back_to(self, t, kind: str, part: str, key) -> None:
        """Attribute [t, cursor] to kind, then move the cursor to t."""
        if t is None or t != t:  # None or NaN: that step was not observed
            return
        t = max(min(int(t), self.cursor), self.start)
        if t < self.cursor:
            self.rows.append((t, self.cursor, kind, part, key))
        self.cursor = t


def critical_path(tasks: pd.DataFrame, graph_arrivals: np.ndarray, window: tuple[int, int],
                  end_key: str) -> pd.DataFrame:
    """Segments (start_ns, end_ns, kind, part, key). kind is a category, or
    'scheduler' / 'worker' for time in those processes, split later by samples."""
    start, end = window
    t = _Rows(tasks)
    done = tasks.dropna(subset=["finished_recv_ns"])
    done = dict(zip(done.key.to_numpy(object), done.finished_recv_ns.to_numpy("int64")))
    same_worker = _Lookup(tasks, ["worker"], "finished_recv_ns")
    same_thread = _Lookup(tasks, ["worker", "thread"], "compute_stop_ns")
    graphs = np.sort(np.asarray(graph_arrivals, dtype="float64"))
    w = _Walk(start, end)
    r = t[end_key]
    w.back_to(r.in_memory_sent_ns, "network", "key-in-memory to the client", end_key)
    w.back_to(r.finished_recv_ns, "scheduler", "task-finished to key-in-memory", end_key)
    key, entered_at_finish, seen = end_key, True, set()
    while w.cursor > start and (key, entered_at_finish) not in seen:
        seen.add((key, entered_at_finish))
        r = t[key]
        if entered_at_finish:
            w.back_to(r.finished_sent_ns, "network", "task-finished", key)
            w.back_to(r.finished_built_ns, "network", "batching delay (worker)", key)
            w.back_to(r.compute_stop_ns, "worker", "after compute", key)
        w.back_to(r.compute_start_ns, "compute", "compute", key)
        held, stop = same_thread.latest((r.worker, r.thread), r.compute_start_ns, r.compute_recv_ns, exclude=key)
        if held is not None:
            w.back_to(stop, "worker", "waiting for a thread", key)
            key, entered_at_finish = held, False
            continue
        if pd.notna(r.transfer_stop_ns) and r.transfer_stop_ns > r.compute_recv_ns:
            w.back_to(r.transfer_stop_ns, "worker", "before compute", key)
            w.back_to(r.transfer_start_ns, "network", "fetching inputs from workers", key)
        w.back_to(r.compute_recv_ns, "worker", "before compute", key)
        w.back_to(r.compute_sent_ns, "network", "compute-task", key)
        w.back_to(r.dispatch_built_ns, "network", "batching delay (scheduler)", key)
        trigger, at = _trigger(done, r, key, graphs, same_worker)
        if trigger is None:
            w.back_to(at, "scheduler", "graph to dispatch", key)
            break
        w.back_to(at, "scheduler", "ready to dispatch", key)
        key, entered_at_finish = trigger, True
    w.back_to(start, "network", "graph upload from the client", None)
    return pd.DataFrame(w.rows[::-1], columns=COLUMNS)


class _Rows:
    """task key -> row, as a tuple over plain Python columns (nullable ints as float with NaN),
    made when the walk first visits it: pandas row access, or a tuple for each of a
    million tasks up front, is what made large runs slow."""

    def __init__(self, df: pd.DataFrame):
        self.Row = namedtuple("Row", df.columns)
        self.cols = [df[c].to_numpy("float64", na_value=np.nan).tolist() if str(df[c].dtype) == "Int64"
                     else df[c].to_numpy(object).tolist() for c in df.columns]
        self.index = dict(zip(self.cols[df.columns.get_loc("key")], range(len(df))))

    def __getitem__(self, key):
        i = self.index[key]
        return self.Row(*(c[i] for c in self.cols))


def _trigger(done: dict, r, key, graphs: np.ndarray, same_worker: _Lookup):
    """(task, time) the task waited for; (None, graph arrival) for the graph itself."""
    built = r.dispatch_built_ns if pd.notna(r.dispatch_built_ns) else r.compute_sent_ns
    deps = [d for d in (r.deps if isinstance(r.deps, (list, np.ndarray)) else []) if d in done]
    if deps:
        last = max(deps, key=done.__getitem__)
        return last, done[last]
    i = np.searchsorted(graphs, built, side="right") - 1
    graph = graphs[i] if i >= 0 else None
    freed, at = same_worker.latest(r.worker, built, after=graph if graph is not None else -np.inf, exclude=key)
    return (freed, at) if freed is not None else (None, graph)
