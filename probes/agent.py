"""One agent per host, started by Dask itself: the plugins daskprobe registers on a running
cluster (WorkerAgent, SchedulerAgent) make sure each host runs one agent process, which samples
that host's Dask processes into a private directory: the Python sampler and /proc, the eBPF
probes (CPU, GIL, off-CPU) where it runs as root outside a container, and the messages on the
cluster's ports as this host's interfaces carry them (the packet tap, with root or CAP_NET_RAW). The recorder reads what is
new every STREAM_S, and the rest at the end, in chunks through Dask's own comms; then the agent
removes its directory.

The agent holds an abstract unix socket named after the recording: one per host (network
namespace), nothing listening on a network, and it answers processes of its own user only. It
ends when told, or once nobody has asked it anything for LEASE_S (the recorder went away, or this
host was cut off from it): then it keeps its directory, whose path its state gave the recorder.

    python -m daskprobe.probes.agent RUN_ID RATE     (started by the plugins, not by hand)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

from . import registry
from .base import LAST_READ_TIMEOUT
from .ebpf_format import timens_ns
from .procs import reap_exiting
from .proxy import start_tap, stop_proxy
from .rates import CPU_HZ, Sampling
from .rundir import RunDir
from .sockets import host_of, owned_by

LEASE_S = 60.0
STREAM_S = 10.0  # the recorder reads new bytes this often (and so renews the lease)
CHUNK = 4 << 20  # bytes per read: the recorder holds one at a time
CAPTURE_NAME = r"captures/[A-Za-z0-9_][A-Za-z0-9_.-]*"  # all the recorder accepts to write
PROBES = ["pyspy", "proc", "cpu", "gil", "offcpu"]  # those that need no ports; eBPF where root and not in a container
PR_SET_PTRACER = 0x59616D61
OPEN_TIMEOUT = 5.0  # s for the probes to write what is open at a read; missed, the next read has it


def _name(run_id: str) -> bytes:
    return b"\0daskprobe-agent-" + run_id.encode()


def ask(run_id: str, *words: str, timeout: float = 30.0) -> bytes:
    """One request to this host's agent, and its reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(_name(run_id))
        if _peer_uid(s) not in (0, os.geteuid()):  # another user took the name: not ours to believe
            raise PermissionError(f"the agent's socket is held by uid {_peer_uid(s)}")
        s.sendall((" ".join(words) + "\n").encode())
        s.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: s.recv(1 << 16), b""))


def _peer_uid(s: socket.socket) -> int:
    return struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]


