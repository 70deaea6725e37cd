"""The recorder's side of the per-host agents (probes/agent.py) on an attached cluster's other
hosts: deployed as plugins through a Client; read as they go (every STREAM_S, what is new) and at
the end, in chunks, through that Client into run/hosts/HOST/; each host's CLOCK_MONOTONIC offset
to the recorder's estimated at every read."""

from __future__ import annotations

import json
import re
import time
import uuid

from ..probes.agent import CAPTURE_NAME, SchedulerAgent, WorkerAgent, ask
from ..probes.rundir import RunDir, open_append, write_new
from ..probes.sockets import host_of

ROUND_TRIPS = 5  # clock exchanges per host and read; the one with the shortest round trip of all is kept
HOST_NAME = re.compile(r"[A-Za-z0-9_:.-]+")


class Agents:
    """Plugins on the cluster at `address` that start an agent on each host not in `here`."""

    def __init__(self, address: str, here: set[str], rate: float):
        from distributed import Client
        self.run_id, self.here = uuid.uuid4().hex[:12], set(here)
        self.client = Client(address, timeout=30, set_as_default=False)
        self.plugins = [WorkerAgent(self.run_id, rate, self.here, self.client.id),
                        SchedulerAgent(self.run_id, rate, self.here, self.client.id)]
        self.seen: dict[str, dict] = {}  # host -> what its agent said, its clock, whether it was read to the end
        self.offsets: dict[tuple[str, str], int] = {}  # (host, capture) -> bytes read
        try:
            for plugin in self.plugins:
                self.client.register_plugin(plugin)
        except BaseException:  # a Ctrl-C too: no plugin may stay behind to start agents later
            self.close()
            raise

    def hosts(self) -> dict[str, tuple[str, bool]]:
        """Each host with an agent: (a member there to ask it through, whether that is the scheduler)."""
        info = self.client.scheduler_info(n_workers=-1)  # all: some versions give 5 by default
        there = {host_of(info["address"]): (info["address"], True)}
        for w in sorted(info["workers"]):
            there.setdefault(host_of(w), (w, False))
        return {h: m for h, m in there.items()
                if h not in self.here and HOST_NAME.fullmatch(h) and h not in (".", "..")}

    def _on(self, member: tuple[str, bool], fn, *args):
        address, scheduler = member
        if scheduler:
            return self.client.run_on_scheduler(fn, *args)
        return self.client.run(fn, *args, workers=[address])[address]

    def pull(self, run: RunDir, ports: dict[int, str], final: bool = False) -> None:
        """What each agent captured since the last pull (final: all of it, its probes stopped
        first, then the agent ended). Each agent's tap watches `ports` (port -> the member's name,
        the cluster's now) from then on. A host that no longer has a member to ask through keeps
        what was read before, marked incomplete."""
        try:
            hosts = self.hosts()
        except Exception as e:  # the scheduler gone: each host keeps what was read, and run.json says so
            for seen in self.seen.values() if final else ():
                seen.setdefault("error", f"the scheduler did not answer ({type(e).__name__}: {e})")
            return
        for host, member in hosts.items():
            seen = self.seen.setdefault(host, {"complete": False})
            if "error" in seen and not final:
                continue  # one that failed waits for the last pull: a hung agent stalls the recording once
            try:
                self._clock(host, member)
                if not final:
                    self._on(member, ask, self.run_id, "ports", *(f"{p}={n}" for p, n in sorted(ports.items())))
                state = json.loads(self._on(member, ask, self.run_id, "stop" if final else "state"))
                seen.update(state["info"])
                seen.setdefault("sockets", {}).update(state.get("sockets", {}))
                for name, size in state["files"].items():
                    if re.fullmatch(CAPTURE_NAME, name):  # whoever answers, nothing is written outside hosts/HOST/
                        self._fetch(run, host, member, name, int(size))
                if final:
                    self._on(member, ask, self.run_id, "done")
                    seen["complete"] = True
            except Exception as e:  # this host only: the member gone meanwhile, its agent dead or not ours
                seen["error"] = f"{type(e).__name__}: {e}"

    def _clock(self, host: str, member) -> None:
        """The host's offset (the recorder's clock minus its, ns) and uncertainty from the round trip
        with the shortest time so far; the host read its clock somewhere within it."""
        best = self.seen[host].get("rtt_ns", float("inf"))
        for _ in range(ROUND_TRIPS):
            t0 = time.monotonic_ns()
            theirs = self._on(member, time.monotonic_ns)
            t1 = time.monotonic_ns()
            if t1 - t0 < best:
                best = t1 - t0
                self.seen[host].update(rtt_ns=best, offset_ns=(t0 + t1) // 2 - theirs, uncertainty_ns=best // 2)

    def _fetch(self, run: RunDir, host: str, member, name: str, size: int) -> None:
        dest = run / "hosts" / host / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        at = self.offsets.get((host, name), 0)
        with open_append(dest) as f:
            while at < size:
                chunk = self._on(member, ask, self.run_id, "read", name, str(at))
                if not chunk:
                    break
                f.write(chunk)
                at += len(chunk)
        self.offsets[host, name] = at

    def finish(self, run: RunDir, ports: dict[int, str]) -> dict[str, dict]:
        """The last pull; run.json's `hosts` entries: clock offset, members, what was skipped, whether
        it was read to the end. Each host's agent info is kept beside its captures too."""
        try:
            self.pull(run, ports, final=True)
        finally:
            read = {h: s for h, s in self.seen.items() if "offset_ns" in s and "members" in s}
            for host, seen in read.items():
                if not seen["complete"]:
                    seen.setdefault("error", "no member of it left to read it through")
                (run / "hosts" / host).mkdir(parents=True, exist_ok=True)
                write_new(run / "hosts" / host / "agent.json", json.dumps(seen).encode())
        return read

    def close(self) -> None:
        """The plugins off the cluster (a worker that joins later starts no agent), the client closed."""
        worker, scheduler = self.plugins
        for unregister in (lambda: self.client.unregister_worker_plugin(worker.name),
                           lambda: self.client.unregister_scheduler_plugin(scheduler.name)):
            try:
                unregister()
            except Exception:  # not registered, or the cluster is gone: the agents end at their lease
                pass
        self.client.close()
