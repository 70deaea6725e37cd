"""A running cluster daskprobe did not start (`daskprobe attach`): its members found from the
scheduler's address, its messages recorded by the tap, its processes by the probes, and all of
it left running at the end. A member on another host is sampled by its host's agent
(tracer/capture/agents.py), its messages recorded only with this host's members."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...probes.schema import HOST_PID
from ...probes.sockets import host_of, listen_of
from ...probes.proxy import start_tap, stop_proxy
from ...probes.rates import Sampling
from ...probes.rundir import RunDir, open_append
from . import rpc
from .members import ADDRESS, on_this_host, verify
from .cluster import Member, describe


FOLLOW_S = 2.0  # how often the scheduler is asked for workers that joined or left


@dataclass
class AttachSpec:
    """What run.json's `cluster` says of an attached recording; read like a ClusterSpec's."""

    address: str
    proxy: bool = False
    tap: bool = True
    proxy_delay_us: int = 0
    agents: bool = True  # sample the members on other hosts with agents that Dask deploys
    comm_dir: str | None = None  # where the members' comm tap writes (they loaded probes/comm_tap.py): read at the end

    @property
    def comm_tap(self) -> bool:
        return self.comm_dir is not None


def ask_scheduler(address: str, op: str, timeout: float = 10.0, **kwargs):
    """One RPC to the scheduler, msgpack only (tracer/capture/rpc.py: root never unpickles what a cluster
    says; tls:// with the credentials of Dask's config): nothing runs on the cluster for it."""
    return rpc.ask(address, op, timeout, **kwargs)


def workers_of(address: str, timeout: float = 10.0, conn: rpc.Connection | None = None) -> dict[str, dict]:
    """The scheduler's workers (address -> its identity entry), from its `identity` RPC (on `conn`, if
    given). Entries that are not a worker's address and a mapping are left out: the scheduler is not
    trusted."""
    try:
        info = conn.ask("identity", timeout) if conn else ask_scheduler(address, "identity", timeout)
    except rpc.NotDask as e:  # another protocol's bytes read as Dask's frames (an SSH banner: a 2.8 EiB frame)
        raise RuntimeError(f"it does not speak Dask's protocol, or refused us ({e})") from None
    except ssl.SSLError as e:
        raise RuntimeError(f"{e} (Dask's TLS config: distributed.comm.tls.*)") from None
    if not isinstance(info, dict):
        raise RuntimeError("it does not speak Dask's protocol (its identity is not a mapping)")
    if info.get("type") != "Scheduler":
        said = info.get("type")
        raise RuntimeError(f"{address} is not a Dask scheduler (it says it is a {said if isinstance(said, str) else '?'})")
    workers = info.get("workers")
    return {a: w for a, w in workers.items() if isinstance(a, str) and ADDRESS.fullmatch(a) and isinstance(w, dict)} \
        if isinstance(workers, dict) else {}


def _cmdline(pid: int | None) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1] if pid else []
    except OSError:
        return []


