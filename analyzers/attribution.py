"""Split the critical path into categories.

Segments of the network, queueing, client and the steal itself are their own
category. Compute is compute, but where the thread that ran the task waited
for the GIL or for a CPU (task_threads.py). Time inside a process (scheduler or worker) is split by
what that process's event-loop thread (its main thread) was doing:

- waiting for the GIL (in take_gil): gil_contention;
- runnable, with no CPU free: cpu_starvation; but while another thread of
  the same process held the GIL, gil_contention (given a CPU, the loop would
  have waited for the GIL, whether its holder was on a CPU or preempted):
  the share of the process's sample reads inside the loop's runnable time
  that found such a thread;
- blocked: if another thread of the process did Dask work meanwhile (the
  scheduler materializes graphs on its offload thread while its loop waits),
  that work's category; else, in the last batched-send interval before the
  message that ends the segment, runtime_bookkeeping (part "batching": the
  send was held by the interval while the loop had nothing to do); else idle;
- on a CPU: split in the proportions of that thread's on-CPU samples inside
  the process's segments of the job (classified as in cpu.py).

Thread states come from eBPF where the process has them. Without them the
whole segment is split by the loop thread's samples: on-CPU ones by category,
the others as idle; GIL waits and CPU starvation cannot be told apart then.
Without samples the time is uncategorized. Shares taken from samples carry
their counts (a pool is one process in one job), from which the summary
draws 90% intervals.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .categories import UNCATEGORIZED
from .intervals import inside, intersect, overlap_ns, union
from .task_threads import compute_rows
from .thread_state import of_thread, on_cpu_ns

UNKNOWN = {"incomplete": UNCATEGORIZED}  # kinds of time whose owner is not known (critical_path.INCOMPLETE)
DIRECT = {"network", "compute", "pool", "queueing", "client", "scheduler_decisions", *UNKNOWN}
# A local scheduler's pool (local.py): time of the task's thread around its compute, from the dispatch
# to the result taken in; what it did not wait for (the GIL, a CPU) is Dask's bookkeeping.
POOL_SPAN = ("compute_sent_ns", "finished_recv_ns")
NOT_WORK = {UNCATEGORIZED, "client", "idle", "compute"}
COLUMNS = ["job", "kind", "part", "process", "category", "seconds", "pool", "pool_seconds", "pool_n", "n"]


def attribute(path: pd.DataFrame, processes: pd.DataFrame, states: pd.DataFrame, cpu: pd.DataFrame,
              threads: pd.DataFrame, attempts: pd.DataFrame, task_tids: pd.DataFrame) -> pd.DataFrame:
    """One row per (segment group, category): seconds, and for sample-derived rows their pool.
    `task_tids`: attempt_threads of `attempts`, the threads that ran the tasks."""
    pids = processes.dropna(subset=["pid"]).drop_duplicates("name").set_index("name").pid.astype("int64")
    compute = compute_rows(path[path.kind == "compute"], attempts, task_tids, states, pids)
    pool = compute_rows(path[path.kind == "pool"], attempts, task_tids, states, pids, "runtime_bookkeeping", POOL_SPAN)
    path = path[["job", "kind", "part", "process", "start_ns", "end_ns", "batch_ns"]]  # each filter copies every column
    path = path.assign(seconds=(path.end_ns - path.start_ns) / 1e9)
    cpu = cpu[["t_ns", "pid", "tid", "source", "on_cpu", "owns_gil", "category"]]
    direct = path[path.kind.isin(DIRECT - {"compute", "pool"})]
    rows = [pd.DataFrame({"job": direct.job, "kind": direct.kind, "part": direct.part, "process": direct.process,
                          "category": direct.kind.replace(UNKNOWN), "seconds": direct.seconds}), compute, pool]
    inproc = path[~path.kind.isin(DIRECT)]
    with_states = set(states.pid.unique())
    per_process = {}  # what every job of a process is split by: computed once per process
    for (job, process), segs in inproc.groupby(["job", "process"], sort=False):
        pid = pids.get(process)
        if pid is None:
            rows.append(_all(segs, UNCATEGORIZED))
            continue
        if process not in per_process:
            proc_cpu = cpu[cpu.pid == pid]
            loop = proc_cpu[proc_cpu.tid == pid]
            fallback = _session_counts(inproc[inproc.process == process], loop, pid in with_states)
            per_process[process] = proc_cpu, loop, fallback, of_thread(states, pid, pid)
        proc_cpu, loop, fallback, loop_states = per_process[process]
        if pid in with_states:
            rows.append(_by_states(segs, states, loop_states, proc_cpu, threads, pid, f"{job}:{process}", fallback))
        else:
            rows.append(_by_samples(segs, loop, f"{job}:{process}", fallback))
    out = pd.concat([r for r in rows if len(r)], ignore_index=True).reindex(columns=COLUMNS)
    return out[out.seconds > 0].reset_index(drop=True)


def _all(segs: pd.DataFrame, category: str) -> pd.DataFrame:
    return segs.assign(category=category)[["job", "kind", "part", "process", "category", "seconds"]]


def _session_counts(segs: pd.DataFrame, loop: pd.DataFrame, states: bool) -> pd.Series:
    """The loop thread's samples in all of the process's path segments of the session: what a job
    whose own stretches caught no sample (a short one) is split by, rather than left uncategorized."""
    order = np.argsort(segs.start_ns.to_numpy("int64"))
    s0, s1 = union(segs.start_ns.to_numpy("int64")[order], segs.end_ns.to_numpy("int64")[order])
    hit = loop[inside(loop.t_ns.to_numpy(), s0, s1)]
    return (hit[hit.on_cpu].category if states else hit.category.where(hit.on_cpu, "idle")).value_counts()


def _split(segs: pd.DataFrame, seconds: np.ndarray, counts: pd.Series, pool: str,
           fallback: pd.Series | None = None) -> pd.DataFrame:
    """seconds per segment shared out in the proportions of the pool's sample counts (or, with none,
    of the fallback's: the process's over the session, named so in the pool)."""
    if not int(counts.sum()) and fallback is not None and int(fallback.sum()):
        counts, pool = fallback, f"{pool} (the session's samples)"
    n = int(counts.sum())
    if n == 0:
        return _all(segs.assign(seconds=seconds), UNCATEGORIZED)
    k = counts.to_numpy("int64")
    rows = segs.iloc[np.tile(np.arange(len(segs)), len(k))].reset_index(drop=True)  # a block per category
    return rows.assign(category=np.repeat(counts.index.to_numpy(object), len(segs)),
                       seconds=np.tile(seconds, len(k)) * np.repeat(k, len(segs)) / n, pool=pool,
                       pool_seconds=float(seconds.sum()), pool_n=n, n=np.repeat(k, len(segs)))


def _by_samples(segs: pd.DataFrame, loop: pd.DataFrame, pool: str, fallback: pd.Series) -> pd.DataFrame:
    s0, s1 = segs.start_ns.to_numpy("int64"), segs.end_ns.to_numpy("int64")
    order = np.argsort(s0)
    hit = loop[inside(loop.t_ns.to_numpy(), s0[order], s1[order])]
    cats = hit.category.where(hit.on_cpu, "idle")
    return _split(segs, segs.seconds.to_numpy(), cats.value_counts(), pool, fallback)


def _by_states(segs: pd.DataFrame, states: pd.DataFrame, st: dict, proc_cpu: pd.DataFrame, threads: pd.DataFrame,
               pid: int, pool: str, fallback: pd.Series) -> pd.DataFrame:
    """st: the loop thread's states (of_thread)."""
    segs = segs.sort_values("start_ns", kind="stable").reset_index(drop=True)
    s0, s1 = segs.start_ns.to_numpy("int64"), segs.end_ns.to_numpy("int64")
    total = (s1 - s0).astype("float64")
    gil = overlap_ns(s0, s1, *st["gil"]).astype("float64")
    runnable = overlap_ns(s0, s1, *st["runnable"]).astype("float64")
    b0, b1, seg = intersect(s0, s1, *st["blocked"])
    window = np.maximum(s0[seg], s1[seg] - segs.batch_ns.to_numpy("int64")[seg])
    batching_piece = np.clip(np.minimum(b1, s1[seg]) - np.maximum(b0, window), 0, None)
    batching = np.bincount(seg, batching_piece, len(segs))
    rest_blocked = np.bincount(seg, b1 - b0, len(segs)) - batching
    work, work_rows = _offload(segs, b0, b1, seg, window, rest_blocked, proc_cpu, threads, states, pid, pool)
    idle = rest_blocked - work
    oncpu = np.clip(total - gil - runnable - batching - rest_blocked, 0, None)
    loop = proc_cpu[(proc_cpu.tid == pid) & proc_cpu.on_cpu]
    counts = loop[inside(loop.t_ns.to_numpy(), s0, s1)].category.value_counts()
    fixed = [_all(segs.assign(seconds=x / 1e9), cat) for x, cat in ((gil, "gil_contention"), (idle, "idle"))]
    fixed.append(_runnable(segs, runnable / 1e9, proc_cpu, pid, st["runnable"], s0, s1, f"{pool}:runnable"))
    fixed.append(_all(segs.assign(seconds=batching / 1e9, part=segs.part + " (batching)"), "runtime_bookkeeping"))
    parts = [*fixed, work_rows, _split(segs, oncpu / 1e9, counts, f"{pool}:on-cpu", fallback)]
    return pd.concat([p for p in parts if len(p)], ignore_index=True)  # an empty part would make every column object


