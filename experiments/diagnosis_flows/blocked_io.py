"""Blocked tasks: a futures loop that enriches 60 records from a slow remote
service, each call waiting 150 ms for its answer, on workers with one
thread each, so the threads sit blocked while the CPUs idle.

Twin (PLANT=0): the service answers at once.

cause: tasks blocked on I/O
expect: blocked-tasks
options: --workers 2 --threads 1
"""

import json
import os
import socket
import time

from distributed import Client, as_completed

PLANT = os.environ.get("PLANT", "1") != "0"
LATENCY_S = 0.15 if PLANT else 0.0


class SlowService:
    """A stand-in for a remote API: the answer comes after the service's latency."""

    def lookup(self, record_id: int) -> dict:
        left, right = socket.socketpair()
        with left, right:
            left.settimeout(LATENCY_S + 5)
            right.sendall(json.dumps({"id": record_id, "score": record_id % 7}).encode())
            time.sleep(LATENCY_S)  # the network round trip and the service's own work
            return json.loads(left.recv(4096))


def enrich(record_id: int) -> dict:
    answer = SlowService().lookup(record_id)
    return {"id": record_id, "score": answer["score"] * 1.5}


if __name__ == "__main__":
    with Client() as client:
        futures = client.map(enrich, range(60))
        total = 0.0
        for future in as_completed(futures):
            total += future.result()["score"]
        print(total)
