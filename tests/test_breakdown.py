"""The makespan split, validated by perturbations with known causes on real
clusters: each adds time of one kind to a chain of tasks (every hop on the
critical path), and the analysis must put most of the added time there."""

import json

import pytest

from conftest import run_flow, write_flow

CHAIN = """
import time
from dask import delayed
from distributed import Client

def step(x, pause):
    if pause:
        time.sleep(pause)
    return x + 1

N, PAUSE = {n}, {pause}
x = 0
for i in range(N):
    x = delayed(step)(x, PAUSE, dask_key_name=f"step-{{i}}")
with Client() as c:
    assert c.compute(x).result() == N
"""

SLOW_DECISIONS = """
import time
from distributed.scheduler import SchedulerState

original = SchedulerState.decide_worker_non_rootish

def decide_worker_non_rootish(self, ts):
    end = time.perf_counter() + {seconds}
    while time.perf_counter() < end:  # busy, holding the GIL, inside the worker choice
        pass
    return original(self, ts)

def dask_setup(scheduler):
    SchedulerState.decide_worker_non_rootish = decide_worker_non_rootish
"""

GIL_HOG = """
import ctypes
import threading

# A C call made through PyDLL keeps the GIL: the hog holds it while asleep,
# so it adds GIL waits to the event loop without competing for a CPU (a
# spinning hog would also slow the worker and the proxy on a 2-core machine).
usleep = ctypes.PyDLL(None).usleep

def hog():
    while True:
        usleep(30_000)

def dask_setup(scheduler):
    threading.Thread(target=hog, daemon=True, name="gil-hog").start()
"""


def summary(tmp, name, code, *opts):
    d = tmp / name
    d.mkdir()
    run, _ = run_flow(d, code, "--workers", "1", *opts)
    s = json.loads((run / "summary.json").read_text())
    total = sum(s["critical_path_s"].values())
    assert abs(total - s["makespan_s"]) <= 0.01 * s["makespan_s"], "the categories partition the makespan"
    return s


def added(base, pert, category):
    return (pert["critical_path_s"].get(category, 0) - base["critical_path_s"].get(category, 0),
            pert["makespan_s"] - base["makespan_s"])


def preload(tmp, name, code):
    path = write_flow(tmp / f"{name}.py", code)
    return "--config", f"distributed.scheduler.preload=['{path}']"


def test_proxy_delay_goes_to_network(tmp_path):
    flow = CHAIN.format(n=25, pause=0)
    base = summary(tmp_path, "base", flow, "--probes", "proxy")
    pert = summary(tmp_path, "delayed", flow, "--probes", "proxy", "--delay-ms", "20")
    net, more = added(base, pert, "network")
    assert more > 0.8, "25 hops x 2 messages x 20 ms"
    assert net >= 0.8 * more, (net, more)


def test_slow_worker_choice_goes_to_scheduler_decisions(tmp_path):
    flow = CHAIN.format(n=25, pause=0)
    base = summary(tmp_path, "base", flow, "--probes", "proxy,pyspy")
    pert = summary(tmp_path, "slow", flow, "--probes", "proxy,pyspy",
                   *preload(tmp_path, "slow_decisions", SLOW_DECISIONS.format(seconds=0.03)))
    decisions, more = added(base, pert, "scheduler_decisions")
    assert more > 0.5, "24 decisions x 30 ms"
    assert decisions >= 0.8 * more, (decisions, more, pert["critical_path_s"])


def test_gil_hog_in_the_scheduler_goes_to_gil_contention(tmp_path):
    from daskprobe.probes.ebpf import environment_problem
    if why := environment_problem():
        pytest.skip(why)
    flow = CHAIN.format(n=40, pause=0)  # long enough that the added time dwarfs run-to-run noise
    base = summary(tmp_path, "base", flow, "--probes", "proxy,pyspy,gil")
    pert = summary(tmp_path, "hog", flow, "--probes", "proxy,pyspy,gil", *preload(tmp_path, "hog", GIL_HOG))
    gil, more = added(base, pert, "gil_contention")
    assert more > 0.3, (base["makespan_s"], pert["makespan_s"])
    assert gil >= 0.7 * more, (gil, more, pert["critical_path_s"])


def test_known_compute_is_found_on_the_critical_path(tmp_path):
    n, pause = 8, 0.2
    s = summary(tmp_path, "sleep", CHAIN.format(n=n, pause=pause), "--probes", "proxy")
    compute = s["critical_path_s"]["compute"]
    assert abs(compute - n * pause) <= 0.05 * n * pause, compute