def _runnable(segs, seconds, proc_cpu, pid, runnable, s0, s1, pool) -> pd.DataFrame:
    """The loop's runnable time: gil_contention in the share of the process's sample reads inside
    it (within the segments) that found another of its threads holding the GIL, the rest
    cpu_starvation. Without such reads (no Python sampler, no runnable time hit), all starvation.
    A read on a tick reports the ticked threads only: a GIL holder on a CPU is among them when its
    own CPU ticks, one off a CPU at the reads every 200 ms."""
    r0, r1, _ = intersect(s0, s1, *runnable)
    reads = proc_cpu[proc_cpu.source == "pyspy"]
    reads = reads[inside(reads.t_ns.to_numpy(), r0, r1)]
    if reads.empty:
        return _all(segs.assign(seconds=seconds), "cpu_starvation")
    held = reads.owns_gil.fillna(False).astype(bool) & (reads.tid != pid)
    per_read = held.groupby(reads.t_ns).any()
    counts = pd.Series({"gil_contention": int(per_read.sum()), "cpu_starvation": int((~per_read).sum())})
    out = _split(segs, seconds, counts[counts > 0], pool)
    out.loc[out.category == "gil_contention", "part"] += " (runnable, GIL held by another thread)"
    return out


def _offload(segs, b0, b1, seg, window, rest_blocked, proc_cpu, threads, states, pid, pool):
    """Blocked loop time (before the batching window) during which the process's other
    threads did Dask work: per segment, the seconds, and their rows by category. A
    thread's part is its on-CPU time there (eBPF) times the share of its on-CPU samples
    there that are Dask work (a thread spinning in code of its own adds nothing)."""
    p0, p1 = b0, np.minimum(b1, window)
    keep = p1 > p0
    p0, p1, pseg = p0[keep], p1[keep], seg[keep]
    per_thread = []  # (tid, ns per segment, its work samples by category)
    order = np.argsort(p0)
    p0, p1, pseg = p0[order], p1[order], pseg[order]
    others = proc_cpu[proc_cpu.on_cpu & (proc_cpu.tid != pid)]
    others = others[inside(others.t_ns.to_numpy(), p0, p1)]
    by_tid = dict(list(others.groupby("tid"))) if len(p0) else {}
    for th in threads[(threads.pid == pid) & threads.tid.isin(by_tid)].itertuples():
        mine = by_tid[th.tid]
        doing = mine[~mine.category.isin(NOT_WORK)]
        if len(doing):
            ns = np.bincount(pseg, on_cpu_ns(states, th, p0, p1), len(segs)) * len(doing) / len(mine)
            per_thread.append((th.tid, ns, doing.category.value_counts()))
    if not per_thread:
        return np.zeros(len(segs)), pd.DataFrame(columns=COLUMNS)
    work = np.sum([ns for _, ns, _ in per_thread], axis=0)
    capped = np.minimum(work, rest_blocked)  # two threads at once still cover the loop's wait once
    scale = np.divide(capped, work, out=np.zeros_like(work), where=work > 0)
    rows = [_split(segs, ns * scale / 1e9, counts, f"{pool}:thread {tid}") for tid, ns, counts in per_thread]
    return capped, pd.concat(rows, ignore_index=True)


