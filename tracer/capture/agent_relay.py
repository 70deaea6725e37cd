"""The recorder's Dask Client, in a child process of its own that never runs as root (tracer/capture/agents.py
starts it as the cluster's user, the invoking user or nobody). A Client unpickles what the cluster
sends (every `client.run` result): here that can only run code as a user the cluster could reach
anyway. It registers the agents' plugins, asks them through `client.run`, and relays what they say
to the recorder as bytes: a request is a JSON line on stdin; each reply is

    u64 length (little-endian) | a JSON header line | raw bytes (an agent's reply)

The recorder checks every reply (its sizes, types and values): this process is the cluster's too.

    python -m daskprobe.tracer.capture.agent_relay     (started by tracer/capture/agents.py, not by hand)
"""

from __future__ import annotations

import json
import struct
import sys
import time

from ...probes.agent import SchedulerAgent, WorkerAgent, ask
from ...probes.sockets import host_of

ROUND_TRIPS = 5  # clock exchanges per host and read; the recorder keeps the quickest


class Relay:
    def __init__(self, address: str, run_id: str, sampling: list, here: list[str]):
        from distributed import Client
        self.client = Client(address, timeout=30, set_as_default=False)
        self.plugins = [WorkerAgent(run_id, sampling, set(here), self.client.id),
                        SchedulerAgent(run_id, sampling, set(here), self.client.id)]
        self.run_id = run_id
        for plugin in self.plugins:
            self.client.register_plugin(plugin)

    def hosts(self) -> dict:
        """Each host: a member there to ask its agent through, and whether that is the scheduler."""
        info = self.client.scheduler_info(n_workers=-1)  # all: some versions give 5 by default
        there = {host_of(info["address"]): (info["address"], True)}
        for w in sorted(info["workers"]):
            there.setdefault(host_of(w), (w, False))
        return {"hosts": there}

    def _on(self, member, fn, *args):
        address, scheduler = member
        if scheduler:
            return self.client.run_on_scheduler(fn, *args)
        return self.client.run(fn, *args, workers=[address])[address]

    def clock(self, member) -> dict:
        """(ours before, theirs, ours after) for each exchange: this host's clock is the recorder's."""
        out = []
        for _ in range(ROUND_TRIPS):
            t0 = time.monotonic_ns()
            theirs = self._on(member, time.monotonic_ns)
            out.append((t0, theirs, time.monotonic_ns()))
        return {"clock": out}

    def ask(self, member, words) -> tuple[dict, bytes]:
        said = self._on(member, ask, self.run_id, *words)
        if not isinstance(said, bytes):
            raise TypeError(f"the agent's reply is a {type(said).__name__}, not bytes")
        return {}, said

    def close(self) -> dict:
        """The plugins off the cluster (a worker that joins later starts no agent), the client closed."""
        worker, scheduler = self.plugins
        for unregister in (lambda: self.client.unregister_worker_plugin(worker.name),
                           lambda: self.client.unregister_scheduler_plugin(scheduler.name)):
            try:
                unregister()
            except Exception:  # not registered, or the cluster is gone: the agents end at their lease
                pass
        self.client.close()
        return {}


def reply(header: dict, data: bytes = b"") -> None:
    body = json.dumps(header, default=str).encode() + b"\n" + data
    sys.stdout.buffer.write(struct.pack("<Q", len(body)) + body)
    sys.stdout.buffer.flush()


def main() -> None:
    relay = None
    for line in sys.stdin:  # the recorder gone (its end of the pipe closed): the loop ends
        req = json.loads(line)
        do = req.pop("do")
        try:
            if do == "start":
                relay = Relay(**req)
                reply({"client": relay.client.id})
                continue
            got = getattr(relay, do)(**req)
            reply(*got) if isinstance(got, tuple) else reply(got)
        except Exception as e:  # this request only: the recorder decides what it costs
            reply({"error": f"{type(e).__name__}: {e}"[:1000]})
        if do == "close":
            return
    if relay:
        relay.close()


if __name__ == "__main__":
    main()
