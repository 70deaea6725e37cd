"""The task prefixes table (analyzers/tasks.py): bytes moved, and each task's time split."""

import pandas as pd

from daskprobe.analyzers.tasks import moved_bytes


def test_bytes_moved_count_each_result_once_per_other_worker_that_needed_it():
    tasks = pd.DataFrame({"job": [0] * 5, "key": ["x-0", "y-0", "y-1", "z-0", "w-0"],
                          "worker": ["worker-0", "worker-1", "worker-1", "worker-0", "worker-1"],
                          "prefix": ["x", "y", "y", "z", "w"], "nbytes": [1000, 10, 10, 7, 1],
                          "deps": [[], ["x-0"], ["x-0"], ["x-0"], ["y-0", "z-0"]]})
    # x-0 fetched by worker-1 once (two tasks there use it), not by worker-0 where it was made;
    # z-0 fetched by worker-1; y-0 is on worker-1 already
    assert moved_bytes(tasks).to_dict() == {"x": 1000.0, "z": 7.0}


def test_a_tasks_overhead_leaves_out_its_waiting_in_queues():
    """Ready at 0, queued at the scheduler until 100 ms, 1 ms on the wire, 2 ms for a thread, 1 ms of
    compute, reported 1 ms later: 102 ms of waiting, 2 ms of overhead, 1 ms of compute."""
    from daskprobe.analyzers.tasks import task_times
    ms = 1_000_000
    tasks = pd.DataFrame({"outcome": ["finished"], "ready_ns": [0], "compute_sent_ns": [100 * ms],
                          "compute_recv_ns": [101 * ms], "transfer_stop_ns": pd.array([pd.NA], "Int64"), "compute_start_ns": [103 * ms],
                          "compute_stop_ns": [104 * ms], "finished_recv_ns": [105 * ms]})
    times = task_times(tasks).iloc[0].round(6).to_dict()
    assert times == {"compute_s": 0.001, "wait_s": 0.102, "overhead_s": 0.002}
