"""A task blocking the event loop: a worker plugin that reports every finished
task to a monitoring service with a synchronous call.

WorkerPlugin.transition runs on the worker's event loop, so the plugin's
20 ms blocking call (time.sleep stands for the HTTP round trip) holds up
every message the worker sends or receives. Twin (PLANT=0): the plugin
queues the report for a background thread instead.

cause: a task blocking the event loop
expect: event-loop-blocked
options: --workers 2 --threads 1
"""

import os
import queue
import threading
import time

from distributed import Client, WorkerPlugin

PLANT = os.environ.get("PLANT", "1") != "0"


def post_to_monitoring(key, finish):
    time.sleep(0.02)  # a blocking HTTP POST to the team's dashboard


class Monitor(WorkerPlugin):
    name = "monitor"

    def __init__(self, blocking: bool):
        self.blocking = blocking

    def setup(self, worker):
        self.reports = queue.Queue()
        if not self.blocking:
            threading.Thread(target=self._send, daemon=True).start()

    def _send(self):
        while True:
            post_to_monitoring(*self.reports.get())

    def transition(self, key, start, finish, **kwargs):
        if finish == "memory":
            if self.blocking:
                post_to_monitoring(key, finish)
            else:
                self.reports.put((key, finish))


def work(i):
    return sum(range(20_000 + i))


if __name__ == "__main__":
    with Client() as client:
        client.register_plugin(Monitor(blocking=PLANT))
        for _ in range(3):
            print(sum(client.gather(client.map(work, range(200), pure=False))))
