"""Split the makespan into categories along the critical path.

Time the path spends inside the scheduler (or a worker) is split like this:
the part during which that process's event-loop thread waited for the GIL
(eBPF take_gil waits, exact) is gil_contention; the rest is divided in the
proportions of that thread's CPU samples taken inside those stretches,
classified by the rules (analyzers/rules). Samples of a thread that was not
running count as idle (the event loop waiting for something). Without
samples the rest is `uncategorized`: never hidden, never guessed. Worker
time is runtime_bookkeeping apart from its GIL waits.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .categories import CATEGORIES, UNCATEGORIZED
from .critical_path import critical_path


def overlap_ns(starts, ends, iv_starts, iv_ends) -> np.ndarray:
    """Per segment, ns covered by the intervals (each set disjoint within itself):
    covered(b) - covered(a), where covered(t) is the intervals' length before t."""
    order = np.argsort(iv_starts)
    s = np.asarray(iv_starts, dtype="float64")[order]
    e = np.asarray(iv_ends, dtype="float64")[order]
    if not len(s):
        return np.zeros(len(starts), dtype="int64")
    before = np.concatenate([[0.0], np.cumsum(e - s)])  # length of the first k intervals

    def covered(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, t, side="right")  # intervals starting at or before t
        last = np.clip(k - 1, 0, None)
        inside_last = np.clip(np.minimum(t, e[last]) - s[last], 0, None)
        return np.where(k > 0, before[last] + inside_last, 0.0)

    t0, t1 = np.asarray(starts, dtype="float64"), np.asarray(ends, dtype="float64")
    return np.round(covered(t1) - covered(t0)).astype("int64")


def inside(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of times within any of the (sorted, disjoint) segments."""
    i = np.searchsorted(starts, times, side="right") - 1
    return (i >= 0) & (times < ends[np.clip(i, 0, None)])


class Splitter:
    def __init__(self, tables: dict, category: pd.Series):
        self.samples, self.gil, self.category = tables["samples"], tables["gil_waits"], category

    def split(self, seg: pd.DataFrame, pid: int | None, sampled: bool,
              rest: str = "runtime_bookkeeping") -> dict[str, float]:
        """Seconds per category for segments spent in process pid: its GIL waits,
        then the rest by its samples (sampled) or all to `rest`."""
        total = float((seg.end_ns - seg.start_ns).sum())
        if total == 0:
            return {}
        if pid is None:
            return {UNCATEGORIZED if sampled else rest: total / 1e9}
        g = self.gil[(self.gil.pid == pid) & (self.gil.tid == pid)]
        gil = float(overlap_ns(seg.start_ns.to_numpy(), seg.end_ns.to_numpy(), g.start_ns, g.end_ns).sum())
        out = {"gil_contention": gil / 1e9}
        left = total - gil
        if not sampled:
            out[rest] = out.get(rest, 0.0) + left / 1e9
            return out
        mine = self._samples_of(pid)
        hit = mine[inside(mine.t_ns.to_numpy(), seg.start_ns.to_numpy(), seg.end_ns.to_numpy())]
        if hit.empty:
            out[UNCATEGORIZED] = left / 1e9
            return out
        cats = hit.stack_id.map(self.category).where(hit.active.astype(bool), "idle")
        for cat, share in cats.fillna(UNCATEGORIZED).value_counts(normalize=True).items():
            out[cat] = out.get(cat, 0.0) + left * share / 1e9
        return out

    def _samples_of(self, pid: int) -> pd.DataFrame:
        """The event-loop thread's Python samples, or (a native server) all its native samples."""
        s = self.samples[self.samples.pid == pid]
        py = s[(s.source == "pyspy") & (s.tid == pid)]
        return py if not py.empty else s[s.source == "ebpf"]


def breakdown(tables: dict, window: tuple[int, int], end_key: str, category: pd.Series) -> dict:
    """category: stack_id -> category (categories.classify_stacks)."""
    msgs, tasks = tables["messages"], tables["tasks"]
    graphs = msgs[(msgs.src_role == "client") & (msgs.op == "update-graph")].t_last_ns.to_numpy()
    path = critical_path(tasks, graphs, window, end_key)
    path["seconds"] = (path.end_ns - path.start_ns) / 1e9
    pids = tables["processes"].dropna(subset=["pid"]).set_index("name").pid.astype(int)
    splitter = Splitter(tables, category)
    totals = dict.fromkeys(CATEGORIES, 0.0)
    totals["compute"] = float(path[path.kind == "compute"].seconds.sum())
    # A message waiting in its sender's batch while the sender's event loop
    # waited for the GIL is GIL contention, not network.
    net = path[path.kind == "network"]
    batching = net.part.str.startswith("batching delay")
    totals["network"] = float(net[~batching].seconds.sum())
    worker_of = tasks.set_index("key").worker
    groups = [(net[net.part == "batching delay (scheduler)"], pids.get("scheduler"))]
    worker_batching = net[net.part == "batching delay (worker)"]
    groups += [(seg, pids.get(w)) for w, seg in worker_batching.groupby(worker_batching.key.map(worker_of))]
    for seg, pid in groups:
        for cat, s in splitter.split(seg, pid, sampled=False, rest="network").items():
            totals[cat] = totals.get(cat, 0.0) + s
    sched = path[path.kind == "scheduler"]
    for cat, s in splitter.split(sched, pids.get("scheduler"), sampled=True).items():
        totals[cat] = totals.get(cat, 0.0) + s
    work = path[path.kind == "worker"]
    for worker, seg in work.groupby(work.key.map(worker_of)):
        for cat, s in splitter.split(seg, pids.get(worker), sampled=False).items():
            totals[cat] = totals.get(cat, 0.0) + s
    parts = path.groupby(["kind", "part"]).seconds.sum()
    return {"critical_path_s": totals,
            "critical_path_parts_s": {f"{k}: {p}": float(v) for (k, p), v in parts.items()},
            "path": path}
