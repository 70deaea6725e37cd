"""CPU shares from a process the sampler read on CPU ticks: its tick samples alone stand for its CPU,
each its tick's period; its other samples (threads off a CPU, read every 200 ms) count for none."""

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
    # read every 200 ms, found running (a GIL holder): at times the sampler chose, not a tick
    rows += [(t * ms, 10, 12, "w", "pyspy", 1, True, False, False, True, 2) for t in (200, 400)]
    # a process polled: each read stands for the time since the previous one
    rows += [(t * ms, 20, 21, "s", "pyspy", 1, True, False, False, False, 3) for t in (0, 10, 30)]
    c = _classified(_samples(rows)).set_index(["pid", "t_ns"])
    ticked = c.loc[10]
    assert ticked.on_cpu.tolist() == [True] * 4 + [False] * 2
    assert ticked.weight_s.tolist() == [1 / RATE] * 4 + [0.0] * 2
    assert c.loc[20].weight_s.round(6).tolist() == [0.01, 0.01, 0.02]


def test_a_tick_stands_for_the_period_its_cpu_ticked_at_then():
    ms = 1_000_000
    rows = [(t * ms, 10, 11, "w", "pyspy", 0, True, False, True, False, 1) for t in (0, 7, 14, 30)]
    # a period drawn at 6 ms, then 13 ms; the last from a capture before periods were recorded
    periods = pd.array([6 * ms, 6 * ms, 13 * ms, None], dtype="Int64")
    c = _classified(_samples(rows).assign(period_ns=periods))
    assert c.weight_s.tolist() == [0.006, 0.006, 0.013, 1 / RATE]


def test_a_tick_read_while_its_thread_waits_for_the_cpu_it_was_preempted_from_is_on_a_cpu():
    ms = 1_000_000
    # thread 11: preempted at 10 ms (runnable 10-12), then asleep 20-30 and woken (runnable 30-32)
    states = pd.DataFrame({"pid": [10] * 3, "tid": [11] * 3, "start_ns": [10 * ms, 20 * ms, 30 * ms],
                           "end_ns": [12 * ms, 30 * ms, 32 * ms], "state": ["runnable", "blocked", "runnable"]})
    rows = [(t * ms, 10, 11, "w", "pyspy", 0, True, False, tick, False, 1)
            for t, tick in ((5, True), (11, True), (11, False), (25, True), (31, True))]
    processes = pd.DataFrame({"pid": [10], "role": ["worker"]})
    attempts = pd.DataFrame(columns=["worker", "thread", "compute_start_ns", "compute_stop_ns"])
    c = classify_samples(_samples(rows), processes, states, pd.Series({0: "a"}), attempts, RATE, 99)
    # on a CPU; preempted (a tick's, not a read the sampler chose); asleep; woken since it slept
    assert c.on_cpu.tolist() == [True, True, False, False, False]


def test_a_paced_read_stands_for_the_gap_since_the_one_before_up_to_three_of_its_intervals():
    ms = 1_000_000
    # polled at 10 ms, then spread to a 40 ms mean interval (a cluster using little CPU); one gap of 200 ms
    # (the sampler starved) counts for three intervals
    times, intervals = (0, 10, 20, 60, 95, 295), (10, 10, 10, 40, 40, 40)
    rows = [(t * ms, 20, 21, "s", "pyspy", 1, True, False, False, False, 3) for t in times]
    c = _classified(_samples(rows).assign(period_ns=pd.array([i * ms for i in intervals], dtype="Int64")))
    # clipped at three times 1/rate (30 ms), as before pacing, the 40 ms and 35 ms gaps would lose CPU
    assert c.weight_s.round(6).tolist() == [0.01, 0.01, 0.01, 0.04, 0.035, 0.12]
