"""The task prefixes table's bytes moved (analyzers/tasks.py)."""

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
