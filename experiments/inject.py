"""Scheduler preload: a known cause of slowness, in the shape real code gives it,
for the attribution benchmark and its tests.

    --config distributed.scheduler.preload=['/path/to/inject.py']
    DASKPROBE_INJECT=decisions:0.01   every worker choice costs 10 ms more CPU, spent
                                      inside the scheduler's worker-choice methods
    DASKPROBE_INJECT=gil-spin         a scheduler thread spinning in pure Python
    DASKPROBE_INJECT=gil-c:0.03       a scheduler thread holding the GIL in C calls
                                      of 30 ms (usleep through ctypes.PyDLL), so it
                                      adds GIL waits without taking a CPU
    DASKPROBE_INJECT_LOG=path         for `decisions`: one line per slowed choice, the wall
                                      seconds its spin took (CPU time on a loaded machine or
                                      a VM with steal time takes longer than its CPU seconds)

Loaded by path, so it needs nothing but distributed.
"""

import ctypes
import os
import threading
import time

from distributed.scheduler import SchedulerState

CHOICES = ("decide_worker_non_rootish", "decide_worker_rootish_queuing_disabled",
           "decide_worker_rootish_queuing_enabled")


def _slower(name: str, seconds: float):
    original = getattr(SchedulerState, name)

    def slower(self, *args, **kwargs):
        # busy in pure Python, inside the worker choice, for `seconds` of this thread's CPU: a wall-clock
        # spin on a loaded machine would be partly waiting for a CPU, which is cpu_starvation
        start = time.perf_counter()
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass
        _log(time.perf_counter() - start)
        return original(self, *args, **kwargs)

    # named as an override of the method is, down to its code object (what a sampler reads)
    slower.__code__ = slower.__code__.replace(co_name=name, co_qualname=f"SchedulerState.{name}")
    slower.__name__, slower.__qualname__ = name, f"SchedulerState.{name}"
    return slower


def _log(wall: float):
    if path := os.environ.get("DASKPROBE_INJECT_LOG"):
        with open(path, "a") as f:
            f.write(f"{wall:.6f}\n")


def _spin():
    n = 0
    while True:
        n += 1


def _hold(seconds: float):
    usleep = ctypes.PyDLL(None).usleep  # PyDLL: the GIL stays held during the call
    while True:
        usleep(int(seconds * 1e6))


def dask_setup(scheduler):
    kind, _, arg = os.environ.get("DASKPROBE_INJECT", "").partition(":")
    if kind == "decisions":
        for name in CHOICES:
            setattr(SchedulerState, name, _slower(name, float(arg)))
    elif kind == "gil-spin":
        threading.Thread(target=_spin, daemon=True, name="busy-plugin").start()
    elif kind == "gil-c":
        threading.Thread(target=_hold, args=(float(arg),), daemon=True, name="busy-plugin").start()
    elif kind:
        raise ValueError(f"DASKPROBE_INJECT={kind!r}: not one of decisions, gil-spin, gil-c")
