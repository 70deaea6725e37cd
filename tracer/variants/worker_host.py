"""Many Dask workers in one process: what lets hundreds of workers face one scheduler on a small machine.

Each worker is a real `distributed.Worker` (the same code as `dask worker`): its own listener, its own
connections to the scheduler (through the proxy or the tap), its heartbeats and keep-alives. Each listens
on a loopback address of its own (127.0.A.B) and opens its connections from it, so that the connections
of one process are told apart by their source address (daskprobe names a connection's end by its
process, else by that address). All of a process's workers share its event loop, its GIL and its memory, as
LocalCluster(processes=False) has them. With the zero worker (the usual use) each task completes at once,
so a process of 128 workers costs little CPU and the scheduler's load is what is measured.

Run by path by the cluster's interpreter (it may not have daskprobe):
  python worker_host.py SCHEDULER_ADDRESS SPEC_JSON
SPEC_JSON: {"workers": [{"name", "listen", "contact"}...], "protocol", "nthreads", "memory_limit",
"local_directory", "preload": [paths]}. Logs "hosted worker NAME registered" once each has registered,
and "End worker" once all have closed (what daskprobe waits for, as for `dask worker`).
"""

import asyncio
import contextvars
import json
import logging
import os
import signal
import sys

import dask
from distributed import Worker
from distributed.comm import tcp

logger = logging.getLogger("distributed.worker_host")
START_AT_ONCE = 32  # workers registering at a time: all at once made the scheduler's accept queue overflow
CLOSE_TIMEOUT = 2.0  # seconds; then the process exits anyway (daskprobe kills it after 5 s)
# Each worker's own upkeep that the scheduler never sees, multiplied by the workers of a process: its
# profiler (every 10 ms), event-loop tick (20 ms), system and memory monitors (0.5 s, 0.1 s). At 128 idle
# workers they took 0.34 of a CPU, 0.05 without; heartbeats and their metrics still go (staler metrics).
HOST_CONFIG = {"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
               "distributed.admin.system-monitor.interval": "10s", "distributed.worker.memory.monitor-interval": "10s"}


# The worker whose code runs: asyncio copies it into every task, callback and timer that code starts
SOURCE_IP = contextvars.ContextVar("source_ip", default=None)


def _bind_source(connector_class) -> None:
    """Connections open from the address of the worker that opens them."""
    args = connector_class._get_connect_args

    def _get_connect_args(self, **connection_args):
        ip = SOURCE_IP.get()
        return args(self, **connection_args) | ({"source_ip": ip} if ip else {})
    connector_class._get_connect_args = _get_connect_args


for _c in (tcp.TCPConnector, tcp.TLSConnector):
    _bind_source(_c)


async def _started(scheduler: str, spec: dict, w: dict) -> Worker:
    """A worker started in a context of its own (asyncio copies it into what it starts)."""
    SOURCE_IP.set(w["listen"].rsplit(":", 1)[0])
    worker = _worker(scheduler, spec, w)
    await worker.start()
    return worker


def _worker(scheduler: str, spec: dict, w: dict) -> Worker:
    proto = spec["protocol"]
    host, port = w["listen"].rsplit(":", 1)
    return Worker(scheduler, name=w["name"], host=host, port=int(port), protocol=proto,
                  contact_address=f"{proto}://{w['contact']}", nthreads=spec["nthreads"],
                  memory_limit=spec["memory_limit"], local_directory=spec["local_directory"],
                  preload=list(spec["preload"]), dashboard=False)


async def main(scheduler: str, spec: dict) -> None:
    dask.config.set(HOST_CONFIG)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    workers = []
    for i in range(0, len(spec["workers"]), START_AT_ONCE):
        batch = await asyncio.gather(*(asyncio.create_task(_started(scheduler, spec, w))
                                       for w in spec["workers"][i:i + START_AT_ONCE]))
        workers += batch
        for w in batch:
            logger.info("hosted worker %s registered", w.name)
    await stop.wait()
    # each tells the scheduler it leaves; none waits for its executor (the zero worker's runs nothing)
    await asyncio.wait([asyncio.ensure_future(w.close(reason="worker-host-close", executor_wait=False))
                        for w in workers], timeout=CLOSE_TIMEOUT)
    logger.info("End worker")


if __name__ == "__main__":
    with open(sys.argv[2]) as f:
        spec = json.load(f)
    sys.stdin.readline()  # gated, as daskprobe's other workers: distributed is imported, the scheduler listens
    asyncio.run(main(sys.argv[1], spec))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as daskprobe's other cluster processes: no teardown of hundreds of workers' modules and threads
