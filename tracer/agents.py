"""The recorder's side of the per-host agents (probes/agent.py) on an attached cluster's other
hosts: deployed as plugins through a Client, and at the end read back through it, in chunks, into
run/hosts/HOST/, with each host's CLOCK_MONOTONIC offset to the recorder's estimated on the way."""

from __future__ import annotations

import json
import time
import uuid

from ..probes.agent import CHUNK, MEMBERS, SchedulerAgent, WorkerAgent, ask, host_of
from ..probes.rundir import RunDir, open_whole

ROUND_TRIPS = 15  # clock exchanges per host; the one with the shortest round trip is kept


class Agents:
    """Plugins on the cluster at `address` that start an agent on each host not in `here`."""

    def __init__(self, address: str, here: set[str], rate: float):
        from distributed import Client
        self.run_id, self.here = uuid.uuid4().hex[:12], set(here)
        self.client = Client(address, timeout=30, set_as_default=False)
        self.plugins = [WorkerAgent(self.run_id, rate, self.here), SchedulerAgent(self.run_id, rate, self.here)]
        for plugin in self.plugins:
            self.client.register_plugin(plugin)

    def hosts(self) -> dict[str, tuple[str, bool]]:
        """Each host with an agent: (a member there to ask it through, whether that is the scheduler)."""
        info = self.client.scheduler_info()
        there = {host_of(info["address"]): (info["address"], True)}
        for w in sorted(info["workers"]):
            there.setdefault(host_of(w), (w, False))
        return {h: m for h, m in there.items() if h not in self.here}

    def _on(self, member: tuple[str, bool], fn, *args):
        address, scheduler = member
        if scheduler:
            return self.client.run_on_scheduler(fn, *args)
        return self.client.run(fn, *args, workers=[address])[address]

    def collect(self, run: RunDir) -> dict[str, dict]:
        """Every agent stopped and read back; run.json's `hosts` entries: clock offset and members."""
        out = {}
        for host, member in self.hosts().items():
            offset, error = self._clock(member)
            files = json.loads(self._on(member, ask, self.run_id, "stop"))
            for name, size in files.items():
                self._fetch(run, host, member, name, size)
            self._on(member, ask, self.run_id, "done")
            agent = json.loads((run / "hosts" / host / MEMBERS).read_text())
            out[host] = {"offset_ns": offset, "uncertainty_ns": error, **agent}
        return out

    def _clock(self, member) -> tuple[int, int]:
        """(offset, uncertainty) in ns: the recorder's clock minus the host's, from the round trip
        with the shortest time; the host read its clock somewhere within it."""
        best = None
        for _ in range(ROUND_TRIPS):
            t0 = time.monotonic_ns()
            theirs = self._on(member, time.monotonic_ns)
            t1 = time.monotonic_ns()
            if best is None or t1 - t0 < best[1] - best[0]:
                best = (t0, t1, theirs)
        t0, t1, theirs = best
        return (t0 + t1) // 2 - theirs, (t1 - t0) // 2

    def _fetch(self, run: RunDir, host: str, member, name: str, size: int) -> None:
        dest = run / "hosts" / host / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open_whole(dest) as f:
            for offset in range(0, size, CHUNK):
                f.write(self._on(member, ask, self.run_id, "read", name, str(offset)))

    def renew(self) -> None:
        """Each agent's lease taken up again: they end LEASE_S after the recorder last asked."""
        for member in self.hosts().values():
            self._on(member, ask, self.run_id, "pid")

    def close(self) -> None:
        """The plugins off the cluster (a worker that joins later starts no agent), the client closed."""
        worker, scheduler = self.plugins
        for unregister in (lambda: self.client.unregister_worker_plugin(worker.name),
                           lambda: self.client.unregister_scheduler_plugin(scheduler.name)):
            try:
                unregister()
            except Exception:  # the cluster may be gone: the agents end at their lease
                pass
        self.client.close()
