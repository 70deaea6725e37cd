"""What the runtime cost per message and per task in the run, as the replay charges it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..critical_path import BATCH_NS
from ..intervals import overlap_ns
from ..jobs import exchanges
from ..thread_state import of_thread
from ..whole_run import scheduler_cpu

ROUTES = {("scheduler", "worker"): "compute-task", ("worker", "scheduler"): "task-finished",
          ("scheduler", "client"): "key-in-memory"}
BIG = 100_000  # a transfer of at least this many bytes times the link's bandwidth; below, its latency


@dataclass
class Costs:
    workers: list[str]
    threads: int
    cores: int
    delay_ns: float  # the link latency the run added (run --delay-ms)
    lat_ns: dict  # (sender role, receiver role) -> a message's wire time, the added delay left out
    ns_per_byte: float  # between workers, past the latency
    serve_ns: float  # a worker answering another's get_data
    task_ns: float  # the scheduler's time per task, but its decisions
    decide_ns: float  # the scheduler's time per decision (choosing a worker)
    loop_gil: float  # share of the scheduler's busy time spent waiting for the GIL
    gil_share: float  # share of the tasks' CPU time that holds the GIL (on-CPU samples in compute)
    batch_ns: dict  # batched-send intervals, as critical_path.BATCH_NS
    graph_cpu: float = 1.0  # of the graphs' handling (their wall time, as replayed), the share that was CPU


def layout(t: dict, meta: dict) -> tuple[list[str], int, int, float]:
    """The run's workers (by name, in order), threads per worker, cores and added link latency (ns)."""
    c = meta.get("cluster", {})
    workers = set(t["tasks"].worker.dropna()) | set(_members(t["processes"]))
    workers = sorted(workers, key=_natural) or ["worker-0"]
    cores = int(meta.get("cpus") or 2)
    threads = int(c.get("threads") or math.ceil(cores / len(workers)))  # LocalCluster's default
    return workers, threads, cores, float(c.get("proxy_delay_us") or 0) * 1e3


def measure(t: dict, meta: dict, spans: list[tuple[int, int]], n_tasks: int) -> Costs:
    """`spans`: the jobs' windows. The scheduler's time on graphs (from one's last byte to its first
    dispatch) is charged apart, per graph, as measured: not per task."""
    workers, threads, cores, delay = layout(t, meta)
    msgs = t["messages"]
    busy, gil = _scheduler_busy(t, spans)
    graphs = _graph_spans(t)
    graph_busy = _scheduler_busy(t, graphs)[0]
    per_task = max(0.0, busy - graph_busy) / max(1, n_tasks)
    graph_wall = sum(b - a for a, b in graphs)
    share = _decision_share(t.get("cpu_samples"), spans)
    lat = _latencies(msgs, delay)
    x = exchanges(msgs)
    lat[("worker", "worker")] = _median((x.req_last - x.req_first) - delay, lat[("worker", "scheduler")])
    return Costs(workers=workers, threads=threads, cores=cores, delay_ns=delay, lat_ns=lat,
                 ns_per_byte=_per_byte(x, lat[("worker", "worker")] + delay),
                 serve_ns=_median(x.rep_first - x.req_last, 0.0), task_ns=per_task * (1 - share),
                 decide_ns=per_task * share, loop_gil=gil / busy if busy else 0.0,
                 gil_share=_gil_share(t.get("cpu_samples")), batch_ns=dict(BATCH_NS),
                 graph_cpu=min(1.0, graph_busy / graph_wall) if graph_busy > 0 else 1.0)


def _natural(name: str):
    tail = name.rsplit("-", 1)[-1]
    return (name.rsplit("-", 1)[0], int(tail)) if tail.isdigit() else (name, -1)


def _members(processes: pd.DataFrame) -> list[str]:
    return processes[processes.role == "worker"].name.dropna().tolist()


def _median(values, default: float) -> float:
    v = pd.Series(values, dtype="float64").dropna()
    return float(max(0.0, v.median())) if len(v) else float(default)


def _latencies(msgs: pd.DataFrame, delay: float) -> dict:
    m = msgs.drop_duplicates("msg_id")
    wire = (m.t_last_ns - m.t_first_ns).astype("float64") - delay
    out = {}
    for (src, dst), op in ROUTES.items():
        mine = (m.src_role == src) & (m.dst_role == dst) & (m.op == op)
        out[(src, dst)] = _median(wire[mine], 50_000.0)
    out[("client", "scheduler")] = out[("scheduler", "client")]
    return out


def _per_byte(x: pd.DataFrame, latency: float) -> float:
    big = x[x.rep_bytes >= BIG]
    if big.empty:
        return 0.0
    return float(max(0.0, ((big.rep_last - big.rep_first) - latency).clip(lower=0).sum() / big.rep_bytes.sum()))


def _scheduler_busy(t: dict, spans: list[tuple[int, int]]) -> tuple[float, float]:
    """ns the scheduler worked in the jobs: its CPU time (proc) and its event loop's waits for the GIL
    (eBPF thread states), and of those the waits. Its time runnable without a CPU is left out: the
    machine's load, not the scheduler's cost. Without proc, the time its loop was not blocked."""
    p = t["processes"]
    pid = p[p.name == "scheduler"].pid.dropna()
    states = t.get("thread_states", pd.DataFrame())
    s0 = np.array([a for a, _ in spans], dtype="int64")
    s1 = np.array([b for _, b in spans], dtype="int64")
    st = of_thread(states, int(pid.iloc[0]), int(pid.iloc[0])) if len(pid) and len(states) else None
    gil = float(overlap_ns(s0, s1, *st["gil"]).sum()) if st else 0.0
    cpu = [scheduler_cpu(t["proc"], span, 1) for span in spans] if t.get("proc") is not None else []
    if any(c is not None for c in cpu):
        return float(sum(c for c in cpu if c) * 1e9) + gil, gil
    if st:
        return float((s1 - s0).sum() - overlap_ns(s0, s1, *st["blocked"]).sum()), gil
    return 0.0, 0.0


def _graph_spans(t: dict) -> list[tuple[int, int]]:
    """Per graph, from its last byte to its first task's dispatch."""
    first = t["tasks"].dropna(subset=["graph"]).groupby("graph").first_sent_ns.min()
    g = t["graphs"].set_index("graph_id").t_last_ns
    both = pd.concat([g.rename("a"), first.rename("b")], axis=1, join="inner")
    return [(int(a), int(b)) for a, b in zip(both.a, both.b) if b > a]


def _decision_share(cpu: pd.DataFrame | None, spans: list[tuple[int, int]]) -> float:
    """Of the scheduler's on-CPU samples in the jobs, the share (by time) in scheduler_decisions."""
    if cpu is None or cpu.empty:
        return 0.0
    s = cpu[(cpu.process == "scheduler") & cpu.on_cpu]
    inside = np.zeros(len(s), dtype=bool)
    for a, b in spans:
        inside |= (s.t_ns >= a).to_numpy() & (s.t_ns <= b).to_numpy()
    s = s[inside]
    total = s.weight_s.sum()
    return float(s.weight_s[s.category == "scheduler_decisions"].sum() / total) if total else 0.0


def _gil_share(cpu: pd.DataFrame | None) -> float:
    """Share of the tasks' on-CPU Python samples that held the GIL (0 where none say)."""
    if cpu is None or cpu.empty:
        return 0.0
    c = cpu[(cpu.category == "compute") & cpu.on_cpu].owns_gil.dropna()
    return float(c.astype(bool).mean()) if len(c) else 0.0
