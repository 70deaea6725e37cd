"""Predictions: each job replayed as the run had it and as changed, with the same draws.

A draw is the run's own durations (draw 0) or durations resampled within each task group and the
workers' per-task costs resampled from the run's (the others). The prediction is the changed replay
of draw 0; the interval spans the draws' (5th to 95th percentile), widened by the unchanged replay's
own error (how far the model is from the run before any change). Time outside the jobs (the client's
between them) is kept as measured."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np
import pandas as pd

from .capture import Job, jobs_of
from ..critical_path import BATCH_NS
from ..whole_run import proc_cpu
from .costs import Costs, layout, measure
from .replay import Draw, Setup, replay
from .scaling import MAX_ADMIN_LOAD, Fit, ground

CATEGORIES = ("compute", "gil_contention", "cpu_starvation", "network", "scheduler_decisions",
              "runtime_bookkeeping", "client")
SAMPLES = 10
UNSTARVED = 0.05  # tasks that waited less than this share of their time for a CPU: no load besides them
FEW_CPUS = 0.1  # tasks that wanted a CPU less than this on average (cores): too little to tell a load from
MAX_LOAD = 4  # at most this many times the cores of load besides the tasks


class NotModelled(ValueError):
    """A change the model cannot predict."""


@dataclass(frozen=True)
class Changes:
    workers: int | None = None
    threads: int | None = None
    delay_ms: float | None = None  # link latency, as run --delay-ms (replaces the run's)
    network: float | None = None  # factor on wire times
    decisions: float | None = None  # factor on the scheduler's decisions
    bookkeeping: float | None = None  # factor on the runtime's other time (scheduler, workers, batching)
    gil: bool = True  # False: no thread waits for the GIL
    scheduler: str | None = None  # ws or random
    runtime: str | None = None  # only dask's is modelled
    cores: int | None = None  # the machine's cores
    load: float | None = None  # factor on the machine's load besides the tasks (0: a quiet machine)
    blocked: float | None = None  # factor on the time tasks were blocked (sleep, I/O)
    client: float | None = None  # factor on the client's own time (between jobs; before a graph sent after a result)
    at_median: tuple[str, ...] = ()  # keys whose compute takes their prefix's median in their job

    def text(self) -> str:
        made = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}
        return ", ".join(f"{k}={_shown(v)}" for k, v in made.items()) or "unchanged"


def _shown(v) -> str:
    return "0" if v is False else f"{len(v)} keys" if isinstance(v, tuple) else str(v)


@dataclass
class Model:
    jobs: list[Job]
    costs: Costs
    measured_ns: int  # the run's makespan
    outside_ns: float  # of it, not in a replayed job
    scheduler: str  # the run's policy
    contention: bool  # the run has thread states: compute is replayed less its waits, which the model adds
    measured_split_s: dict
    background: float  # cores' worth of work besides the tasks' (_background)
    run_rate: float  # share of a CPU the tasks got while they wanted one
    workers_share: float = 0.0  # of the background, the workers' own work (their event loops): it scales with them


def model(t: dict, meta: dict) -> Model:
    """The run's jobs and costs: `t` holds its tables (tasks, jobs, graphs, messages, processes; with
    attempts, attempt_threads, thread_states, cpu_samples, proc and attribution where there are)."""
    if t.get("jobs") is None or t["jobs"].empty or t.get("tasks") is None or t["tasks"].empty:
        raise NotModelled("the run has no job with tasks: nothing to replay")
    cluster = meta.get("cluster", {})
    if cluster.get("server_cmd"):
        raise NotModelled("the run's scheduler is a --server-cmd server (RSDS?): only Dask's scheduler is modelled")
    workers, threads, _, delay = layout(t, meta)
    states = t.get("thread_states")
    contention = states is not None and not states.empty
    jobs = jobs_of(t, workers, int(delay), BATCH_NS[("worker", "scheduler")])
    if not jobs:
        raise NotModelled("the run has no complete job with finished tasks: nothing to replay")
    if not contention:
        for j in jobs:  # no thread states: compute as measured, no contention added
            j.own_ns, j.blocked_ns = j.own_ns + j.gil_ns + j.starved_ns + j.blocked_ns, np.zeros(len(j.keys))
    elif threads == 1:  # no task held a GIL another task of its worker waited for: a thread beside
        for j in jobs:  # them did (a plugin's, a library's), and the replay keeps those waits as measured
            j.held_ns = j.gil_ns
    spans = _spans(t["jobs"], jobs)
    costs = measure(t, meta, spans, sum(len(j.keys) for j in jobs))
    measured = int(t["jobs"].end_ns.max() - t["jobs"].start_ns.min())
    background, rate = _background(jobs, costs.cores, t, spans) if contention else (0.0, 1.0)
    return Model(jobs, costs, measured, measured - sum(j.measured_ns for j in jobs), cluster.get("scheduler") or "ws",
                 contention, _measured_split(t.get("attribution"), measured / 1e9), background, rate,
                 _workers_share(jobs, t, spans, background))


def predict(t: dict, meta: dict, changes: Changes, samples: int = SAMPLES, scaling: Fit | None = None) -> dict:
    return sweep(t, meta, [changes], samples, scaling)[0]


def sweep(t: dict, meta: dict, changes: list[Changes], samples: int = SAMPLES,
          scaling: Fit | None = None) -> list[dict]:
    """One prediction per change (the model built once, the unchanged replays shared). `scaling`: the
    scheduler's costs as workers grow, from a bench (scaling.py); None: the run's, whatever the count."""
    for c in changes:
        _check(c)
    m = model(t, meta)
    draws = [[_draw(j, r) for j in m.jobs] for r in range(max(1, samples))]
    # each draw replayed unchanged: a saving is the difference of two replays with the same draw, so a
    # change that alters nothing saves exactly nothing, whatever the model's own error
    base = [[replay(j, _setup(m, Changes(), r), d) for j, d in zip(m.jobs, ds)] for r, ds in enumerate(draws)]
    return [_predict(m, c, draws, base, scaling) for c in changes]


def _check(c: Changes) -> None:
    if c.runtime not in (None, "dask"):
        raise NotModelled(f"--runtime {c.runtime} is not modelled: the replay knows Dask's runtime only (its "
                          "costs per message are the run's); to see it, record a run on it (daskprobe run "
                          "--server-cmd)")
    if c.scheduler not in (None, "ws", "random"):
        raise NotModelled(f"--scheduler {c.scheduler}: only ws and random are modelled")


def _predict(m: Model, c: Changes, draws: list, bases: list, scaling: Fit | None) -> dict:
    """The changed replay as it comes (makespan_s), scaled by measured / unchanged (scaled_s) and shifted
    by their difference (offset_s); the validation found the first the closest (docs/whatif.md). The
    saving (saving_s) is the unchanged replay less the changed one, draw by draw."""
    outside = m.outside_ns * (1.0 if c.client is None else c.client)
    grow = _growth(m, c, scaling)
    changed = [[replay(job, _setup(m, c, r, grow), _changed(job, d, c)) for job, d in zip(m.jobs, ds)]
               for r, ds in enumerate(draws)]
    first, base = changed[0], bases[0]
    raw = [(outside + sum(g.makespan_ns for g in ch)) / 1e9 for ch in changed]
    saved = [(m.outside_ns - outside + sum(b.makespan_ns - g.makespan_ns for b, g in zip(bs, ch))) / 1e9
             for bs, ch in zip(bases, changed)]
    split = {"client": outside}
    for g in first:
        for k, v in g.split_ns.items():
            split[k] = split.get(k, 0.0) + v
    measured = m.measured_ns / 1e9
    replayed = (m.outside_ns + sum(b.makespan_ns for b in base)) / 1e9
    scaled = (m.outside_ns + sum(g.makespan_ns * _ratio(j, b) for g, j, b in zip(first, m.jobs, base))) / 1e9
    error = replayed / measured - 1
    ends = [(outside + sum(replay(job, _setup(m, c, 0, g), _changed(job, d, c)).makespan_ns
                           for job, d in zip(m.jobs, draws[0]))) / 1e9 for g in grow.ends()]
    workers = c.workers or len(m.costs.workers)
    return {"changes": c.text(), "measured_s": measured, "makespan_s": raw[0],
            "interval_s": _widened(_interval(raw, abs(error)), ends),
            "saving_s": saved[0], "saving_interval_s": _interval(saved, abs(error)),
            "replay_s": replayed, "replay_error": error, "scaled_s": scaled, "offset_s": measured + raw[0] - replayed,
            "split_s": {k: split.get(k, 0.0) / 1e9 for k in CATEGORIES},
            "measured_split_s": m.measured_split_s, "samples": len(raw), "notes": _notes(m, c, scaling),
            "thread_states": m.contention, "workers": workers,
            "ground": ground(workers, len(m.costs.workers), scaling),
            "extrapolated": ground(workers, len(m.costs.workers), scaling) != "measured",
            "scheduler_cpu_s": (sum(g.scheduler_ns for g in first) + grow.admin * raw[0] * 1e9) / 1e9,
            "scheduler_costs": grow.text, "scaling": scaling.text() if scaling else None}


@dataclass(frozen=True)
class Growth:
    """The scheduler's costs at a change's worker count against the run's (scaling.py): a factor on its
    per-task costs, the fit's low and high ends of it, and the share of its loop the added heartbeats take."""
    factor: float = 1.0
    low: float = 1.0
    high: float = 1.0
    admin: float = 0.0
    text: str = ""

    def ends(self) -> list[Growth]:
        """The fit's low and high ends, to replay for the interval (none when they are the point)."""
        if self.low == self.factor == self.high:
            return []
        return [replace(self, factor=f, low=f, high=f) for f in (self.low, self.high)]


