"""A discrete-event model of the Dask runtime, replaying one captured job.

What it models, in the order a task meets it:
- the scheduler: one event loop, a FIFO server. A graph costs it what the run's did (its last byte to
  its first dispatch); a task-finished costs `task_ns`, and each worker it then chooses `decide_ns`;
- its choice of worker: Dask's (root-ish tasks queued until a worker has a free slot, worker-saturation
  1.1; other tasks to the worker holding most of their inputs, then the least occupied), or random;
- the messages: batched sends (a stream sends at once unless it sent in its last interval, else at the
  interval's end), then the link's latency, plus bytes over its bandwidth for task data between workers;
- each worker: `threads` threads taking ready tasks by priority, each start after the worker's measured
  handoff time, its event loop handing them one at a time (capture.loop_work); each task-finished after
  its measured time from the compute's end; its warm-up once, before its first start (capture.warm_ups);
  and an event loop that serves other workers' get_data one at a time;
- the machine: tasks computing share its cores with its other load (`background`: processor sharing
  of their CPU time, not of their blocked time); the workers' own times stretch as the tasks' CPU
  time does, relative to the run; the threads of one worker share its GIL for the share of CPU that
  holds it.

What it does not: work stealing, spilling, the client's own work (kept as measured), retries,
heartbeats but as a share of the scheduler's loop (Setup.admin_load), memory, the event loops' CPU
as a change changes it (only the run's average load).
The walk back along its own critical path (`split`) gives the predicted time its categories."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from .capture import Job

SATURATION = 1.1  # distributed.scheduler.worker-saturation
BANDWIDTH = 100e6  # distributed.scheduler.bandwidth: the scheduler's estimate, bytes/s
ROOTISH_DEPS = 5  # Scheduler.rootish_tg_threshold
IDLE = 1e-12  # s of occupancy that is none (sums of floats)


@dataclass
class Setup:
    """What one replay runs with: the measured costs, with the changes applied."""
    workers: int
    threads: int
    cores: float  # math.inf: no contention for cores
    background: float  # cores' worth of other work on the machine (the run's, as its tasks' CPU waits show)
    lat_ns: dict
    ns_per_byte: float
    serve_ns: float
    task_ns: float
    decide_ns: float
    batch_ns: dict
    gil_share: float  # 0: the GIL is not contended
    policy: str = "ws"
    delay_ns: float = 0.0
    network: float = 1.0  # factor on wire times (uploads included)
    bookkeeping: float = 1.0  # factor on the runtime's own time (workers', graphs', batching)
    seed: int = 0
    run_rate: float = 1.0  # share of a CPU the run's tasks got while they wanted one (own / (own + runnable))
    think: float = 1.0  # factor on the client's time before sending a graph
    admin_load: float = 0.0  # share of the scheduler's loop taken by heartbeats beyond the run's (scaling.py)
    graph_cpu: float = 1.0  # of a graph's handling, the share that is the scheduler's CPU (the rest: waits)
    run_workers: int = 0  # the run's: its workers' warm-ups are replayed on as many workers as start cold now
    run_cores: float = math.inf  # the run's, on which its workers warmed up together


@dataclass
class Draw:
    """Per task of the job: its compute (own CPU, blocked) and the worker's time around it, ns."""
    own_ns: np.ndarray
    blocked_ns: np.ndarray
    before_ns: np.ndarray
    after_ns: np.ndarray
    held_ns: np.ndarray | None = None  # waits for a GIL a thread beside the tasks held: as measured, no CPU


@dataclass
class Result:
    makespan_ns: float
    split_ns: dict = field(default_factory=dict)
    scheduler_ns: float = 0.0  # the scheduler's work charged in the replay (heartbeats beyond the run's not in)


