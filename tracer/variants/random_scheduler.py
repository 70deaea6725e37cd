"""Scheduler preload: the paper's `random` scheduler.

Every ready task goes to a worker drawn uniformly at random from the running
workers (or from those its restrictions allow). `daskprobe run --scheduler
random` loads this file with `--preload` and also turns work stealing off and
root-task queuing off (worker-saturation=inf), so no other policy moves tasks.

Loaded by path, not by module name, so it works in any interpreter that runs
the cluster, with no daskprobe installed there.
"""

import random

from distributed.scheduler import SchedulerState


def _random_worker(self, ts):
    pool = self.valid_workers(ts)
    pool = self.running if pool is None else pool & self.running
    return random.choice(tuple(pool)) if pool else None


def dask_setup(scheduler):
    SchedulerState.decide_worker_non_rootish = _random_worker
    SchedulerState.decide_worker_rootish_queuing_disabled = _random_worker
