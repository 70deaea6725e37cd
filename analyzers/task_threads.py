"""Inside a task: the critical path's compute time split by the state of the thread that ran the task.

A task thread waiting to take the GIL (eBPF: take_gil's sleeps) spends that time in gil_contention,
one runnable without a CPU in cpu_starvation: time Dask's startstops count as compute, which no
change to the task's own code would shorten. The rest (on a CPU, or blocked in the task's own I/O or
sleep, a part of its own) stays compute. Without the thread (no sample named it) or its states (no eBPF), all of it is
compute, as Dask counts it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .intervals import overlap_ns
from .thread_state import of_thread

WAITS = (("gil", "gil_contention", " (task thread waiting for the GIL)"),
         ("runnable", "cpu_starvation", " (task thread runnable without a CPU)"),
         # the task's own I/O, sleep or lock: compute as Dask counts it, told apart for the findings
         ("blocked", None, TASK_BLOCKED := " (task thread blocked)"))  # None: the segment's own category
COLUMNS = ["job", "kind", "part", "process", "category", "seconds"]
COMPUTE_SPAN = ("compute_start_ns", "compute_stop_ns")


def compute_rows(segs: pd.DataFrame, attempts: pd.DataFrame, task_tids: pd.DataFrame, states: pd.DataFrame,
                 pids: pd.Series, rest: str = "compute", span: tuple[str, str] = COMPUTE_SPAN) -> pd.DataFrame:
    """Attribution rows of the path's compute segments (`segs`: job, part, process, key, start_ns, end_ns).
    `task_tids`: attempt_threads of `attempts` (attempt: its row number there, tid); `pids`: name -> pid.
    Other segments of a task's thread likewise (a local scheduler's pool): the time it did not wait
    goes to `rest`; its task's attempt is the one whose `span` (two columns of attempts) holds the
    segment's start."""
    segs = segs.reset_index(drop=True)
    if segs.empty:  # none of these segments (a cluster's run has no pool's): no merges to pay for
        return segs.assign(category=rest, seconds=np.zeros(0))[COLUMNS]
    s0, s1 = segs.start_ns.to_numpy("int64"), segs.end_ns.to_numpy("int64")
    waited = {state: np.zeros(len(segs), dtype="int64") for state, _, _ in WAITS}
    tid = _task_thread(segs, attempts, task_tids, span)
    pid = segs.process.map(pids)
    known = tid.notna() & pid.isin(states.pid.unique())
    for (p, t), idx in segs[known].groupby([pid[known].astype("int64"), tid[known].astype("int64")]).groups.items():
        st, i = of_thread(states, p, t), idx.to_numpy()
        for state, _, _ in WAITS:
            waited[state][i] = overlap_ns(s0[i], s1[i], *st[state])
    own = (s1 - s0) - sum(waited.values())
    rows = [segs.assign(category=rest, seconds=np.clip(own, 0, None) / 1e9)]
    rows += [segs.assign(category=cat or rest, part=segs.part + why, seconds=waited[state] / 1e9)
             for state, cat, why in WAITS]
    out = pd.concat(rows, ignore_index=True)
    return out.loc[out.seconds > 0, COLUMNS]


def _task_thread(segs: pd.DataFrame, attempts: pd.DataFrame, task_tids: pd.DataFrame,
                 span: tuple[str, str] = COMPUTE_SPAN) -> pd.Series:
    """Per segment, the tid of the thread that computed it: the attempt of its key, job and worker whose
    span (compute span) holds the segment's start."""
    a = attempts[["job", "key", "worker", *span]].reset_index(drop=True)
    a = a.rename_axis("attempt").reset_index().merge(task_tids[["attempt", "tid"]], on="attempt")
    m = segs[["job", "key", "process", "start_ns"]].reset_index().merge(
        a, left_on=["job", "key", "process"], right_on=["job", "key", "worker"])
    s0, s1 = (m[c].astype("float64") for c in span)  # a span without an end holds nothing
    m = m[(s0 <= m.start_ns) & (m.start_ns < s1)]
    return m.drop_duplicates("index").set_index("index").tid.reindex(segs.index)