class _Replay:
    def __init__(self, job: Job, s: Setup, d: Draw):
        self.job, self.s, self.d = job, s, d
        n, W = len(job.keys), s.workers
        self.rng = np.random.default_rng(s.seed)
        self.events, self.seq = [], 0
        self.sched_free, self.loop_free, self.sched_busy = 0.0, [0.0] * W, 0.0
        self.handing = [0.0] * W  # when each worker's loop is done handing tasks to its threads
        self.last_send = {}
        self.dependents = [[] for _ in range(n)]
        for i, ds in enumerate(job.deps):
            for dep in ds:
                self.dependents[dep].append(i)
        self.waiting = [len(ds) for ds in job.deps]
        self.known = [False] * n
        self.where = [set() for _ in range(n)]
        self.free = [s.threads] * W
        self.queue = [[] for _ in range(W)]  # ready on the worker: (prio, task)
        self.processing = [0] * W
        self.occupancy = [0.0] * W
        self.held_bytes = [0.0] * W
        self.root_queue = []  # root-ish tasks the scheduler holds back: (prio, task)
        self.rootish = _rootish(job, W * s.threads) if s.policy == "ws" else [False] * n
        self.expected = _expected(job, d)
        self.turn = 0
        self.t = {name: [math.nan] * n for name in ("ready", "sent", "arr", "inputs", "start", "stop", "fsent", "farr",
                                                    "done", "told")}
        self.trigger, self.held_by = [None] * n, [None] * n
        self.slow = {"gil": [0.0] * n, "cpu": [0.0] * n}
        self.running, self.ps_last, self.version = {}, 0.0, [0] * n
        self.graph_t = [dict() for _ in job.graphs]
        self.warm, self.warm_until = _warm_ups(job, s), [None] * W  # a worker is cold until its first start

    # -- the event queue -------------------------------------------------------------------------
    def at(self, t: float, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def run(self) -> float:
        for g, graph in enumerate(self.job.graphs):
            if graph.trigger is None:
                self.send_graph(graph.think_ns * self.s.think, g)
        while self.events:
            t, _, fn, args = heapq.heappop(self.events)
            fn(t, *args)
        told = [x for x in self.t["told"] if x == x]
        ends = told + [g.get("told", 0.0) for g in self.graph_t]
        return max(ends) if ends else 0.0

    def wire(self, src: str, dst: str, nbytes: float = 0.0) -> float:
        s = self.s
        return s.network * (s.lat_ns[(src, dst)] + nbytes * s.ns_per_byte) + s.delay_ns

    def batched(self, stream, t: float) -> float:
        """When a message put on a batched stream at t leaves: with the batch not yet sent, else at once
        unless the stream sent within its interval, then at the interval's end (distributed's BatchedSend)."""
        kind = (stream[0], stream[1]) if isinstance(stream[0], str) else ("worker", "scheduler")
        interval = self.s.batch_ns.get(kind, 0.0) * self.s.bookkeeping
        last = self.last_send.get(stream, -math.inf)
        if last >= t:
            return last
        leave = max(t, last + interval)
        self.last_send[stream] = leave
        return leave

    def scheduler(self, t: float, cost: float, cpu: float | None = None) -> float:
        """The scheduler's loop takes `cost` from when it is free: when it is done; `cpu` of it its CPU (None:
        all). Heartbeats beyond the run's take their share of the loop, so its own work goes that much slower."""
        self.sched_busy += cost if cpu is None else cpu
        self.sched_free = max(t, self.sched_free) + cost / (1 - self.s.admin_load)
        return self.sched_free

    # -- graphs and the client -------------------------------------------------------------------
    def send_graph(self, t: float, g: int) -> None:
        graph = self.job.graphs[g]
        self.graph_t[g]["sent"] = t
        self.at(t + self.s.network * graph.upload_ns + self.s.delay_ns, self.graph_arrives, g)

    def graph_arrives(self, t: float, g: int) -> None:
        self.graph_t[g]["arr"] = t
        cost = self.job.graphs[g].process_ns * self.s.bookkeeping
        done = self.scheduler(t, cost, cost * self.s.graph_cpu)
        self.graph_t[g]["done"] = done
        ready = [i for i in np.flatnonzero(self.job.graph == g) if not self.known[i]]
        for i in ready:
            self.known[i] = True
            self.trigger[i] = ("graph", g)
        self.dispatch(done, [i for i in ready if self.waiting[i] == 0], arrived=t)
        if g == 0 and self.job.told_before:
            self.graph_t[g]["told"] = self.batched(("scheduler", "client"), done) + self.wire("scheduler", "client")

    def told(self, t: float, i: int) -> None:
        self.t["told"][i] = t
        for g, graph in enumerate(self.job.graphs):
            if graph.trigger == i:
                self.send_graph(t + graph.think_ns * self.s.think, g)

    # -- the scheduler ---------------------------------------------------------------------------
    def dispatch(self, t: float, ready: list[int], arrived: float, freed_by: int | None = None) -> None:
        """Choose workers for the ready tasks, the loop busy from `t`; send their compute-tasks. Root-ish
        tasks queued before go out as slots free: `freed_by`, the task whose finish freed one."""
        chosen = []
        for i in sorted(ready, key=lambda i: self.job.prio[i]):
            self.t["ready"][i] = arrived
            if self.rootish[i]:
                heapq.heappush(self.root_queue, (self.job.prio[i], i))
            else:
                chosen.append((i, self.decide(i)))
        fresh = set(ready)
        for i, w in self.release_roots():
            if freed_by is not None and i not in fresh:
                self.trigger[i] = ("slot", freed_by)
            chosen.append((i, w))
        end = self.scheduler(t, self.s.decide_ns * len(chosen))
        for i, w in chosen:
            self.send_task(end, i, w)

    def release_roots(self) -> list[tuple[int, int]]:
        out = []
        slots = max(math.ceil(SATURATION * self.s.threads), 1)
        while self.root_queue:
            free = [w for w in range(self.s.workers) if self.processing[w] < slots]
            if not free:
                break
            w = min(free, key=lambda w: self.processing[w])
            _, i = heapq.heappop(self.root_queue)
            self.assign(i, w)
            out.append((i, w))
        return out

    def decide(self, i: int) -> int:
        W = self.s.workers
        if self.s.policy == "random":
            w = int(self.rng.integers(W))
        else:
            holders = {w for dep in self.job.deps[i] for w in self.where[dep]}
            holders |= {src % W for src, _ in self.job.ext[i]}
            if len(holders) == 1:
                w = holders.pop()
            elif holders:
                w = min(sorted(holders), key=lambda w: (self.occupancy[w] / self.s.threads
                                                        + self.missing_bytes(i, w) / BANDWIDTH, self.held_bytes[w]))
            else:
                w = min(range(W), key=lambda w: self.occupancy[w])
                if self.occupancy[w] <= IDLE:
                    w = next(x % W for x in range(self.turn, self.turn + W) if self.occupancy[x % W] <= IDLE)
                self.turn += 1
        self.assign(i, w)
        return w

    def assign(self, i: int, w: int) -> None:
        self.processing[w] += 1
        self.occupancy[w] += self.expected[i]

    def missing_bytes(self, i: int, w: int) -> float:
        own = sum(self.job.nbytes[d] for d in self.job.deps[i] if w not in self.where[d])
        return own + sum(b for src, b in self.job.ext[i] if src % self.s.workers != w)

    def send_task(self, t: float, i: int, w: int) -> None:
        leave = self.batched(("scheduler", "worker", w), t)
        self.t["sent"][i] = leave
        self.at(leave + self.wire("scheduler", "worker"), self.task_arrives, i, w)

    def finished(self, t: float, i: int, w: int) -> None:
        """A task-finished reaches the scheduler."""
        self.t["farr"][i] = t
        self.processing[w] -= 1
        self.occupancy[w] = max(0.0, self.occupancy[w] - self.expected[i])
        self.held_bytes[w] += self.job.nbytes[i]
        self.where[i].add(w)
        done = self.scheduler(t, self.s.task_ns)
        self.t["done"][i] = done
        ready = []
        for k in self.dependents[i]:
            self.waiting[k] -= 1
            if self.waiting[k] == 0 and self.known[k]:
                self.trigger[k] = ("dep", i)
                ready.append(k)
        self.dispatch(done, ready, arrived=t, freed_by=i)
        if self.job.wanted[i]:
            leave = self.batched(("scheduler", "client"), done)
            self.at(leave + self.wire("scheduler", "client"), self.told, i)

    # -- the workers -----------------------------------------------------------------------------
    def loop(self, w: int, t: float, cost: float) -> float:
        self.loop_free[w] = max(t, self.loop_free[w]) + cost
        return self.loop_free[w]

    def task_arrives(self, t: float, i: int, w: int) -> None:
        self.t["arr"][i] = t
        sources = {}
        for dep in self.job.deps[i]:
            if w not in self.where[dep]:
                src = min(self.where[dep]) if self.where[dep] else w
                sources[src] = sources.get(src, 0.0) + self.job.nbytes[dep]
        for src, b in self.job.ext[i]:
            if src % self.s.workers != w:
                sources[src % self.s.workers] = sources.get(src % self.s.workers, 0.0) + b
        ready = t
        for src, b in sources.items():
            served = self.loop(src, t + self.wire("worker", "worker"), self.s.serve_ns * self.s.bookkeeping)
            ready = max(ready, served + self.wire("worker", "worker", b))
        for dep in self.job.deps[i]:
            self.where[dep].add(w)
        self.at(ready, self.inputs_ready, i, w)

    def inputs_ready(self, t: float, i: int, w: int) -> None:
        self.t["inputs"][i] = t
        heapq.heappush(self.queue[w], (self.job.prio[i], i))
        self.start_next(t, w, None)

    def start_next(self, t: float, w: int, freed_by) -> None:
        while self.free[w] and self.queue[w]:
            _, i = heapq.heappop(self.queue[w])
            self.free[w] -= 1
            self.held_by[i] = freed_by if t > self.t["inputs"][i] else None
            if self.warm_until[w] is None:  # its threads' first tasks wait for its warm-up together
                self.warm_until[w] = t + (self.warm.pop(0) if self.warm else 0.0)
            handoff = self.worker_time(self.d.before_ns[i])
            self.handing[w] = max(t, self.warm_until[w], self.handing[w]) + handoff
            self.at(self.handing[w], self.compute_starts, i, w)

    def worker_time(self, ns: float) -> float:
        """A worker's own time: as measured, stretched as much more (or less) as the tasks' CPU time is
        stretched now than it was in the run on average (`run_rate`)."""
        return ns * self.s.bookkeeping * self.s.run_rate / self._rates[0]

    # -- compute: processor sharing of the cores, and of each worker's GIL -------------------------
    def compute_starts(self, t: float, i: int, w: int) -> None:
        self.t["start"][i] = t
        self.advance(t)
        self.running[i] = [w, 0.0]
        self.reschedule(t)

    def advance(self, t: float) -> None:
        dt = t - self.ps_last
        if dt > 0:
            for i, r in self.running.items():
                dur, gil, cpu = self.duration(i, r[0])
                if dur > 0:
                    r[1] += dt / dur
                    self.slow["gil"][i] += dt * gil / dur
                    self.slow["cpu"][i] += dt * cpu / dur
        self.ps_last = t

    def rates(self) -> tuple[float, dict]:
        demand, gil = 0.0, {}
        for i, (w, _) in self.running.items():
            f = self.cpu_fraction(i)
            demand += f
            gil[w] = gil.get(w, 0.0) + f * self.s.gil_share
        demand += self.s.background
        rho = min(1.0, self.s.cores / demand) if demand > 0 else 1.0
        return rho, {w: min(1.0, 1.0 / g) if g > 0 else 1.0 for w, g in gil.items()}

    def cpu_fraction(self, i: int) -> float:
        total = self.d.own_ns[i] + self.d.blocked_ns[i] + self.held(i)
        return self.d.own_ns[i] / total if total > 0 else 0.0

    def held(self, i: int) -> float:
        return 0.0 if self.d.held_ns is None else float(self.d.held_ns[i])

    def duration(self, i: int, w: int) -> tuple[float, float, float]:
        """Its compute's length at today's rates, and of that, waits for the GIL and for a CPU."""
        rho, rho_gil = self._rates
        own, g = self.d.own_ns[i], self.s.gil_share
        cpu_wait = own * (1 / rho - 1)
        gil_wait = own * g * (1 / min(rho, rho_gil.get(w, 1.0)) - 1 / rho) + self.held(i)
        return own + self.d.blocked_ns[i] + cpu_wait + gil_wait, gil_wait, cpu_wait

    def reschedule(self, t: float) -> None:
        self._rates = self.rates()
        for i, (w, p) in self.running.items():
            self.version[i] += 1
            dur = self.duration(i, w)[0]
            self.at(t + max(0.0, 1.0 - p) * dur, self.compute_ends, i, self.version[i])

    def compute_ends(self, t: float, i: int, version: int) -> None:
        if version != self.version[i] or i not in self.running:
            return
        self.advance(t)
        w, _ = self.running.pop(i)
        self.reschedule(t)
        self.t["stop"][i] = t
        self.free[w] += 1
        self.start_next(t, w, i)
        self.at(t + self.worker_time(self.d.after_ns[i]), self.report, i, w)

    def report(self, t: float, i: int, w: int) -> None:
        """The worker has its task-finished ready: it leaves on the worker's batched stream."""
        leave = self.batched((w, "scheduler"), t)
        self.t["fsent"][i] = leave
        self.at(leave + self.wire("worker", "scheduler"), self.finished, i, w)

    _rates = (1.0, {})


def _rootish(job: Job, total_threads: int) -> list[bool]:
    """Dask's is_rootish per task: its group has more than twice the cluster's threads and its
    group's dependencies are fewer than ROOTISH_DEPS tasks."""
    size, deps = {}, {}
    for i, g in enumerate(job.group):
        size[g] = size.get(g, 0) + 1
        deps.setdefault(g, set()).update(job.deps[i])
        deps[g].update(f"ext{k}" for k in range(len(job.ext[i])))
    return [size[g] > 2 * total_threads and len(deps[g]) < ROOTISH_DEPS for g in job.group]


def _expected(job: Job, d: Draw) -> list[float]:
    """What the scheduler expects each task to take: its group's mean compute, in s (as occupancy)."""
    spans = d.own_ns + d.blocked_ns
    mean = {}
    for g, x in zip(job.group, spans):
        a = mean.setdefault(g, [0.0, 0])
        a[0] += x
        a[1] += 1
    return [mean[g][0] / mean[g][1] / 1e9 for g in job.group]


def _warm_ups(job: Job, s: Setup) -> list[float]:
    """The job's warm-ups, ns, for the workers to start their first task in it, in that order: as many as
    started cold in the run, scaled by the workers now to the run's. Each is the CPU it took where the run's
    cold workers outnumbered its cores, stretched where they outnumber them now."""
    warm = [float(x) for x in job.warm_ns if x > 0]
    if not warm or not s.run_workers:
        return []
    n = min(s.workers, max(1, round(len(warm) * s.workers / s.run_workers)))
    stretch = min(1.0, s.run_cores / len(warm)) * max(1.0, n / s.cores)
    return [warm[k % len(warm)] * stretch for k in range(n)]


def replay(job: Job, s: Setup, d: Draw) -> Result:
    r = _Replay(job, s, d)
    end = r.run()
    return Result(end, split(r, end), r.sched_busy)


def split(r: _Replay, end: float) -> dict:
    """The replay's critical path walked back from the job's end (the last telling), ns per category:
    as critical_path.py walks the run's, over the replay's own times."""
    walk = _Back(end, r.s.decide_ns / (r.s.decide_ns + r.s.task_ns) if r.s.decide_ns + r.s.task_ns > 0 else 0.0)
    told = [(x, i) for i, x in enumerate(r.t["told"]) if x == x]
    step, seen = (("told", max(told)[1]) if told else None), set()
    while step and step not in seen and walk.cursor > 0:
        seen.add(step)
        step = {"told": _told, "finish": _finish, "graph": _graph}[step[0]](walk, r, step[1])
    walk.back(0.0, "client")  # before the job's first graph: nothing (the job starts there)
    return walk.out


class _Back:
    def __init__(self, end: float, decisions: float):
        self.cursor, self.decisions, self.out = end, decisions, {}

    def back(self, t: float, category: str, scheduler: bool = False) -> None:
        """Give [t, cursor] to the category (time in the scheduler: its decisions' share to theirs)."""
        if t != t:
            return
        t = max(0.0, min(t, self.cursor))
        span = self.cursor - t
        if scheduler:
            self.out["scheduler_decisions"] = self.out.get("scheduler_decisions", 0.0) + span * self.decisions
            span *= 1 - self.decisions
        self.out[category] = self.out.get(category, 0.0) + span
        self.cursor = t


def _told(w: _Back, r: _Replay, i: int):
    w.back(r.t["done"][i], "network")  # the batching wait before it is not told apart here
    return "finish", i


def _finish(w: _Back, r: _Replay, i: int):
    t = r.t
    w.back(t["farr"][i], "runtime_bookkeeping", scheduler=True)
    w.back(t["fsent"][i], "network")
    w.back(t["stop"][i], "runtime_bookkeeping")
    _compute(w, r, i)
    while r.held_by[i] is not None:  # it waited for the thread of the task before it
        w.back(t["stop"][r.held_by[i]], "runtime_bookkeeping")
        i = r.held_by[i]
        _compute(w, r, i)
    w.back(t["inputs"][i], "runtime_bookkeeping")
    w.back(t["arr"][i], "network")  # fetching inputs (their serving included)
    w.back(t["sent"][i], "network")
    trig = r.trigger[i]
    if trig is None:
        return None
    kind, ref = trig
    if kind == "graph":
        w.back(t["ready"][i], "runtime_bookkeeping", scheduler=True)
        return "graph", ref
    w.back(t["farr"][ref], "runtime_bookkeeping", scheduler=True)  # a dependency, or the slot it freed
    return "finish", ref


def _graph(w: _Back, r: _Replay, g: int):
    w.back(r.graph_t[g]["sent"], "network")
    graph = r.job.graphs[g]
    if graph.trigger is None:
        w.back(0.0, "client")
        return None
    w.back(r.t["told"][graph.trigger], "client")
    return "told", graph.trigger


def _compute(w: _Back, r: _Replay, i: int) -> None:
    start, stop = r.t["start"][i], r.t["stop"][i]
    if start != start:
        return
    gil, cpu = r.slow["gil"][i], r.slow["cpu"][i]
    w.back(max(start, stop - max(0.0, stop - start - gil - cpu)), "compute")
    w.back(max(start, stop - max(0.0, stop - start - cpu)), "gil_contention")
    w.back(start, "cpu_starvation")
