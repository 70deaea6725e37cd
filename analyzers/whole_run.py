"""Views of the whole run beside the critical path (definitions in summary.DEFINITIONS)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .intervals import union


def worker_idle(attempts: pd.DataFrame, window: tuple[int, int], ended: dict | None = None) -> dict:
    """Per worker, seconds in the window holding no task (from compute-task reaching it
    to its task-finished leaving): the window minus the union of those spans. A worker that
    ended in the window (`ended`: worker -> ns) is idle only until then."""
    out = {}
    held = attempts.dropna(subset=["finished_sent_ns"])
    for worker, t in held.groupby("worker"):
        mine = (window[0], max(window[0], min(window[1], (ended or {}).get(worker, window[1]))))
        s = t.compute_recv_ns.astype("int64").clip(*mine)
        e = t.finished_sent_ns.astype("int64").clip(*mine)
        lo, hi = union(s, e)
        out[worker] = (mine[1] - mine[0] - int((hi - lo).sum())) / 1e9
    return out


def workers_ended(connections: pd.DataFrame | None, window: tuple[int, int]) -> dict:
    """Workers whose every connection closed before the window's end (died, or were retired): worker ->
    when the last closed, in ns. A live worker keeps its stream to the scheduler open to the end."""
    if connections is None or connections.empty or "peer" not in connections:
        return {}
    w = connections[connections.peer.astype("str").str.startswith("worker")]
    if w.empty:
        return {}
    by = w.groupby("peer").closed_ns
    last = by.max()[by.count() == by.size()]  # every connection closed
    return {peer: int(t) for peer, t in last.items() if t < window[1]}


def in_flight(attempts: pd.DataFrame) -> pd.DataFrame:
    """Per worker, the tasks it holds after each change: +1 when a compute-task reaches it, -1 when
    a task-finished leaves it (table in_flight; the trace's counters and the report's figure)."""
    t = attempts.dropna(subset=["compute_recv_ns"])
    up = pd.DataFrame({"worker": t.worker, "t_ns": t.compute_recv_ns.astype("int64"), "d": 1})
    t = t.dropna(subset=["finished_sent_ns"])
    down = pd.DataFrame({"worker": t.worker, "t_ns": t.finished_sent_ns.astype("int64"), "d": -1})
    ev = pd.concat([up, down]).sort_values(["t_ns", "d"], kind="stable")
    ev["tasks"] = ev.groupby("worker").d.cumsum()
    return ev[["worker", "t_ns", "tasks"]].reset_index(drop=True)


def task_overhead(tasks: pd.DataFrame) -> dict:
    over = tasks.overhead_s.dropna().to_numpy()
    return {"mean": float(over.mean()), "p50": float(np.percentile(over, 50)),
            "p90": float(np.percentile(over, 90)), "p99": float(np.percentile(over, 99)),
            "max": float(over.max())} if len(over) else {}


def proc_cpu(proc: pd.DataFrame, name: str, window: tuple[int, int]) -> float | None:
    """CPU seconds process `name` used in the window: its CPU clock (proc), between readings as if steady."""
    p = proc[proc.process == name].sort_values("t_ns")
    if len(p) < 2:
        return None
    cpu = np.interp(list(window), p.t_ns.to_numpy("float64"), p.cpu_s.to_numpy("float64"))
    return float(cpu[1] - cpu[0])


def scheduler_cpu(proc: pd.DataFrame, window: tuple[int, int], n_tasks: int) -> float | None:
    cpu = proc_cpu(proc, "scheduler", window)
    return None if cpu is None or not n_tasks else cpu / n_tasks


def cpu_check(time: pd.DataFrame, cpu: pd.DataFrame, proc: pd.DataFrame, window: tuple[int, int]) -> dict:
    """Per process, the CPU the analysis reports against the kernel's count over the same
    window, with the on-CPU samples that share it out; and, for comparison, what the
    samples alone would say (each on-CPU sample times the gap it stands for)."""
    c = cpu[cpu.on_cpu & (cpu.t_ns >= window[0]) & (cpu.t_ns <= window[1])]
    out = {}
    for name, part in time.groupby("process"):
        kernel = proc_cpu(proc, name, window)
        reported = float(part.seconds.sum())
        out[name] = {"reported_s": reported, "proc_s": kernel, "ratio": reported / kernel if kernel else None,
                     "on_cpu_samples": int(part.samples.sum()),
                     "samples_alone_s": float(c[c.process == name].weight_s.sum())}
    return out
