"""The scheduler's costs as its workers grow, from a bench's runs (`daskprobe bench --worker zero
--probes proxy,pyspy,proc`, one row per run as dashboards/bench_results.py defines them).

Two costs, each measured in the bench at several worker counts:
- per task (its transitions and messages): the scheduler's CPU over the run less its administrative
  handlers' CPU, per task. Fitted as a line in workers (flat if it falls), with a 90% interval on it;
- per administrative message: the administrative handlers' CPU over their messages, pooled.
A replay at W workers charges the run's own per-task costs times per_task(W) / per_task(run's), and
the heartbeats Dask adds from the run's count to W (heartbeat_interval_s) as a share of the scheduler's
loop. The fit is held flat below the bench's smallest count: the scheduler's costs do not fall further
with fewer workers than it measured."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

HEARTBEAT_MSGS = 2  # a heartbeat_worker and the scheduler's reply: both administrative messages
# Student's t, 95th percentile (a two-sided 90% interval), by degrees of freedom; beyond, the normal's
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
       15: 1.753, 20: 1.725, 30: 1.697}
MAX_ADMIN_LOAD = 0.95  # of the scheduler's loop: beyond, heartbeats alone saturate it


def heartbeat_interval_s(workers: int) -> float:
    """Dask's heartbeat interval at this many workers (distributed.scheduler.heartbeat_interval)."""
    if workers <= 10:
        return 0.5
    if workers < 50:
        return 1.0
    if workers < 200:
        return 2.0
    return workers / 200 + 1


def heartbeats_per_s(workers: int) -> float:
    """Heartbeats reaching the scheduler a second: every worker at Dask's interval."""
    return workers / heartbeat_interval_s(workers)


@dataclass(frozen=True)
class Fit:
    """per_task_s(W) = intercept + slope * W, from `points` bench runs at lo..hi workers."""
    intercept: float
    slope: float
    lo: int
    hi: int
    points: int
    resid_s: float  # the residuals' standard deviation (NaN with 2 runs: no interval)
    mean_w: float
    sxx: float
    admin_msg_s: float  # CPU per administrative message (0 where the bench had no samples)
    source: str = ""

    def per_task_s(self, workers: int) -> float:
        return self.intercept + self.slope * max(workers, self.lo)

    def per_task_interval_s(self, workers: int) -> tuple[float, float]:
        """The line's 90% interval at this count (the mean cost per task, not one run's)."""
        w = max(workers, self.lo)
        if self.points < 3 or math.isnan(self.resid_s):
            return math.nan, math.nan
        half = _t95(self.points - 2) * self.resid_s * math.sqrt(1 / self.points + (w - self.mean_w) ** 2 / self.sxx)
        mid = self.per_task_s(w)
        return mid - half, mid + half

    def factor(self, workers: int, run_workers: int) -> tuple[float, float, float]:
        """The per-task cost at `workers` over that at the run's count: point, low, high (the line's
        interval at `workers`; its value at the run's taken as exact)."""
        base = self.per_task_s(run_workers)
        if base <= 0:
            raise ValueError(f"the bench's per-task cost fits to {base * 1e6:.0f} µs at {run_workers} workers")
        lo, hi = self.per_task_interval_s(workers)
        point = self.per_task_s(workers) / base
        if math.isnan(lo):
            return point, point, point
        return point, max(0.0, lo) / base, hi / base

    def admin_load(self, workers: int, run_workers: int) -> float:
        """The share of the scheduler's loop that the heartbeats added from the run's count to `workers` take."""
        return (heartbeats_per_s(workers) - heartbeats_per_s(run_workers)) * HEARTBEAT_MSGS * self.admin_msg_s

    def text(self) -> str:
        return (f"{self.source}: the scheduler's CPU per task {self.intercept * 1e6:.0f} µs + {self.slope * 1e9:.1f} ns "
                f"per worker (fit on {self.points} runs, {self.lo}..{self.hi} workers), "
                f"{self.admin_msg_s * 1e6:.0f} µs per administrative message")


def _t95(dof: int) -> float:
    return T95[max(k for k in T95 if k <= dof)] if dof <= 30 else 1.645


def usable(results: pd.DataFrame) -> pd.DataFrame:
    """The bench's runs that measured the scheduler's CPU: ok, Dask's server, with tasks and proc."""
    r = results[(results.status == "ok") & results.scheduler_cpu_s.notna() & (results.tasks.fillna(0) > 0)]
    return r[r.server.fillna("dask") == "dask"]


def fit(results: pd.DataFrame, source: str = "") -> Fit:
    """The curves from a bench's results table (bench_results.RESULTS). ValueError without runs at two
    worker counts or more."""
    r = usable(results)
    if r.workers.nunique() < 2:
        raise ValueError(f"{source or 'the bench'} has runs with the scheduler's CPU (--probes proc) at "
                         f"{r.workers.nunique()} worker count(s): the curve needs two or more")
    admin_cpu = r.administrative_cpu_s.fillna(0.0).astype("float64")
    y = ((r.scheduler_cpu_s - admin_cpu) / r.tasks.astype("float64")).to_numpy("float64")
    w = r.workers.to_numpy("float64")
    slope, intercept = np.polyfit(w, y, 1)
    if slope < 0:  # a cost the bench did not see grow is held flat: a falling line would reach 0 at scale
        slope, intercept = 0.0, float(y.mean())
    resid = y - (intercept + slope * w)
    dof = len(y) - 2
    admin_msgs = (r.administrative_msg_share * r.scheduler_messages.astype("float64")).fillna(0.0).sum()
    return Fit(intercept=float(intercept), slope=float(slope), lo=int(w.min()), hi=int(w.max()), points=len(y),
               resid_s=float(math.sqrt((resid ** 2).sum() / dof)) if dof > 0 else math.nan,
               mean_w=float(w.mean()), sxx=float(((w - w.mean()) ** 2).sum()),
               admin_msg_s=float(admin_cpu.sum() / admin_msgs) if admin_msgs > 0 else 0.0, source=source)


def ground(workers: int, run_workers: int, f: Fit | None) -> str:
    """"measured" within what the run or the bench measured (at most its largest count: fewer workers do
    not make the scheduler's costs grow); beyond, from which counts the prediction extrapolates."""
    lo, hi = (min(run_workers, f.lo), max(run_workers, f.hi)) if f else (run_workers, run_workers)
    if workers <= hi:
        return "measured"
    return f"extrapolated from {lo}..{hi} workers" if lo != hi else f"extrapolated from {hi} workers"
