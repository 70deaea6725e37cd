"""The critical path of each job, walked backwards from the last result the
job's submitter was told of (its end) to the job's first byte (its start).

Each step moves one cursor back and gives the stretch it passed over to one
kind of time, so the segments are contiguous and sum to the job's makespan:

- network: a message between its first byte and its last byte at the proxy
  (key-in-memory, task-finished, compute-task, the graph's upload, get_data
  requests and replies between workers);
- compute: a task's compute span on the critical path;
- scheduler / worker: time inside that process, split later by what its
  event-loop thread was doing (attribution.py). A segment that ends with a
  message leaving the process records that stream's batched-send interval;
- queueing: a task waiting on a worker it was then stolen from;
- scheduler_decisions: the steal itself, from the scheduler's steal-request
  to its compute-task to the thief;
- client: the submitter working between a result and its next submission;
- incomplete: a job whose end was not recorded (jobs.complete false), from its
  last told key (or its last graph) to its end (jobs.py): whose time it was is
  unknown (uncategorized).

Per task, backwards: task-finished on the wire <- the worker after compute <-
compute <- (a task that held the thread it waited for) <- the worker before
compute, with its input fetches <- compute-task on the wire <- (earlier
attempts moved off other workers) <- the scheduler since the task's trigger.
The trigger is what `tasks.ready_by` names: the dependency that finished
last, or the task's graph; a task without dependencies that waited for a
queue slot follows the task that freed it. Behind a graph: its upload, and,
unless it is the job's first, the client's time since the result before it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import namedtuple

import numpy as np
import pandas as pd

from .jobs import asks

COLUMNS = ["job", "start_ns", "end_ns", "kind", "part", "key", "process", "batch_ns"]
INCOMPLETE = "job incomplete: its end was not recorded"
SATURATED_COMPUTE = "compute (worker saturation: holding the thread the next task waited for)"
# one thread runs one task at a time, yet a task's recorded start can precede its predecessor's recorded stop
# by tens of microseconds (the worker's clock, converted): within this, the next task waited for that one
HANDOVER_SLACK_NS = 1_000_000
# distributed's batched-send intervals (BatchedSend), by sender and receiver
BATCH_NS = {("scheduler", "worker"): 5_000_000, ("scheduler", "client"): 2_000_000,
            ("worker", "scheduler"): 2_000_000, ("client", "scheduler"): 10_000_000}


class _Lookup:
    """Sorted times per group, for 'the latest event of this group before t'."""

    def __init__(self, df: pd.DataFrame, group: list[str], time: str, value: str = "key"):
        rows = {}  # a pass over the rows, not a frame per group (thousands of groups: tasks)
        d = df.dropna(subset=[time, *group])
        groups = zip(*(d[g].tolist() for g in group)) if len(group) > 1 else d[group[0]].tolist()
        for g, t, v in zip(groups, d[time].to_numpy("float64").tolist(), d[value].tolist()):
            rows.setdefault(g, []).append((t, v))
        self.index = {g: _by_time(r) for g, r in rows.items()}

    def latest(self, group, before: float, after: float = -np.inf, exclude=None):
        # bisect on lists: a scalar lookup per walk step, where numpy's call overhead dominates
        times, values = self.index.get(group, ((), ()))
        i = bisect_right(times, before) - 1
        while i >= 0 and times[i] > after:
            if values[i] != exclude:
                return values[i], times[i]
            i -= 1
        return None, None


def _by_time(rows: list[tuple]) -> tuple[list, list]:
    """(times, values) in time order; equal times (ops of one message) in the order of `rows`."""
    order = np.argsort(np.array([t for t, _ in rows]), kind="stable") if len(rows) > 1 else [0]
    return [rows[i][0] for i in order], [rows[i][1] for i in order]


class _Rows:
    """Row lookup by an index key, as tuples over plain Python columns (nullable ints
    as float with NaN), made on first visit: per-row pandas access is what makes
    large runs slow."""

    def __init__(self, df: pd.DataFrame, index: list[str]):
        self.Row = namedtuple("Row", df.columns)
        self.cols = [df[c].to_numpy("float64", na_value=np.nan).tolist() if str(df[c].dtype) in ("Int64", "int64")
                     else df[c].to_numpy(object).tolist() for c in df.columns]
        keys = zip(*(self.cols[df.columns.get_loc(c)] for c in index)) if len(index) > 1 else \
            self.cols[df.columns.get_loc(index[0])]
        self.index = dict(zip(keys, range(len(df))))

    def get(self, key):
        i = self.index.get(key)
        return None if i is None else self.Row(*(c[i] for c in self.cols))


class _Walk:
    def __init__(self, job: int, start: int, end: int):
        self.job, self.start, self.cursor, self.rows = job, start, end, []

    def back_to(self, t, kind: str, part: str, key=None, process=None, batch_ns: int = 0) -> None:
        """Give [t, cursor] to kind, then move the cursor to t."""
        if t is None or t != t:  # None or NaN: that step was not observed
            return
        t = max(min(int(t), self.cursor), self.start)
        if t < self.cursor:
            self.rows.append((self.job, t, self.cursor, kind, part, key, process, batch_ns))
        self.cursor = t


class _Index:
    """Everything the walk looks up, built once for all jobs."""

    def __init__(self, tasks, attempts, graphs, told, exchanges):
        self.tasks = _Rows(tasks, ["job", "key"])
        done = attempts[attempts.outcome == "finished"]
        last = done.sort_values("finished_recv_ns", kind="stable").drop_duplicates("key", keep="last")
        self.finished = _Rows(last, ["key"])
        self.same_thread = _Lookup(done.assign(ref=list(zip(done.job, done.key))), ["worker", "thread"],
                                   "compute_stop_ns", "ref")
        self.same_worker = _Lookup(done.assign(ref=list(zip(done.job, done.key))), ["worker"], "finished_recv_ns", "ref")
        moved = attempts[~attempts.outcome.isin(["finished", "erred", "unfinished"])]
        moved = moved.sort_values("compute_sent_ns", kind="stable")
        self.moved = {k: list(g.itertuples(index=False)) for k, g in moved.groupby(["job", "key"])}
        self.graphs = _Rows(graphs, ["graph_id"])
        self.first_graph = graphs.sort_values("t_first_ns", kind="stable").groupby("job").graph_id.first().to_dict()
        self.last_graph = graphs.sort_values("done_ns", kind="stable").groupby("job").graph_id.last().to_dict()
        self.asks = _Lookup(asks(graphs), ["job", "key"], "t_last_ns", "graph_id")
        self.told = _Rows(told, ["told_id"])
        self.told_to = _Lookup(told, ["dst"], "t_last_ns", "told_id")
        self.exchanges = _Lookup(exchanges.assign(ref=np.arange(len(exchanges))), ["src"], "req_first", "ref")
        self.exchange = exchanges.reset_index(drop=True)


def critical_paths(jobs: pd.DataFrame, tasks: pd.DataFrame, attempts: pd.DataFrame, graphs: pd.DataFrame,
                   told: pd.DataFrame, exchanges: pd.DataFrame) -> pd.DataFrame:
    """Segments of every job's critical path (COLUMNS)."""
    ix = _Index(tasks, attempts, graphs, told, exchanges)
    rows = []
    for j in jobs.itertuples():
        w = _Walk(j.job, int(j.start_ns), int(j.end_ns))
        _walk(w, ix, j)
        w.back_to(w.start, "client", "client: submitting")  # only if a step was not observed
        rows += w.rows[::-1]
    return pd.DataFrame(rows, columns=COLUMNS)