def totals(attr: pd.DataFrame, by: list[str] = ()) -> pd.DataFrame:
    """Seconds per category (and `by`), with the sample count behind each and a 90%
    interval from the pools' sampling error (Wilson score, combined over pools)."""
    keys = [*by, "category"]
    out = attr.groupby(keys, dropna=False).seconds.sum().rename("seconds").to_frame()
    sampled = attr.dropna(subset=["pool"])
    if len(sampled):
        per_pool = sampled.groupby([*keys, "pool"]).agg(n=("n", "first"), pool_n=("pool_n", "first"),
                                                       pool_seconds=("pool_seconds", "first")).reset_index()
        lo, hi = wilson(per_pool.n.to_numpy(), per_pool.pool_n.to_numpy())
        per_pool["var"] = (per_pool.pool_seconds.astype("float64") * (hi - lo) / (2 * 1.645)) ** 2
        agg = per_pool.groupby(keys).agg(samples=("n", "sum"), var=("var", "sum"))
        out = out.join(agg)
    out["samples"] = out.get("samples", pd.Series(dtype="float64")).astype("Int64")
    sd = np.sqrt(out.get("var", pd.Series(0.0, index=out.index)).fillna(0.0))
    out["lo"], out["hi"] = (out.seconds - 1.645 * sd).clip(lower=0), out.seconds + 1.645 * sd
    return out.drop(columns=["var"], errors="ignore").reset_index()


def wilson(k, n, z: float = 1.645) -> tuple[np.ndarray, np.ndarray]:
    """90% Wilson score interval of the proportion k / n."""
    k, n = np.asarray(k, dtype="float64"), np.asarray(n, dtype="float64")
    p = np.where(n > 0, k / np.maximum(n, 1), 0.0)
    denom = 1 + z ** 2 / np.maximum(n, 1)
    mid = (p + z ** 2 / (2 * np.maximum(n, 1))) / denom
    half = z * np.sqrt(p * (1 - p) / np.maximum(n, 1) + z ** 2 / (4 * np.maximum(n, 1) ** 2)) / denom
    return np.clip(mid - half, 0, 1), np.clip(mid + half, 0, 1)