def _growth(m: Model, c: Changes, scaling: Fit | None) -> Growth:
    run = len(m.costs.workers)
    if scaling is None:
        return Growth(text=f"the run's, measured at {run} workers, at any count (no --scaling)")
    w = c.workers or run
    try:
        point, low, high = scaling.factor(w, run)
    except ValueError as e:
        raise NotModelled(str(e)) from None
    admin = scaling.admin_load(w, run)
    if admin >= MAX_ADMIN_LOAD:
        raise NotModelled(f"at {w} workers, heartbeats alone would take {admin:.0%} of the scheduler's loop")
    spread = f" (90% {low:.2f}-{high:.2f})" if low != high else " (no interval: runs at 2 worker counts)"
    return Growth(point, low, high, admin, f"the run's x{point:.2f}{spread} per task as the bench's grow from {run} "
                                           f"to {w} workers; heartbeats {admin:+.1%} of its loop")


def _widened(interval: list[float], ends: list[float]) -> list[float]:
    return [min(interval[0], *ends), max(interval[1], *ends)] if ends else interval


def _ratio(job: Job, unchanged) -> float:
    return job.measured_ns / unchanged.makespan_ns if unchanged.makespan_ns > 0 else 1.0


def _interval(preds: list[float], error: float) -> list[float]:
    """The replays' 5th to 95th percentile, widened to the point prediction give or take the unchanged
    replay's own error: how far the model was from the run before any change."""
    lo, hi = np.percentile(preds, [5, 95]) if len(preds) > 1 else (preds[0], preds[0])
    ends = (preds[0] / (1 + error), preds[0] * (1 + error))  # a negative one (a saving's) the other way round
    return [float(min(lo, *ends)), float(max(hi, *ends))]