def _walk(w: _Walk, ix: _Index, job) -> None:
    """Step back from the job's end until its start; each step returns the next."""
    if not job.complete:
        w.back_to(job.last_told_ns, "incomplete", INCOMPLETE)
    step = ("told", job.end_told) if pd.notna(job.end_told) else ("graph", ix.last_graph[job.job])
    seen = set()
    while step is not None and w.cursor > w.start and step not in seen:
        seen.add(step)
        kind, ref = step
        step = {"told": _at_told, "finish": _at_finish, "compute": _at_compute, "graph": _at_graph,
                "held": lambda *a: _at_compute(*a, holding=True)}[kind](w, ix, ref)


def _at_told(w: _Walk, ix: _Index, told_id):
    m = ix.told.get(told_id)
    w.back_to(m.t_first_ns, "network", f"{m.op} to the client", m.key)
    r = ix.tasks.get((w.job, m.key))
    if r is None or r.outcome != "finished":  # known before the job: told once its graph arrived
        graph, at = ix.asks.latest((w.job, m.key), w.cursor)
        if graph is None:
            return None
        w.back_to(at, "scheduler", "graph to told", m.key, "scheduler", BATCH_NS[("scheduler", "client")])
        return "graph", graph
    w.back_to(r.finished_recv_ns, "scheduler", "task-finished to key-in-memory", m.key, "scheduler",
              BATCH_NS[("scheduler", "client")])
    return "finish", (w.job, m.key)


def _row(ix: _Index, ref):
    """A task row of this job, else that of the job whose dispatch of the key last finished (a key from
    before this job, or one an earlier job dispatched that finished in this one)."""
    r = ix.tasks.get(ref)
    last = ix.finished.get(ref[1]) if r is None else None
    return r if last is None else ix.tasks.get((last.job, last.key))


def _at_finish(w: _Walk, ix: _Index, ref):
    r = _row(ix, ref)
    if r is None:
        return None
    w.back_to(r.finished_sent_ns, "network", "task-finished", r.key)
    w.back_to(r.compute_stop_ns, "worker", "after compute", r.key, r.worker, BATCH_NS[("worker", "scheduler")])
    return "compute", ref


