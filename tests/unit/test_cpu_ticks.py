"""CPU shares from a process the sampler read on CPU ticks: its tick samples alone stand for its CPU,
one period each; its other samples (threads off a CPU, read every 100 ms) count for none."""

import pandas as pd

from daskprobe.analyzers.cpu import classify_samples

RATE = 100.0


def _samples(rows):
    return pd.DataFrame(rows, columns=["t_ns", "pid", "tid", "process", "source", "stack_id", "active", "stale",
                                       "tick", "owns_gil", "ident"])


def _classified(samples):
    processes = pd.DataFrame({"pid": [10, 20], "role": ["worker", "scheduler"]})
    states = pd.DataFrame(columns=["pid", "tid", "start_ns", "end_ns", "state"])
    attempts = pd.DataFrame(columns=["worker", "thread", "compute_start_ns", "compute_stop_ns"])
    return classify_samples(samples, processes, states, pd.Series({0: "a", 1: "b"}), attempts, RATE, 99)


def test_a_ticked_processs_cpu_rests_on_its_tick_samples_only():
    ms = 1_000_000
    rows = [(t * ms, 10, 11, "w", "pyspy", 0, True, False, True, False, 1) for t in (0, 3, 4, 30)]
    # read every 100 ms, found running (a GIL holder): at times the sampler chose, not a tick
    rows += [(t * ms, 10, 12, "w", "pyspy", 1, True, False, False, True, 2) for t in (100, 200)]
    # a process polled: each read stands for the time since the previous one
    rows += [(t * ms, 20, 21, "s", "pyspy", 1, True, False, False, False, 3) for t in (0, 10, 30)]
    c = _classified(_samples(rows)).set_index(["pid", "t_ns"])
    ticked = c.loc[10]
    assert ticked.on_cpu.tolist() == [True] * 4 + [False] * 2
    assert ticked.weight_s.tolist() == [1 / RATE] * 4 + [0.0] * 2
    assert c.loc[20].weight_s.round(6).tolist() == [0.01, 0.01, 0.02]