def _setup(m: Model, c: Changes, seed: int, grow: Growth = Growth()) -> Setup:
    k = m.costs
    loop = 1 - k.loop_gil if not c.gil else 1.0
    bookkeeping = 1.0 if c.bookkeeping is None else c.bookkeeping
    return Setup(workers=c.workers or len(k.workers), threads=c.threads or k.threads,
                 cores=(c.cores or k.cores) if m.contention else math.inf,
                 background=_load(m, c), run_rate=m.run_rate,
                 lat_ns=k.lat_ns, ns_per_byte=k.ns_per_byte,
                 serve_ns=k.serve_ns, task_ns=k.task_ns * loop * bookkeeping * grow.factor,
                 decide_ns=k.decide_ns * loop * (1.0 if c.decisions is None else c.decisions) * grow.factor,
                 batch_ns=k.batch_ns, gil_share=k.gil_share if c.gil and m.contention else 0.0,
                 policy=c.scheduler or m.scheduler, delay_ns=k.delay_ns if c.delay_ms is None else c.delay_ms * 1e6,
                 network=1.0 if c.network is None else c.network, bookkeeping=bookkeeping, seed=seed,
                 think=1.0 if c.client is None else c.client, admin_load=grow.admin, graph_cpu=k.graph_cpu,
                 run_workers=len(k.workers), run_cores=k.cores if m.contention else math.inf)