def _at_compute(w: _Walk, ix: _Index, ref, holding: bool = False):
    """`holding`: this task held the thread the task after it on the path waited for (saturation)."""
    r = _row(ix, ref)
    if r is None:
        return None
    w.back_to(r.compute_start_ns, "compute", SATURATED_COMPUTE if holding else "compute", r.key, r.worker)
    held, stop = ix.same_thread.latest((r.worker, r.thread), r.compute_start_ns + HANDOVER_SLACK_NS,
                                       r.compute_recv_ns, exclude=ref)
    if held is not None and not _row(ix, held).compute_start_ns < r.compute_start_ns:
        held = None  # it stopped within the slack but started after this one: it ran next, not before
    if held is not None:
        stop = min(stop, r.compute_start_ns)
        w.back_to(stop, "worker", "worker saturation (waiting for a thread)", r.key, r.worker)
        return "held", held
    if pd.notna(r.transfer_stop_ns) and r.transfer_stop_ns > r.compute_recv_ns:
        w.back_to(r.transfer_stop_ns, "worker", "before compute", r.key, r.worker)
        _fetch(w, ix, r)
    w.back_to(r.compute_recv_ns, "worker", "before compute", r.key, r.worker)
    w.back_to(r.compute_sent_ns, "network", "compute-task", r.key)
    return _at_dispatch(w, ix, r)


def _fetch(w: _Walk, ix: _Index, r) -> None:
    """Input fetches: the get_data exchange whose reply came last, on the wire and in
    the worker that served it; the rest of the transfer span is the fetching worker's."""
    ref, _ = ix.exchanges.latest(r.worker, w.cursor, after=r.transfer_start_ns)
    if ref is not None:
        x = ix.exchange.iloc[ref]
        w.back_to(x.rep_last, "worker", "receiving inputs", r.key, r.worker)
        w.back_to(x.rep_first, "network", "get_data reply (inputs)", r.key)
        w.back_to(x.req_last, "worker", "serving inputs (get_data)", r.key, x.dst)
        w.back_to(x.req_first, "network", "get_data request", r.key)
    w.back_to(r.transfer_start_ns, "worker", "fetching inputs", r.key, r.worker)


def _at_dispatch(w: _Walk, ix: _Index, r):
    """The cursor is at the task's (last) compute-task leaving the scheduler."""
    for prev in reversed(ix.moved.get((w.job, r.key), [])):
        if prev.compute_sent_ns >= w.cursor:
            continue
        if prev.outcome == "stolen":
            w.back_to(prev.moved_ns, "scheduler_decisions", "work stealing (steal-request to re-dispatch)", r.key)
            w.back_to(prev.compute_recv_ns, "queueing", f"worker-side queueing on {prev.worker} (then stolen)",
                      r.key, prev.worker)
        else:
            w.back_to(prev.moved_ns, "scheduler", f"re-dispatch after {prev.outcome}", r.key, "scheduler",
                      BATCH_NS[("scheduler", "worker")])
            w.back_to(prev.compute_recv_ns, "worker", f"on {prev.worker} until {prev.outcome}", r.key, prev.worker)
        w.back_to(prev.compute_sent_ns, "network", "compute-task", r.key)
    batch = BATCH_NS[("scheduler", "worker")]
    if isinstance(r.ready_by, str) and r.ready_by != "graph":
        dep = _row(ix, (w.job, r.ready_by))
        if dep is not None:
            w.back_to(dep.finished_recv_ns, "scheduler", "ready to dispatch", r.key, "scheduler", batch)
            return "finish", (w.job, dep.key)
    g = ix.graphs.get(int(r.graph)) if pd.notna(r.graph) else None
    after = g.t_last_ns if g is not None else -np.inf
    freed, at = ix.same_worker.latest(r.worker, w.cursor, after=after, exclude=(w.job, r.key))
    if freed is not None and len(r.deps) == 0:
        w.back_to(at, "scheduler", "queued until a worker slot freed", r.key, "scheduler", batch)
        return "finish", freed
    if g is None:
        return None
    w.back_to(g.t_last_ns, "scheduler", "graph to dispatch", r.key, "scheduler", batch)
    return "graph", g.graph_id


def _at_graph(w: _Walk, ix: _Index, graph_id):
    g = ix.graphs.get(graph_id)
    w.back_to(g.t_first_ns, "network", "graph upload", None)
    if ix.first_graph.get(w.job) == graph_id:
        return None
    ref, at = ix.told_to.latest(g.src, w.cursor, after=w.start)
    if ref is None:
        w.back_to(w.start, "client", "client: submitting", None, g.src)
        return None
    w.back_to(at, "client", "client: between a result and its next submission", None, g.src)
    return "told", ref