def join(run_id: str, sampling: Sampling, name: str, role: str) -> None:
    """This process, measured by its host's agent from now on: the agent is started here if the
    host has none yet (of two started at once, one keeps the name and the other exits)."""
    try:
        agent = int(ask(run_id, "pid"))
    except OSError:
        args = [str(sampling.rate), str(sampling.cpu_hz), *(["fixed"] if sampling.fixed else [])]
        p = subprocess.Popen([sys.executable, "-m", "daskprobe.probes.agent", run_id, *args],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        p.stdout.readline()  # "ready", or nothing once it lost the name to another (or failed)
        p.stdout.close()
        try:
            agent = int(ask(run_id, "pid"))
        except OSError as e:
            raise RuntimeError(f"daskprobe's agent did not start on {socket.gethostname()} (exit code {p.wait(10)}, "
                               f"then {e}): `python -m daskprobe.probes.agent test 100` there says why") from None
        threading.Thread(target=p.wait, name="daskprobe-agent-reaper", daemon=True).start()  # no zombie left
    _let_trace(agent)
    ask(run_id, "watch", str(os.getpid()), name, role)


def _let_trace(tracer: int) -> None:
    """Under Yama's ptrace_scope 1, only ancestors read a process's memory, unless it names a tracer
    (PR_SET_PTRACER): this process names the agent, whose sampler is its child, as dask-pyspy does.
    Without Yama the call fails, and nothing needed it."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, ctypes.c_ulong(tracer), 0, 0, 0)


class _Joins:
    """What both plugins do as they start: join this host's agent, unless the recorder measures
    this host itself (`here`: the hosts of the members on the recorder's). `recorder`: the id
    of the recorder's Client."""

    def __init__(self, run_id: str, sampling: Sampling, here: set[str], recorder: str):
        self.name, self.run_id, self.sampling = f"daskprobe-{run_id}", run_id, Sampling(*sampling)
        self.here, self.recorder = here, recorder

    async def _join(self, address: str, role: str) -> None:
        if host_of(address) not in self.here:  # the agent may take a second to start: not on the event loop
            await asyncio.get_running_loop().run_in_executor(None, join, self.run_id, self.sampling, address, role)


class WorkerAgent(_Joins, WorkerPlugin):
    async def setup(self, worker) -> None:
        await self._join(worker.address, "worker")


class SchedulerAgent(_Joins, SchedulerPlugin):
    async def start(self, scheduler) -> None:
        await self._join(scheduler.address, "scheduler")

    def remove_client(self, scheduler, client: str) -> None:
        """The recorder's client gone without taking the plugins off (it was killed): both go, or
        every worker that starts later would start an agent for a recording nobody reads."""
        if client == self.recorder:
            scheduler.remove_plugin(self.name)
            if self.name in scheduler.worker_plugins:
                asyncio.ensure_future(scheduler.unregister_worker_plugin(None, self.name))


class Agent:
    def __init__(self, run_id: str, sampling: Sampling):
        self.dir = Path(tempfile.mkdtemp(prefix=f"daskprobe-agent-{run_id}-")).resolve()  # 0700, made afresh
        self.run, self.members, self.skipped, self.probes, self.stopped = RunDir(self.dir), [], {}, [], False
        self.tapped: dict[int, str] = {}  # port -> the member listening there, as the recorder names it
        self.tap = None
        try:
            self._start(sampling)
        except BaseException:  # a SIGTERM while the probes start too: nothing of it stays behind
            self.stop()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _start(self, sampling: Sampling) -> None:
        for sub in ("captures", "logs"):
            (self.dir / sub).mkdir()
        for probe in registry.make(PROBES, sampling.rate, False, sampling.cpu_hz, sampling.fixed):
            why = probe.available()
            self.skipped |= probe.partly_skipped() if why is None else dict.fromkeys(probe.name.split(","), why)
            if why is None:
                probe.start(self.run)
                self.probes.append(probe)
        for probe in list(self.probes):  # the eBPF agent compiles its programs meanwhile
            try:
                probe.ready()
            except RuntimeError as e:
                self.skipped |= dict.fromkeys(probe.name.split(","), str(e))
                self.probes.remove(probe)

    def watch(self, pid: str, name: str, role: str) -> bytes:
        if any(m["pid"] == int(pid) and m["name"] == name for m in self.members):
            return b"ok"  # a plugin registered again (a new recorder's client) joins it again
        row = {"pid": int(pid), "name": name, "role": role, "listen": None, "contact": None, "command": [],
               "joined_ns": time.monotonic_ns()}  # this host's clock: a member the recorder never saw is dated by it
        self.members.append(row)
        for probe in self.probes:
            probe.watch(row)
        return b"ok"

    def watch_ports(self, *ports: str) -> bytes:
        """The tap records the messages to and from these ports (PORT=NAME: the cluster's members,
        wherever they are) from now on; started at the first call."""
        new = {int(p): n for p, n in (w.split("=", 1) for w in ports) if self.tapped.get(int(p)) != n}  # or renamed
        if not all(0 < p < 65536 for p in new):
            raise ValueError("not a TCP port")
        if not new or self.stopped or "tap" in self.skipped:
            return b"ok"
        self.tapped |= new
        try:
            if self.tap is None:
                self.tap = start_tap(self.run.tap_capture, new, self.run.log("tap"))
            else:
                self.tap.stdin.writelines(f"{p}={n}\n".encode() for p, n in new.items())
                self.tap.stdin.flush()
        except (OSError, RuntimeError) as e:  # no CAP_NET_RAW here, or the tap died: the samples go on
            self.skipped["tap"] = f"{type(e).__name__}: {e}"[:500]
        return b"ok"

    def state(self) -> bytes:
        """What it measures and skipped, its captures' names and sizes so far, and the local address
        of each TCP socket its members hold now."""
        if not self.stopped:  # this read may be the host's last: no thread asleep is left to seem running
            for probe in self.probes:
                probe.write_open(OPEN_TIMEOUT)
        info = {"members": self.members, "skipped": self.skipped, "host": socket.gethostname(),
                "timens_ns": timens_ns(), "agent_pid": os.getpid(), "dir": str(self.dir)}
        files = {f"captures/{p.name}": p.stat().st_size for p in (self.dir / "captures").iterdir()}
        sockets = owned_by([m["pid"] for m in self.members])  # which member's connection is which
        return json.dumps({"info": info, "files": files, "sockets": sockets}).encode()

    def stop(self) -> bytes:
        """The probes stopped (their last bytes written); the state then."""
        if not self.stopped:
            for probe in self.probes:
                try:
                    probe.last_read(LAST_READ_TIMEOUT)
                except OSError as e:  # threads started in its last 200 ms may go unnamed: the rest stands
                    self.skipped[f"{probe.name} (last read)"] = f"{type(e).__name__}: {e}"[:500]
            for probe in self.probes:
                probe.stop()
            if self.tap is not None:
                stop_proxy(self.tap)
            reap_exiting()
            self.stopped = True
        return self.state()

    def read(self, name: str, offset: str) -> bytes:
        path = (self.dir / name).resolve()
        if path.parent not in (self.dir, self.dir / "captures"):
            return b""
        with open(path, "rb") as f:
            f.seek(int(offset))
            return f.read(CHUNK)

    def serve(self, listener: socket.socket) -> None:
        """Until told `done` (all read back: its directory goes), or nobody asked for LEASE_S (the
        recorder gone, or this host cut off from it): the probes stop and the captures stay in its
        directory, which the recorder's last read named (run.json `hosts`: `dir`)."""
        asked, verb = time.monotonic(), None  # only the recorder's user renews the lease
        try:
            while (left := asked + LEASE_S - time.monotonic()) > 0:
                listener.settimeout(left)
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    continue
                with conn:
                    verb = self.handle(conn)
                asked = time.monotonic() if verb else asked
                if verb == "done":
                    return
        finally:
            self.stop()
            if verb == "done":
                shutil.rmtree(self.dir, ignore_errors=True)

    def handle(self, conn: socket.socket) -> str | None:
        """Answer one request; its verb, or None if it was not the recorder's user's."""
        if _peer_uid(conn) not in (0, os.geteuid()):
            return None  # another user's process: not told anything, not obeyed
        conn.settimeout(10)
        words = b"".join(iter(lambda: conn.recv(1 << 16), b"")).decode(errors="replace").split()
        verbs = {"pid": lambda: str(os.getpid()).encode(), "watch": self.watch, "ports": self.watch_ports,
                 "state": self.state, "stop": self.stop, "read": self.read, "done": lambda: b"ok"}
        if not words or words[0] not in verbs:
            return None
        try:
            conn.sendall(verbs[words[0]](*words[1:]))
        except (TypeError, ValueError, OSError):
            pass
        return words[0]


def main(run_id: str, rate: str, cpu_hz: str = str(CPU_HZ), fixed: str = "") -> None:
    """`python -m daskprobe.probes.agent RUN_ID RATE [CPU_HZ [fixed]]`"""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(_name(run_id))
    except OSError:
        return  # this host has its agent already
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a kill still stops its probes
    agent = Agent(run_id, Sampling(float(rate), int(cpu_hz), fixed == "fixed"))
    print("ready", flush=True)
    agent.serve(listener)


if __name__ == "__main__":
    main(*sys.argv[1:5])
