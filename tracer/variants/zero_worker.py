"""Worker preload: the paper's zero worker.

Each task completes the moment it would start, with a small placeholder
result, and runs nothing. Everything around execution is left as it is: the
worker still receives compute-task, fetches dependencies from their holders,
reports task-finished with the placeholder's size, and serves it to others, so
only the runtime's own overhead remains in the makespan.

Loaded by path with `--preload` (`daskprobe run --worker zero`).
"""

import threading
from time import time

from distributed.worker import Worker
from distributed.worker_state_machine import ExecuteSuccessEvent

PLACEHOLDER = 0


async def _complete_at_once(self, key, *, stimulus_id):
    now = time()
    self.threads[key] = threading.get_ident()  # "ran" on the event loop: task-finished names it
    return ExecuteSuccessEvent(key=key, run_id=self.state.tasks[key].run_id, value=PLACEHOLDER,
                               start=now, stop=now, nbytes=28, type=int,
                               stimulus_id=f"task-finished-{now}")


def dask_setup(worker):
    Worker.execute = _complete_at_once
