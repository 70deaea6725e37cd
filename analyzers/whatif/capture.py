"""The captured jobs as the replay needs them: per job, its tasks (keys, dependencies, measured
compute and its thread's waits, result sizes, where they ran), its graphs (upload, the scheduler's
handling, what the client waited for before sending it) and the keys the client asked for.

Read from the analysis' tables only (tasks, jobs, graphs, messages, attempt_threads,
thread_states, processes): nothing here re-derives what those tables hold."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..intervals import overlap_ns
from ..jobs import asks, graph_jobs, told
from ..thread_state import STATES, of_thread


@dataclass
class Graph:
    upload_ns: float  # its wire time (first to last byte at the proxy), the run's added delay left out
    process_ns: float  # the scheduler's: from its last byte to its first task's dispatch
    trigger: int | None  # the task of the job whose telling the client's sending followed; None: the job's start
    think_ns: float  # client time from that telling (or the job's start) to the graph's first byte
    upload_delays: int = 1  # messages of added delay in its upload


@dataclass
class Job:
    job: int
    measured_ns: int  # its makespan in the run
    keys: list[str]
    deps: list[list[int]]  # dependencies inside the job, as task indices
    ext: list[list[tuple[int, float]]]  # inputs from before the job: (worker index that held it, bytes)
    own_ns: np.ndarray  # compute span less the thread's GIL waits, CPU starvation and blocking
    blocked_ns: np.ndarray  # of the span, blocked (sleep, I/O): needs no CPU
    gil_ns: np.ndarray
    starved_ns: np.ndarray
    nbytes: np.ndarray
    group: list[str]  # Dask's task group (the key's name without its index)
    prefix: list[str]
    prio: np.ndarray  # rank of its first dispatch in the run: Dask's priority, as far as seen
    worker: np.ndarray  # index of the worker it ran on
    graph: np.ndarray  # index in graphs
    wanted: np.ndarray  # the client asked for it
    before_ns: np.ndarray  # its worker's loop's work handing it to a free thread (warm-up out; loop_work)
    after_ns: np.ndarray  # from its compute's end to its task-finished leaving, batching left out
    warm_ns: np.ndarray  # at a worker's first task of the run, its handoff beyond the others' (warm_ups)
    start_ns: np.ndarray  # its compute's start in the run (its load estimate, predict._background)
    graphs: list[Graph] = field(default_factory=list)
    told_before: int = 0  # keys the client asked for that were in memory before the job
    held_ns: np.ndarray | None = None  # waits for a GIL no task held (one thread per worker): replayed as measured


def group_of(key: str) -> str:
    """Dask's task group of a key: a tuple key's name, else the key less its trailing index."""
    if key.startswith("("):
        return key[1:].split(",")[0].strip("'\" ")
    return key.rsplit("-", 1)[0] if key.rsplit("-", 1)[-1].isdigit() else key


def task_threads(tasks: pd.DataFrame, attempts: pd.DataFrame, attempt_tids: pd.DataFrame,
                 processes: pd.DataFrame) -> pd.DataFrame:
    """Per task (tasks' index), the pid of its worker and the tid of the thread that ran it (attempt_threads);
    NaN where unknown."""
    a = attempts[["key", "compute_sent_ns"]].reset_index(drop=True).rename_axis("attempt").reset_index()
    a = a.merge(attempt_tids[["attempt", "tid"]], on="attempt") if len(attempt_tids) else a.assign(tid=np.nan)
    t = tasks[["key", "compute_sent_ns"]].reset_index().merge(a[["key", "compute_sent_ns", "tid"]], how="left")
    pids = processes.dropna(subset=["pid"]).drop_duplicates("name").set_index("name").pid.astype("float64")
    return pd.DataFrame({"pid": tasks.worker.map(pids).astype("float64"),
                         "tid": t.set_index("index").tid.reindex(tasks.index).astype("float64")})


def in_states(pid: pd.Series, tid: pd.Series, start: pd.Series, stop: pd.Series, states: pd.DataFrame) -> pd.DataFrame:
    """Per row, ns of [start, stop) the thread (pid, tid) spent in each of STATES (eBPF); 0 where unknown."""
    out = pd.DataFrame(0, index=pid.index, columns=list(STATES), dtype="int64")
    known = pid.notna() & tid.notna() & start.notna() & stop.notna()
    if states.empty or not known.any():
        return out
    rows = pd.DataFrame({"pid": pid, "tid": tid, "s0": start, "s1": stop})[known].astype("int64")
    for (p, t), g in rows.groupby(["pid", "tid"]):
        st = of_thread(states, p, t)
        for state in STATES:
            out.loc[g.index, state] = overlap_ns(g.s0.to_numpy(), np.maximum(g.s0, g.s1).to_numpy(), *st[state])
    return out


SLOT_FREED_NS = 2e6  # a dispatch this soon after a task-finished reached the scheduler filled the slot it freed


def worker_costs(tasks: pd.DataFrame, batch_ns: int) -> pd.DataFrame:
    """Per finished task, the worker's own time around its compute, ns (NaN where not seen):
    before: from the later of its compute-task (or its inputs) reaching the worker and the end of the
    compute before it on its thread, to its start: the worker handing it to a thread, less the warm-up and
    the waits for the loop's other handoffs (loop_work); after: from its
    compute's end to its task-finished leaving, where the worker had sent none in the batched-send
    interval before (not held by it)."""
    f = tasks[["compute_recv_ns", "transfer_stop_ns", "compute_start_ns", "compute_stop_ns",
               "finished_sent_ns"]].astype("float64")
    arrived = np.fmax(f.compute_recv_ns, f.transfer_stop_ns)
    freed = _previous(tasks[["worker", "thread"]], f.compute_start_ns, f.compute_stop_ns)
    before = f.compute_start_ns - np.fmax(arrived, freed)
    prev = _previous(tasks[["worker"]], f.finished_sent_ns, f.finished_sent_ns)
    after = (f.finished_sent_ns - f.compute_stop_ns).where(~(prev > f.finished_sent_ns - batch_ns))
    costs = pd.DataFrame({"before_ns": before.clip(lower=0), "after_ns": after.clip(lower=0)}, index=tasks.index)
    warm, excess = warm_ups(tasks[["worker", "thread"]], f.compute_start_ns, costs.before_ns)
    before = costs.before_ns - excess
    return costs.assign(before_ns=loop_work(tasks.worker, f.compute_start_ns, before), warm_ns=warm)


def loop_work(worker: pd.Series, start: pd.Series, before: pd.Series) -> pd.Series:
    """Per task, of its handoff, its worker's event loop's own work: what its interval adds to the union of
    the worker's handoffs begun before it. One loop hands tasks to all of a worker's threads, so with two
    threads a handoff also waited for the other's; the replay queues them on the loop (replay.handing),
    which puts that wait back wherever the threads are more than one."""
    d = pd.DataFrame({"worker": worker, "a": start - before, "b": start}).dropna().sort_values(["worker", "a", "b"])
    reach = d.groupby("worker").b.transform(lambda b: b.cummax().shift())
    own = (d.b - np.fmax(d.a, reach.fillna(-np.inf))).clip(lower=0)
    return own.reindex(before.index).fillna(before)


def warm_ups(where: pd.DataFrame, start: pd.Series, before: pd.Series) -> tuple[pd.Series, pd.Series]:
    """A worker warms up once (imports, the first unpickling of a function), its threads' first tasks
    waiting for it together: per task, ns, the worker's warm-up at its first task (the most any of its
    threads' first tasks waited beyond the median task's handoff), and that excess of each first task. The
    replay charges the warm-up to whichever worker starts first, not to those keys, so fewer workers warm
    up fewer times (a cold numpy import, 0.43 s, was charged twice to one worker going from two to one)."""
    started = where.assign(start=start, before=before).dropna(subset=["start"])
    firsts = started.loc[started.groupby(["worker", "thread"]).start.idxmin()]
    excess = (firsts.before - before.median()).clip(lower=0).fillna(0.0)
    first = firsts.groupby("worker").start.idxmin()  # each worker's first task
    warm = pd.Series(excess.groupby(firsts.worker).max().loc[first.index].to_numpy(), index=first.to_numpy())
    zeros = pd.Series(0.0, index=before.index)
    return zeros.add(warm, fill_value=0.0), zeros.add(excess, fill_value=0.0)


def _previous(by: pd.DataFrame, order: pd.Series, value: pd.Series) -> pd.Series:
    """Per row, `value` of the row before it in `order` within its group of `by`."""
    d = by.assign(_order=order, _value=value).sort_values([*by.columns, "_order"], kind="stable")
    return d.groupby(list(by.columns), dropna=False)._value.shift().reindex(by.index)


def jobs_of(t: dict, workers: list[str], delay_ns: int, batch_ns: int) -> list[Job]:
    """The run's complete jobs, in order (`job_graphs`: the graphs with their jobs, where the analysis has
    them already)."""
    tasks = t["tasks"]
    states = t.get("thread_states", pd.DataFrame())
    th = task_threads(tasks, t["attempts"], t.get("attempt_threads", pd.DataFrame()), t["processes"])
    f = tasks[["compute_start_ns", "compute_stop_ns"]].astype("float64")
    waits = in_states(th.pid, th.tid, f.compute_start_ns, f.compute_stop_ns, states)
    tasks = tasks.join(waits).join(worker_costs(tasks, batch_ns))
    held = _holders(tasks, workers)
    tells = told(t["messages"])
    graphs = t["job_graphs"] if "job_graphs" in t else graph_jobs(t["graphs"], t["messages"])[0]
    freed = np.sort(tasks.finished_recv_ns.dropna().to_numpy("float64"))
    out = []
    for j in t["jobs"][t["jobs"].complete].itertuples():
        mine = tasks[(tasks.job == j.job) & (tasks.outcome == "finished")]
        if len(mine):
            out.append(_job(j, mine, graphs[graphs.job == j.job], tells, held, workers, delay_ns, freed))
    return out


def _holders(tasks: pd.DataFrame, workers: list[str]) -> dict:
    """key -> (worker index, bytes) of its last finished computation."""
    f = tasks[tasks.outcome == "finished"].sort_values("finished_recv_ns", kind="stable")
    idx = {w: i for i, w in enumerate(workers)}
    return {k: (idx.get(w, 0), float(0 if pd.isna(b) else b)) for k, w, b in zip(f.key, f.worker, f.nbytes)}


def _job(j, mine: pd.DataFrame, graphs: pd.DataFrame, tells: pd.DataFrame, held: dict, workers: list[str],
         delay_ns: int, freed: np.ndarray) -> Job:
    mine = mine.reset_index(drop=True)
    index = {k: i for i, k in enumerate(mine.key)}
    graphs = graphs.sort_values("t_first_ns", kind="stable").reset_index(drop=True)
    gidx = {g: i for i, g in enumerate(graphs.graph_id)}
    wanted_keys = set(asks(graphs).key)
    deps, ext = [], []
    for ds in mine.deps:
        ds = [str(d) for d in ds]
        deps.append([index[d] for d in ds if d in index])
        ext.append([held.get(d, (0, 0.0)) for d in ds if d not in index])
    span = (mine.compute_stop_ns - mine.compute_start_ns).astype("float64").fillna(0).to_numpy()
    gil, starved, blocked = (mine[s].to_numpy("float64") for s in STATES)
    first = mine.groupby("graph").first_sent_ns.min()
    job = Job(job=int(j.job), measured_ns=int(j.end_ns - j.start_ns), keys=list(mine.key), deps=deps, ext=ext,
              own_ns=np.clip(span - gil - starved - blocked, 0, None), blocked_ns=blocked, gil_ns=gil,
              starved_ns=starved, nbytes=mine.nbytes.astype("float64").fillna(0).to_numpy(),
              group=[group_of(k) for k in mine.key], prefix=list(mine.prefix),
              prio=mine.first_sent_ns.rank(method="first").to_numpy("int64"),
              worker=mine.worker.map({w: i for i, w in enumerate(workers)}).fillna(0).to_numpy("int64"),
              graph=mine.graph.map(gidx).fillna(0).to_numpy("int64"),
              wanted=mine.key.isin(wanted_keys).to_numpy(copy=True),
              before_ns=mine.before_ns.to_numpy("float64"), after_ns=mine.after_ns.to_numpy("float64"),
              warm_ns=mine.warm_ns.to_numpy("float64"), start_ns=mine.compute_start_ns.to_numpy("float64"),
              told_before=len(wanted_keys - set(index)))
    service = _graph_service(graphs.t_last_ns, graphs.graph_id.map(first), freed)
    for g, cost in zip(graphs.itertuples(), service):
        job.graphs.append(_graph(g, cost, tells, index, int(j.start_ns), delay_ns))
    for g in job.graphs:  # the client sent it once told of its trigger: the replay tells it too
        if g.trigger is not None:
            job.wanted[g.trigger] = True
    return job


def _graph_service(arrived: pd.Series, first_sent: pd.Series, freed: np.ndarray) -> list[float]:
    """The scheduler's own time on each graph (in arrival order), ns: from the later of its last byte and
    the previous graph's first dispatch to its own first dispatch. A graph queued behind another (a futures
    loop's submits) waited for it: that wait is the other's cost, not its own. A graph whose first dispatch
    came right after a task-finished reached the scheduler (`freed`, sorted) waited for that slot (its
    tasks queued, as root-ish ones are): the replay makes them wait by its own rules (queued if root-ish,
    else for a thread of their worker), and its own time is the median of the graphs that did not wait."""
    own, queued, done = [], [], -np.inf
    for a, f in zip(arrived.to_numpy("float64"), first_sent.to_numpy("float64", na_value=np.nan)):
        start = max(a, done)
        k = np.searchsorted(freed, f, side="right") - 1 if not np.isnan(f) else -1
        queued.append(k >= 0 and start < freed[k] and f - freed[k] <= SLOT_FREED_NS)
        own.append(0.0 if np.isnan(f) else max(0.0, f - start))
        done = max(done, f) if not np.isnan(f) else done
    typical = float(np.median([s for s, q in zip(own, queued) if not q] or [0.0]))
    return [typical if q else s for s, q in zip(own, queued)]


def _graph(g, process: float, tells: pd.DataFrame, index: dict, start_ns: int, delay_ns: int) -> Graph:
    mine = tells[(tells.dst == g.src) & (tells.t_last_ns <= g.t_first_ns) & (tells.t_last_ns >= start_ns)]
    last = mine.loc[mine.t_last_ns.idxmax()] if len(mine) else None
    trigger = index.get(last.key) if last is not None else None
    since = float(last.t_last_ns) if trigger is not None else float(start_ns)
    return Graph(upload_ns=max(0.0, float(g.t_last_ns - g.t_first_ns) - delay_ns), process_ns=process,
                 trigger=trigger, think_ns=max(0.0, float(g.t_first_ns) - since))