def _draw(job: Job, r: int) -> Draw:
    """Draw 0: the run's own; others: each task's compute that of a task of its group drawn at random,
    the workers' costs drawn from the run's."""
    before, after = _filled(job.before_ns), _filled(job.after_ns)
    if r == 0:
        return Draw(job.own_ns, job.blocked_ns, before, after, job.held_ns)
    rng = np.random.default_rng(r)
    pick = _within_groups(job.group, rng)
    return Draw(job.own_ns[pick], job.blocked_ns[pick], rng.choice(before, len(before)),
                rng.choice(after, len(after)), None if job.held_ns is None else job.held_ns[pick])


def _changed(job: Job, d: Draw, c: Changes) -> Draw:
    """A draw as the change has the tasks: blocked time scaled; the keys named at their prefix's median."""
    own, blocked = d.own_ns, d.blocked_ns * (1.0 if c.blocked is None else c.blocked)
    named = set(c.at_median)
    slow = [i for i, k in enumerate(job.keys) if k in named]
    if slow:
        prefix = np.asarray(job.prefix, dtype=object)
        was, own, blocked = blocked, own.copy(), blocked.copy()
        for i in slow:
            same = prefix == prefix[i]
            own[i], blocked[i] = np.median(d.own_ns[same]), np.median(was[same])
    held = None if d.held_ns is None or not c.gil else d.held_ns  # gil=0: no waits for it, whoever held it
    return Draw(own, blocked, d.before_ns, d.after_ns, held)


def _filled(x: np.ndarray) -> np.ndarray:
    seen = x[~np.isnan(x)]
    return np.where(np.isnan(x), float(np.median(seen)) if len(seen) else 0.0, x)


def _within_groups(groups: list[str], rng) -> np.ndarray:
    codes, uniq = pd.factorize(pd.Series(groups))
    pick = np.empty(len(groups), dtype="int64")
    for g in range(len(uniq)):
        idx = np.flatnonzero(codes == g)
        pick[idx] = rng.choice(idx, len(idx))
    return pick


def _background(jobs: list[Job], cores: int, t: dict, spans: list[tuple[int, int]]) -> tuple[float, float]:
    """The machine's load besides the tasks, in cores, as processor sharing would explain the tasks' own
    waits for a CPU: their threads got own / (own + runnable) of a CPU (the run's rate, returned too)
    while `_concurrency` of them wanted one. Tasks that hardly wanted a CPU (no-ops)
    say nothing of it: then the rate is the whole cluster's threads' (the runtime's own work, which
    shares the CPUs too). None where they hardly waited (the load is then not identifiable)."""
    own, starved = _tasks_time(jobs)
    wanted = (own + starved) / sum(j.measured_ns for j in jobs)
    if wanted < FEW_CPUS:
        own, starved = _cluster_time(t, spans, ("scheduler", "worker", "client", "nanny"))
    else:
        wanted = _concurrency(jobs)
    if starved < UNSTARVED * (own + starved) or own <= 0:
        return 0.0, 1.0
    rate = own / (own + starved)
    return min(MAX_LOAD * cores, max(0.0, cores / rate - wanted)), rate


def _concurrency(jobs: list[Job]) -> float:
    """How many tasks wanted a CPU, on average over the time the tasks wanted one (each task counting
    its own + starved share of its span): what its CPU was shared with besides the load. Averaged over the
    makespan instead, a run whose tasks pause (transfers, a futures loop's gaps) would have its load
    taken for more than it was."""
    t, w = [], []
    for j in jobs:
        span = j.own_ns + j.gil_ns + j.starved_ns + j.blocked_ns
        ok = (span > 0) & np.isfinite(j.start_ns)
        t += [j.start_ns[ok], j.start_ns[ok] + span[ok]]
        share = (j.own_ns[ok] + j.starved_ns[ok]) / span[ok]
        w += [share, -share]
    t, w = np.concatenate(t), np.concatenate(w)
    order = np.argsort(t, kind="stable")
    n = np.cumsum(w[order])[:-1].clip(min=0)
    dt = np.diff(t[order])
    return float((n * n * dt).sum() / (n * dt).sum()) if (n * dt).sum() > 0 else 0.0


