"""A busy thread beside the tasks: a worker plugin starts a progress monitor
that polls a counter in a tight pure-Python loop, so the tasks' threads
(pure-Python parsing) wait for the GIL it holds.

Twin (PLANT=0): the monitor sleeps 100 ms between polls.

cause: a thread spinning in pure Python beside the tasks
expect: task-gil, gil-contention
options: --workers 2 --threads 1
"""

import os
import threading
import time

from distributed import Client, WorkerPlugin

PLANT = os.environ.get("PLANT", "1") != "0"


class ProgressMonitor(WorkerPlugin):
    """Reports how far the worker got, for a dashboard of the team's own."""

    def setup(self, worker):
        self.worker, self.seen, self.busy = worker, 0, PLANT
        threading.Thread(target=self.poll, name="progress-monitor", daemon=True).start()

    def poll(self):
        while True:
            self.seen = len(self.worker.state.tasks)  # a dict's size: cheap, so it was never throttled
            if not self.busy:
                time.sleep(0.1)


def parse_line(i: int) -> int:
    total = 0
    for j in range(1_500_000):
        total += (i * 31 + j) % 97
    return total


if __name__ == "__main__":
    with Client() as client:
        client.register_plugin(ProgressMonitor())
        print(sum(client.gather(client.map(parse_line, range(40)))))
