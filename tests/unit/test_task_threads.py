"""The path's compute time split by the task thread's state: its waits for the GIL and for a CPU."""

from __future__ import annotations

import pandas as pd
import pytest

from daskprobe.analyzers.task_threads import compute_rows

SEGS = pd.DataFrame({"job": [0, 0], "kind": ["compute", "compute"], "part": ["compute", "compute"],
                     "process": ["worker-0", "worker-0"], "key": ["a", "b"],
                     "start_ns": [1_000, 5_000], "end_ns": [2_000, 6_000]})
ATTEMPTS = pd.DataFrame({"job": [0, 0], "key": ["a", "b"], "worker": ["worker-0", "worker-0"],
                         "compute_start_ns": [900, 5_000], "compute_stop_ns": [2_000, 6_000]})
TIDS = pd.DataFrame({"attempt": [0, 1], "tid": [11, 12]})
PIDS = pd.Series({"worker-0": 10})


def states(*rows):
    return pd.DataFrame(rows, columns=["pid", "tid", "start_ns", "end_ns", "state"])


def by(rows: pd.DataFrame) -> dict:
    return rows.groupby("category").seconds.sum().mul(1e9).round().astype(int).to_dict()


def test_a_task_threads_waits_for_the_gil_and_a_cpu_leave_compute():
    st = states((10, 11, 1_100, 1_400, "gil"), (10, 11, 1_500, 1_700, "runnable"), (10, 11, 1_800, 2_500, "blocked"),
                (10, 12, 4_000, 5_500, "gil"))  # b's thread: waiting from before its segment
    assert by(compute_rows(SEGS, ATTEMPTS, TIDS, st, PIDS)) == {"compute": 1_000, "gil_contention": 800,
                                                               "cpu_starvation": 200}


def test_another_threads_waits_and_a_thread_without_states_stay_compute():
    other = states((10, 99, 1_000, 2_000, "gil"), (10, 99, 5_000, 6_000, "runnable"))
    assert by(compute_rows(SEGS, ATTEMPTS, TIDS, other, PIDS)) == {"compute": 2_000}
    assert by(compute_rows(SEGS, ATTEMPTS, TIDS[:0], other, PIDS)) == {"compute": 2_000}
    assert by(compute_rows(SEGS, ATTEMPTS, TIDS, states(), PIDS)) == {"compute": 2_000}


def test_parts_say_why():
    st = states((10, 11, 1_000, 1_500, "gil"))
    parts = compute_rows(SEGS, ATTEMPTS, TIDS, st, PIDS).set_index("category").part
    assert parts["gil_contention"] == "compute (task thread waiting for the GIL)"
    assert pytest.approx(compute_rows(SEGS, ATTEMPTS, TIDS, st, PIDS).seconds.sum()) == 2e-6