class Attached:
    """The interface of Cluster that a session needs, for a cluster that was already running."""

    def __init__(self, spec: AttachSpec, run: RunDir):
        self.spec, self.run = spec, run
        self.members: list[Member] = []
        self.worker_info: list[dict] = []  # the scheduler's identity entry of each worker
        self.recorder: subprocess.Popen | None = None
        self.env = dict(os.environ)
        self.next_look = time.monotonic() + FOLLOW_S
        self.poll: rpc.Connection | None = None  # the comm the scheduler is asked on every FOLLOW_S
        self.left: set[str] = set()  # names of workers gone from the scheduler's list
        self.unverified: dict[str, str] = {}  # local members not profiled: name -> why
        self.agents = None
        self.sampling: Sampling | None = None  # how the agents sample; None: no agents
        self.puller: threading.Thread | None = None  # the pull running (or the agents starting), if one is
        self.agents_error: str | None = None
        self.partial_hosts: dict[str, str] = {}  # "agent@HOST" -> why its captures were not all read
        self.next_pull = 0.0
        self.stream_from: dict = {}  # where the next read of Dask's task stream starts; empty: none
        self.stream_missing, self.stream_error = 0, None

    def layout(self) -> None:
        """The scheduler and its workers as they are now, each with its local pid if it has one."""
        workers = workers_of(self.spec.address)
        self.worker_info = [workers[a] for a in sorted(workers)]
        named = [("scheduler", "scheduler", self.spec.address)]
        named += [(f"worker-{i}", "worker", addr) for i, addr in enumerate(sorted(workers))]
        with ThreadPoolExecutor(min(16, len(named))) as pool:  # each worker asked at once: a slow one costs ASK_S once
            self.members = list(pool.map(lambda n: self._member(*n), named))
        self._record_unverified()

    def _member(self, name: str, role: str, address: str) -> Member:
        """A member at this address; a local one profiled only once verified (tracer/capture/members.py),
        else recorded in run.json's `unverified` with the reason."""
        listen = listen_of(address)
        m = Member(name, role, listen, listen)
        m.machine = "local" if on_this_host(m.host) else m.host
        if m.machine == "local":
            m.pid, why = verify(address, role, self.spec.address)
            if why:
                self.unverified[name] = f"{address}: {why}"
        m.command = _cmdline(m.pid)
        return m

    def _record_unverified(self) -> None:
        if self.unverified:
            self.run.update_meta(unverified=self.unverified)

    def look(self) -> tuple[list[Member], list[Member]]:
        """(workers that joined, workers that left) since the last look: a scale-up, a nanny's
        restart, a death. One that joined is added to the members and its port to the tap's.
        Asked of the scheduler at most every FOLLOW_S seconds; nothing while it does not answer."""
        if time.monotonic() < self.next_look:
            return [], []
        if self.agents and time.monotonic() > self.next_pull:
            self._pull()
        if self.unread and self.stream_from:
            self._task_stream()
        try:
            self.poll = self.poll or rpc.Connection(self.spec.address, timeout=5.0)
            workers = workers_of(self.spec.address, timeout=5.0, conn=self.poll)
        except (OSError, RuntimeError):
            self._drop_poll()
            return [], []
        finally:
            self.next_look = time.monotonic() + FOLLOW_S
        now = {listen_of(addr): addr for addr in sorted(workers)}
        left = [m for m in self.workers if m.listen not in now and m.name not in self.left]
        self.left |= {m.name for m in left}
        for m in left:
            m.left_ns = time.monotonic_ns()
        # one back at the address of one that left (a fixed --worker-port) is a new process: a new member
        known, new = {m.listen for m in self.workers if m.name not in self.left}, []
        for listen in (listen for listen in now if listen not in known):
            new.append(self._member(f"worker-{len(self.workers)}", "worker", now[listen]))
            new[-1].found_ns = time.monotonic_ns()
            self.members.append(new[-1])
            self.worker_info.append(workers[now[listen]])
        if new:
            self._tap_watch(new)
            self._record_unverified()
        if self.agents is None and self.sampling and not self._pulling() and any(m.machine != "local" for m in new):
            # the first member on another host joined: the agents start in the pulls' thread (their
            # plugins wait for the agent each starts, seconds), the looks go on meanwhile
            self.puller = threading.Thread(target=self._deploy_later, name="daskprobe-agents", daemon=True)
            self.puller.start()
        return new, left

    def _deploy_later(self) -> None:
        from .say import say
        say(self.deploy_agents(self.sampling, later=True))

    def _tap_watch(self, members: list[Member]) -> None:
        """The tap watches their ports from now on."""
        if self.recorder is None:
            return
        try:
            self.recorder.stdin.writelines(f"{m.port}={m.name}\n".encode() for m in members)
            self.recorder.stdin.flush()
        except BrokenPipeError:  # the tap died: teardown says so, the recording goes on
            pass

    @property
    def workers(self) -> list[Member]:
        return [m for m in self.members if m.role == "worker"]

    def elsewhere(self) -> list[str]:
        """Members on other hosts: their messages with this host's are recorded here, the rest by agents."""
        return [m.name for m in self.members if m.machine != "local"]

    def unreadable(self) -> list[str]:
        """Members on this host whose process could not be found (another user's, without root) or
        verified as a Dask server of this cluster, with the reason."""
        return [f"{m.name} ({self.unverified.get(m.name, 'not found')})" for m in self.members
                if m.machine == "local" and m.pid is None]

    def ports(self) -> set[int]:
        return {m.port for m in self.members}

    def named_ports(self) -> dict[int, str]:
        """Each member's port and name (the latest at a port a restart reused): what the taps watch
        (none where the messages cannot be read)."""
        return {} if self.unread else {m.port: m.name for m in self.members}

    @property
    def unread(self) -> str | None:
        """Why this recording cannot read the cluster's messages; None if it can."""
        if self.spec.comm_tap:
            return None
        if self.spec.address.startswith("tls://"):
            return "tls:// comms are encrypted: their messages cannot be read"
        if not self.spec.tap:
            return "not root: the tap that reads the messages needs root (or CAP_NET_RAW)"
        return None

    def start(self) -> None:
        """The tap; where it cannot read the messages, Dask's own task stream instead (read from the
        scheduler's at each look and at the end, from its index now)."""
        self.started_ns = time.monotonic_ns()
        if self.spec.comm_tap:
            from .say import say
            say(f"messages: the comm tap's, read from {self.spec.comm_dir} at the end (those from now on)")
            return
        if not self.unread:
            self.recorder = start_tap(self.run.tap_capture, self.named_ports(), self.run.log("tap"))
            return
        try:
            index = ask_scheduler(self.spec.address, "get_task_stream_index")
            if type(index) is not int or index < 0:
                raise rpc.NotDask("its task stream index is not a count")
            self.stream_from = {"start_index": index}
        except Exception:  # before distributed 2025: by wall time (the workers' clocks)
            self.stream_from = {"start": time.time()}

    def ready(self) -> None:
        """Running already."""

    def client_address(self) -> str:
        return self.spec.address

    def deploy_agents(self, sampling: Sampling | None, later: bool = False) -> str | None:
        """Agents on the other hosts (probes/agent.py), to sample the members there as `sampling` says
        (None: none); what the user is told of those members (None: there are none, yet: a worker
        that joins on another host later starts them then, at look)."""
        self.sampling = sampling if self.spec.agents else None
        away = sorted({m.host for m in self.members if m.machine != "local"})
        if not away:
            return None
        said = f"not on this host: {', '.join(self.elsewhere())}: "
        if not self.sampling:
            return said + "only their messages are recorded"
        try:
            from ...probes.agent import STREAM_S
            from .agents import Agents, relay_user
            scheduler = next((m.pid for m in self.members if m.role == "scheduler"), None)
            agents = Agents(self.spec.address, {m.host for m in self.members if m.machine == "local"}, self.sampling,
                            self.run.log("agents"), relay_user(scheduler))
            self.agents = agents
            self._pull_now(self.named_ports()) if later else self._pull()
        except Exception as e:  # a cluster without daskprobe, or that refuses plugins: the rest goes on
            self.agents_error = f"{type(e).__name__}: {e}"[:1000]
            if not later:  # run.json is written by the main thread only
                self.run.update_meta(agents_error=self.agents_error)
            self.sampling = None  # not tried again at each look
            return said + (f"only their messages are recorded: no agents could start there ({type(e).__name__}: "
                           f"{str(e)[:300]}; is daskprobe installed on those hosts?)")
        return said + (f"agents on {', '.join(away)} sample them (stacks and /proc; eBPF where they run as root), "
                       f"read back every {STREAM_S:g} s and at the end")

    def _pull(self) -> None:
        """What the agents captured since the last pull (which renews their lease), in a thread: a
        host going away mid-read holds a Dask comm for up to its connect timeout (30 s), and the
        looks for workers that join or leave (and the tap's ports) must go on meanwhile. One pull
        at a time; one still running skips this one."""
        from ...probes.agent import STREAM_S
        self.next_pull = time.monotonic() + STREAM_S
        if self._pulling():
            return
        self.puller = threading.Thread(target=self._pull_now, args=(self.named_ports(),), name="daskprobe-agents",
                                       daemon=True)
        self.puller.start()

    def _pull_now(self, ports: dict[int, str]) -> None:
        try:
            self.agents.pull(self.run, ports)
        except Exception:  # the cluster not answering now (logged): the next pull, or the last, reads on
            pass

    def _pulling(self) -> bool:
        return bool(self.puller and self.puller.is_alive())

    def _pulled(self) -> None:
        """The running pull over (the last one needs the relay to itself); a relay hung past its own
        deadlines is ended, and what was read stays."""
        from .agents import REQUEST_S
        if self.puller:
            self.puller.join(2 * REQUEST_S)
            if self.puller.is_alive() and self.agents:
                self.agents._end_relay()
                self.puller.join(10)

    def collect_agents(self) -> str | None:
        """The agents' last captures read into run/hosts/, their members given the run's pids (pid P
        on host k: k·HOST_PID + P); what to tell the user (None: there were no agents). A host not
        read to the end keeps what was read, and makes the run partial: run.json's `probe_errors`
        says why ("agent@HOST")."""
        self._pulled()  # a pull, or agents starting, in the thread
        if self.agents is None:
            if self.agents_error:
                self.run.update_meta(agents_error=self.agents_error)
            return None
        try:
            hosts = self.agents.finish(self.run, self.named_ports())
        except Exception as e:  # what was read stays in hosts/, without its clock: said, and partial
            self.partial_hosts["agents"] = f"{type(e).__name__}: {e}"[:1000]
            self._record_partial()
            return f"reading the agents' captures failed ({type(e).__name__}: {e}): their samples are lost"
        finally:
            self.agents.close()
        unseen = []
        for number, (host, info) in enumerate(sorted(hosts.items()), start=1):
            info["number"] = number
            mine = [r for r in info["members"] if host_of(r["name"]) == host]  # an agent speaks for its host only
            unseen += self._give_pids(mine, number * HOST_PID, info["offset_ns"])
            if not info["complete"]:
                self.partial_hosts[f"agent@{host}"] = info.get("error", "its last member left")
        for host, info in self.agents.seen.items():
            if host not in hosts:  # never read once: nothing of it is here
                self.partial_hosts[f"agent@{host}"] = info.get("error", "never read")
        self.run.update_meta(hosts=hosts)
        self._record_partial()
        said = [f"{h} (its clock {i['offset_ns'] / 1e9:+.6f} s ± {i['uncertainty_ns'] / 1e6:.2f} ms from ours)"
                + ("" if i["complete"] else f" (read until {i.get('error', 'its last member left')}: the rest is lost"
                   + (f"; its agent keeps it in {i['dir']} there" if i.get("dir") else "") + ")")
                for h, i in sorted(hosts.items())]
        if not said:
            why = "; ".join(f"{h}: {e}" for h, e in sorted(self.partial_hosts.items()))
            return f"no agent could be read back ({why or 'none answered'}): their samples are lost"
        return "read back the agents on " + "; ".join(said) + "".join(
            f"; {m.name} ({m.listen}) seen by its host's agent only (it came and went between two looks)"
            for m in unseen)

    def _record_partial(self) -> None:
        if self.partial_hosts:
            errors = self.run.meta().get("probe_errors", {})
            self.run.update_meta(probe_errors=errors | self.partial_hosts, partial=True)

    def _give_pids(self, rows: list[dict], base: int, offset_ns: int) -> list[Member]:
        """The agent's members (in the order they joined it) to ours at the same address (in the
        order they were found): the latest to the latest, as a restart at a fixed port reuses one.
        One the scheduler never listed to us (it joined and left within FOLLOW_S) becomes a member
        of its own, found when it joined the agent; those are returned."""
        unseen = []
        for listen in sorted({listen_of(r["name"]) for r in rows}):
            theirs = [r for r in rows if listen_of(r["name"]) == listen]
            ours = [m for m in self.members if m.listen == listen]
            new = []
            for row, after in zip(theirs[:max(len(theirs) - len(ours), 0)], theirs[1:] + [{}]):
                m = Member(f"worker-{len(self.workers)}", row["role"], listen, listen)
                m.machine = m.host
                m.found_ns = row["joined_ns"] + offset_ns if "joined_ns" in row else None
                m.left_ns = after["joined_ns"] + offset_ns if "joined_ns" in after else None  # its successor's join
                self.members.append(m)
                new.append(m)
            unseen += new
            for m, row in zip(reversed(new + ours), reversed(theirs)):
                m.pid = base + row["pid"]
        return unseen

    def stop(self, grace: float = 5.0) -> list[subprocess.Popen]:
        """Only the tap: the cluster is not ours, and goes on. Without one, its task stream read."""
        if self.unread and self.stream_from:
            self._task_stream()
            self.run.update_meta(task_stream_missing=self.stream_missing, task_stream_error=self.stream_error)
            if self.stream_error:
                from .say import say
                say(f"Dask's task stream could not be read at the end: {self.stream_error}")
        self._drop_poll()
        if self.spec.comm_tap:
            self._merge_comm_tap()
        return stop_proxy(self.recorder, grace) if self.recorder else []

    def _merge_comm_tap(self) -> None:
        """The comm tap's records since the recording began, from the files of the directory's owner."""
        from ...probes.comm_capture import merge
        from ...probes.comm_tap import FLUSH_S
        from .say import say
        time.sleep(2 * FLUSH_S)  # the writers go on: let them write what came up to the command's end
        said = merge(Path(self.spec.comm_dir), self.run.comm_capture, None,
                     {m.pid: m.name for m in self.members if m.pid}, since_ns=getattr(self, "started_ns", 0),
                     live=True)
        if said:
            say(f"comm tap: {'; '.join(said[:5])}" + (f" (and {len(said) - 5} more)" if len(said) > 5 else ""))

    def _task_stream(self) -> None:
        """The tasks the scheduler's task stream has seen since the last read (each FOLLOW_S, and at
        the end): what the workers told it of each (worker, thread, compute and transfer spans on
        their wall clocks), appended as JSON lines. Its buffer is bounded: tasks that fell out
        between two reads are counted and said."""
        from .say import say
        try:
            start = self.stream_from.get("start_index")
            end = ask_scheduler(self.spec.address, "get_task_stream_index") if start is not None else None
            tasks = ask_scheduler(self.spec.address, "get_task_stream", 30.0, **self.stream_from)
            if not isinstance(tasks, (list, tuple)) or not (end is None or type(end) is int and end >= start):
                raise rpc.NotDask("its task stream is not a list of tasks")
            with open_append(self.run.task_stream) as f:
                f.writelines(json.dumps(t, default=str).encode() + b"\n" for t in tasks)
        except Exception as e:  # the scheduler busy or gone: the next read, or the last, reads on
            self.stream_error = f"{type(e).__name__}: {e}"
            return
        self.stream_error = None
        if start is None:
            self.stream_from = {"start": time.time()}
            return
        missing = max(0, end - start - len(tasks))
        self.stream_from = {"start_index": start + missing + len(tasks)}
        if missing:
            self.stream_missing += missing
            say(f"{missing} tasks fell out of Dask's task stream before daskprobe read it (it keeps the last "
                "distributed.scheduler.dashboard.status.task-stream-length or ...tasks.task-stream-length, "
                "whichever is larger)")

    def _drop_poll(self) -> None:
        if self.poll:
            self.poll.close()
            self.poll = None

    def describe(self) -> list[dict]:
        """The members, the tap, and the agents' relay: a Dask client of the scheduler that is daskprobe's,
        not the user's (its connections are a probe's)."""
        relay = self.agents and self.agents.relay
        return describe(self.members, self.recorder, tap=True) + (
            [{"name": "agent-relay", "role": "probe", "pid": relay.pid, "listen": None, "contact": None,
              "command": relay.args}] if relay else [])