def _tasks_time(jobs: list[Job]) -> tuple[float, float]:
    """ns the tasks computed on a CPU, and waited for one."""
    return sum(float(j.own_ns.sum()) for j in jobs), sum(float(j.starved_ns.sum()) for j in jobs)


def _cluster_time(t: dict, spans: list[tuple[int, int]], roles: tuple[str, ...]) -> tuple[float, float]:
    """ns the processes of `roles` ran on a CPU (whole_run.proc_cpu) and their threads waited for one
    (thread states), inside the spans."""
    p, proc, states = t["processes"], t.get("proc"), t.get("thread_states")
    mine = p[p.role.isin(roles)]
    if proc is None or proc.empty or states is None or mine.empty:
        return 0.0, 0.0
    keys = ["host", "pid"] if "host" in states and "host" in mine else ["pid"]
    runnable = states[states.state == "runnable"].merge(mine[keys].drop_duplicates(), on=keys)
    cpu = wait = 0.0
    for a, b in spans:
        wait += float((runnable.end_ns.clip(a, b) - runnable.start_ns.clip(a, b)).clip(lower=0).sum())
        cpu += sum(proc_cpu(proc, name, (a, b)) or 0.0 for name in mine.name) * 1e9
    return cpu, wait


def _workers_share(jobs: list[Job], t: dict, spans: list[tuple[int, int]], background: float) -> float:
    """Of the background (cores), the share that was the workers' own work beside their tasks (event
    loops: hand-overs, transfers, heartbeats), which a change of their count changes in proportion."""
    if background <= 0:
        return 0.0
    own, starved = _tasks_time(jobs)
    cpu, wait = _cluster_time(t, spans, ("worker",))
    return min(1.0, max(0.0, cpu + wait - own - starved) / sum(j.measured_ns for j in jobs) / background)


def _load(m: Model, c: Changes) -> float:
    """The background with the change's workers: their share of it in proportion to their count."""
    workers = c.workers or len(m.costs.workers)
    grown = 1 + (workers / len(m.costs.workers) - 1) * m.workers_share
    return m.background * grown * (1.0 if c.load is None else c.load)


def _spans(jobs: pd.DataFrame, replayed: list[Job]) -> list[tuple[int, int]]:
    mine = jobs[jobs.job.isin([j.job for j in replayed])]
    return list(zip(mine.start_ns.astype("int64"), mine.end_ns.astype("int64")))


def _measured_split(attr: pd.DataFrame | None, makespan_s: float) -> dict:
    """The run's critical path inside its jobs by category (attribution), the rest as the client's."""
    if attr is None or attr.empty:
        return {}
    by = attr[attr.job >= 0].groupby("category").seconds.sum()
    out = {k: float(by.get(k, 0.0)) for k in CATEGORIES if k != "client"}
    out["client"] = float(by.get("client", 0.0)) + max(0.0, makespan_s - float(by.sum()))
    out["other"] = float(by.drop(list(CATEGORIES), errors="ignore").sum())
    return out


def _notes(m: Model, c: Changes, scaling: Fit | None) -> list[str]:
    notes = []
    if not m.contention:
        notes.append("the run has no eBPF thread states: compute is replayed as measured, with no contention "
                     "for cores or the GIL (--threads and --workers beyond the cores may be optimistic)")
    if (c.workers or len(m.costs.workers)) * (c.threads or m.costs.threads) > 4 * m.costs.cores and not scaling:
        notes.append(f"{(c.workers or len(m.costs.workers)) * (c.threads or m.costs.threads)} threads on "
                     f"{m.costs.cores} cores: beyond what the run measured (the scheduler's cost per task is "
                     "the run's, at its size)")
    if (c.scheduler or m.scheduler) == "ws":
        notes.append("work stealing is not modelled")
    return notes
