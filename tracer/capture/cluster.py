"""Start a scheduler, its workers and the proxies in front of them, on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import socket
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...probes.proxy import Route, start_proxy, start_tap, stop_proxy
from ...probes.procs import log_tail, our_child, spawn, stop

# A Dask process told SIGTERM closes gracefully, waiting on the others (without the proxy between them, on
# a scheduler closing too) for up to its comm timeouts: when daskprobe itself is killed, nothing is left to
# wait for, and the kernel's SIGKILL leaves no orphan
ORPHANED = signal.SIGKILL
from ...probes.rundir import RunDir
from ...probes.users import User
from ...probes.sockets import host_of, listening, split_address
from .. import variants
from .protocols import PROTOCOLS

HOST = "127.0.0.1"
NANNY_PRELOAD = Path(__file__).with_name("nanny_contact.py")
PEER_GUARD = Path(__file__).with_name("peer_guard.py")
COMM_TAP = Path(__file__).parents[2] / "probes" / "comm_tap.py"
# The environment a nanny sets in its worker before it starts (one BLAS and OpenMP thread per process,
# malloc trimming: distributed.nanny.pre-spawn-environ), the process's own environment first, without
# importing distributed: defines pre_spawn() in the cluster's interpreter.
PRE_SPAWN = (
    "def pre_spawn():\n"
    "    import importlib.util, os, dask.config, yaml\n"
    "    with open(os.path.join(importlib.util.find_spec('distributed').submodule_search_locations[0],\n"
    "                           'distributed.yaml')) as f:\n"
    "        dask.config.update_defaults(yaml.safe_load(f))\n"
    "    return {k: os.environ.get(k, str(v)) for k, v in\n"
    "            dask.config.get('distributed.nanny.pre-spawn-environ', {}).items() if v is not None}\n"
)
# `python -m MODULE ARGS` for a Dask CLI, except that once its main has returned (it has logged its
# end) the process runs its atexit handlers and exits without tearing its modules down: that took
# 0.2 s of CPU per process, while the run is being finalized. Any interpreter runs it (-c, not a file
# of ours); the current directory stays importable, as under -m. With --gated first, it imports the
# module's top package, then waits for a line (or the end) on stdin before it runs the module: a
# worker imports distributed (most of its start) while the scheduler starts, and connects once the
# scheduler listens.
EXIT_AFTER_MAIN = (
    "import atexit, importlib, os, runpy, sys, threading\n"
    # A worker without a nanny gets that environment too, as `dask worker` and LocalCluster give; before
    # numpy loads.
    + PRE_SPAWN +
    "if '--no-nanny' in sys.argv:\n"
    "    os.environ.update(pre_spawn())\n"
    "if sys.argv[1] == '--gated':\n"
    "    del sys.argv[1]\n"
    "    importlib.import_module(sys.argv[1].partition('.')[0])\n"
    "    sys.stdin.readline()\n"
    # A --preload on Dask's command line replaces the config's preloads: ours (the peer guard) must add to
    # them instead, as the config this process reads has them.
    "import dask.config\n"
    "for opt, kind in (('--preload', 'scheduler' if 'scheduler' in sys.argv[1] else 'worker'),\n"
    "                  ('--preload-nanny', 'nanny')):\n"
    "    mine = dask.config.get(f'distributed.{kind}.preload', None) or []\n"
    "    if opt in sys.argv:\n"
    "        sys.argv += [a for p in ([mine] if isinstance(mine, str) else mine) for a in (opt, p)]\n"
    "try:\n"
    "    runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n"
    "    code = 0\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "threading._shutdown()\n"
    "atexit._run_exitfuncs()\n"
    "if code is not None and not isinstance(code, int):\n"
    "    print(code, file=sys.stderr)\n"
    "    code = 1\n"
    "sys.stdout.flush()\n"
    "sys.stderr.flush()\n"
    "os._exit(code or 0)\n")


@dataclass
class ClusterSpec:
    workers: int = 2
    threads: int | None = None  # None: as LocalCluster, the machine's cores / workers, rounded up
    nanny: bool = False
    python: str = "python"
    server_cmd: str | None = None
    config: dict[str, str] = field(default_factory=dict)
    proxy: bool = True
    tap: bool = False  # record the messages from the wire instead (root)
    proxy_delay_us: int = 0
    start_timeout: float = 60.0
    scheduler: str = "ws"
    worker: str = "normal"
    memory: int | None = None  # bytes per worker (0: no limit); None: as LocalCluster, see memory_limit
    protocol: str = "tcp"  # one of PROTOCOLS; tls: encrypted with certificates made for the run
    comm_tap: bool = False  # record the messages inside Dask's comms (probes/comm_tap.py): what reads tls://
    workers_per_process: int = 1  # >1: that many workers share a process (tracer/variants/worker_host.py)
    scheduler_cpu: int | None = None  # the scheduler alone on this CPU, the other processes on the others

    def __post_init__(self):
        if self.scheduler not in variants.SCHEDULERS or self.worker not in variants.WORKERS:
            raise ValueError(f"scheduler must be one of {', '.join(variants.SCHEDULERS)} and worker one of "
                             f"{', '.join(variants.WORKERS)}")
        if self.server_cmd and self.scheduler != "ws":
            raise ValueError(f"--scheduler {self.scheduler} replaces Dask's scheduler policy by a preload; "
                             "with --server-cmd, choose the policy in the server's own command instead")
        if self.proxy + self.tap + self.comm_tap > 1:
            raise ValueError("the proxy, the tap and the comm tap each record the messages: choose one")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}")
        if self.protocol != "tcp" and (self.proxy or self.tap):
            raise ValueError(f"the proxy and the tap read tcp:// only: {self.protocol}:// messages are the comm tap's")
        if self.workers > variants.MAX_PROCESSES and self.workers_per_process == 1:
            raise ValueError(f"more than {variants.MAX_PROCESSES} workers need --workers-per-process (each process "
                             "costs ~70 MB and its own CPU)")
        if self.workers_per_process < 1 or (self.workers_per_process > 1 and self.nanny):
            raise ValueError("--workers-per-process must be 1 or more, and 1 with --nanny (a nanny restarts "
                             "one worker's process)")
        if self.scheduler_cpu is not None:
            check_scheduler_cpu(self.scheduler_cpu)
        self.config = {**self.config, **variants.SCHEDULERS[self.scheduler].config}
        cpus = len(self.cpus("worker") or ()) or os.cpu_count() or 1  # the workers' CPUs: the scheduler's apart
        self.threads = self.threads or -(-cpus // self.workers)

    def cpus(self, role: str) -> frozenset[int] | None:
        """Where a process of this role runs (None: anywhere): with --scheduler-cpu the scheduler alone on
        its CPU, as on a cluster where it has a machine, so that hundreds of workers on this one cannot
        take its CPU; the workers and the command on the others."""
        if self.scheduler_cpu is None:
            return None
        others = frozenset(os.sched_getaffinity(0) - {self.scheduler_cpu})
        return frozenset({self.scheduler_cpu}) if role == "scheduler" else others

    def memory_limit(self) -> int:
        """Bytes per worker (0: no limit): --memory-limit, else as LocalCluster, the machine's memory
        shared out evenly (`dask worker` alone would give each worker memory in proportion to its
        threads, whatever the worker count)."""
        if self.memory is None and self.workers_per_process > 1:
            return 0  # a worker's memory is its process's, all its neighbours' too: a limit would pause them all
        return self.memory if self.memory is not None else machine_memory() // self.workers


def check_scheduler_cpu(cpu: int) -> None:
    """ValueError unless `cpu` is one daskprobe may use and at least one other is left for the rest."""
    allowed = os.sched_getaffinity(0)
    if cpu not in allowed or len(allowed) < 2:
        raise ValueError(f"--scheduler-cpu {cpu}: the CPUs daskprobe may use are {sorted(allowed)}; the scheduler "
                         "takes one of them and the rest need at least one other")


def hosted_address(i: int) -> str:
    """Worker i's own loopback address when workers share a process: it listens there and connects from
    there, so its connections are told from its neighbours' (connections_table names them by it)."""
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


def machine_memory() -> int:
    """The machine's memory, bytes (MemTotal)."""
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemTotal:")) * 1024


@dataclass
class Member:
    """One cluster process: what it is, where it listens, where it is reached."""

    name: str
    role: str
    listen: str
    contact: str
    proc: subprocess.Popen | None = None  # what we started and stop (a nanny for its worker)
    pid: int | None = None                # the process that is this member
    command: list[str] = field(default_factory=list)
    machine: str = "local"                # the host it runs on: local (daskprobe's) or its address's host
    found_ns: int | None = None           # when an attached recording found it (None: there from the start)
    process_of: str | None = None         # the member whose process it shares (--workers-per-process), or None
    left_ns: int | None = None            # when an attached recording saw it gone

    @property
    def port(self) -> int:
        """The port it listens on (the tap's, the readiness checks')."""
        return split_address(self.listen)[1]

    @property
    def host(self) -> str:
        """The host it listens on (an IPv6 address without its brackets)."""
        return host_of(self.listen)


class StartError(RuntimeError):
    pass


def free_port() -> int:
    """A port free now, outside the kernel's range of ephemeral ports, and not one this process
    handed out before. The members bind theirs seconds later (after their imports), and an
    ephemeral port handed back may meanwhile become the local end of any outgoing connection on
    the machine: a worker then failed to start with "Address already in use". Below that range
    only an explicit bind takes a port, such as a member's given the same one (drawn twice at
    random, both free until the first bound it: seen in CI)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        with socket.socket() as s:
            try:
                s.bind((HOST, random.randrange(10000, low) if low > 11000 else 0))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:  # the kernel's choice (port 0) is checked too
            _HANDED_OUT.add(port)
            return port
    raise StartError(f"no free port on {HOST} below {low} after 100 tries")


_HANDED_OUT: set[int] = set()


def dask_env(config: dict[str, str]) -> dict[str, str]:
    """--config key=value as DASK_* variables, read by every Dask process."""
    env = dict(os.environ)
    for key, value in config.items():
        env["DASK_" + key.upper().replace(".", "__").replace("-", "_")] = value
    return env


def _listening(port: int) -> bool:
    # The kernel's socket table rather than a connection: a probe connection would show up in the
    # server's logs and in our own capture.
    return bool(listening(port))


class Cluster:
    def __init__(self, spec: ClusterSpec, run: RunDir, user: User | None = None):
        """`user` runs the cluster (None: whoever runs daskprobe)."""
        self.spec, self.run, self.user = spec, run, user
        # Only the cluster's user and the proxy (ours) may connect to it (peer_guard.py); Dask's HTTP
        # servers serve nothing: on loopback, any local user can reach them.
        self.allow_uids = tuple(sorted({user.uid if user else os.geteuid(), os.geteuid()}))
        # Dask's scratch space (the nanny copies preloads there) private to the run; another user's in a
        # directory of its own (the run directory may sit where only we may go), removed at the end
        self.scratch = run.scratch
        if user and not user.is_us:
            self.scratch = Path(tempfile.mkdtemp(prefix="daskprobe-scratch-"))
            os.chown(self.scratch, user.uid, user.gid)
        self.env = dask_env(spec.config) | {
            "DASK_TEMPORARY_DIRECTORY": str(self.scratch), "DASKPROBE_ALLOW_UIDS": ",".join(map(str, self.allow_uids)),
            "DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES": "[]", "DASK_DISTRIBUTED__WORKER__HTTP__ROUTES": "[]"}
        self.members: list[Member] = []
        self.recorder: subprocess.Popen | None = None  # the proxy or the tap: what records the messages
        self.comm_dir = self._comm_tap() if spec.comm_tap else None
        if spec.protocol == "tls":
            self.env |= tls_env(self._own_dir("tls"), user)

    def _own_dir(self, name: str) -> Path:
        """A new directory of the cluster's user in its scratch space."""
        d = self.scratch / name
        d.mkdir(mode=0o700)
        if self.user and not self.user.is_us:
            os.chown(d, self.user.uid, self.user.gid)
        return d

    def _comm_tap(self) -> Path:
        d = self._own_dir("comm")
        # a nanny runs its worker's preloads from copies in the worker's directory: the records' definition by path
        self.env |= {"DASKPROBE_COMM_TAP_DIR": str(d),
                     "DASKPROBE_CAPTURE_RECORDS": str(COMM_TAP.with_name("capture_records.py"))}
        return d

    @property
    def scheduler(self) -> Member:
        return self.members[0]

    def _member(self, name: str, role: str, host: str = HOST) -> Member:
        port = free_port()
        contact = f"{HOST}:{free_port()}" if self.spec.proxy else f"{host}:{port}"
        m = Member(name, role, f"{host}:{port}", contact)
        self.members.append(m)
        return m

    def layout(self) -> None:
        """Choose every address up front, so the proxy can start first."""
        self._member("scheduler", "scheduler")
        for i in range(self.spec.workers):
            self._member(f"worker-{i}", "worker", hosted_address(i) if self.spec.workers_per_process > 1 else HOST)
            if self.spec.nanny:
                self._member(f"nanny-{i}", "nanny")

    def ports(self) -> set[int]:
        return {int(a.split(":")[1]) for m in self.members for a in (m.listen, m.contact)}

    def start(self) -> None:
        """Start what layout() planned: proxy, scheduler, workers. The workers import what they
        need meanwhile, and wait for ready() to let them connect."""
        if self.spec.proxy:
            routes = [Route(m.contact, m.listen, m.name) for m in self.members]
            self.recorder = start_proxy(self.run.proxy_capture, routes, self.run.log("proxy"), self.spec.proxy_delay_us,
                                        self.allow_uids)
        elif self.spec.tap:
            ports = {m.port: m.name for m in self.members}
            self.recorder = start_tap(self.run.tap_capture, ports, self.run.log("tap"), loopback=True)
        self._start_scheduler()
        if self.spec.workers_per_process > 1:
            for group in self._groups():
                self._start_host(group)
            return
        for w in self.workers:
            self._start_worker(w)

    def _groups(self) -> list[list[Member]]:
        k = self.spec.workers_per_process
        return [self.workers[i:i + k] for i in range(0, len(self.workers), k)]

    def _start_host(self, group: list[Member]) -> None:
        """One process for the group's workers (tracer/variants/worker_host.py): the first member is that
        process (its pid, its log), the others name it in process_of and have no pid of their own, so
        the process is sampled once."""
        lead = group[0]
        spec = {"workers": [{"name": m.name, "listen": m.listen, "contact": m.contact} for m in group],
                "protocol": self.spec.protocol, "nthreads": self.spec.threads,
                "memory_limit": self.spec.memory_limit(), "local_directory": str(self.scratch),
                "preload": [str(f) for f in [*self._own_preloads(),
                                             *variants.WORKERS[self.spec.worker].preload_files()]]}
        path = self.scratch / f"{lead.name}-host.json"
        path.write_text(json.dumps(spec))
        if self.user and not self.user.is_us:
            os.chown(path, self.user.uid, self.user.gid)
        lead.command = [self.spec.python, str(variants.worker_host()), f"{self.spec.protocol}://{self.scheduler.contact}",
                        str(path)]
        lead.proc = spawn(lead.command, self.run.log(lead.name), env=self.env, stdin=subprocess.PIPE, user=self.user,
                          death=ORPHANED, cpus=self.spec.cpus("worker"))
        lead.pid = lead.proc.pid
        for m in group[1:]:
            m.process_of, m.command = lead.name, lead.command

    def ready(self) -> None:
        """Wait for the scheduler to listen, let the workers go on, wait for them to register."""
        s = self.scheduler
        self._wait(s, lambda: _listening(s.port))
        for w in self.workers:
            if w.proc:
                _ungate(w.proc)
        for w in self.workers:
            if self.spec.workers_per_process > 1:
                lead = next(m for m in self.workers if m.name == (w.process_of or w.name))
                self._wait(lead, lambda w=w, lead=lead: f"hosted worker {w.name} registered" in
                           log_tail(self.run.log(lead.name), 10**6))
                continue
            self._wait(w, lambda w=w: "Registered to" in log_tail(self.run.log(w.name), 10**6))
            if self.spec.nanny:
                self._find_nanny_child(w)

    @property
    def workers(self) -> list[Member]:
        return [m for m in self.members if m.role == "worker"]

    def _start_scheduler(self) -> None:
        s = self.scheduler
        host, port = s.listen.split(":")
        if self.spec.server_cmd:
            s.command = shlex.split(self.spec.server_cmd.format(host=host, port=port))
        else:
            s.command = [self.spec.python, "-c", EXIT_AFTER_MAIN, "distributed.cli.dask_scheduler",
                         "--host", host, "--port", port, "--protocol", self.spec.protocol,
                         "--no-dashboard", "--dashboard-address", f"{HOST}:0",
                         *_preloads([*self._own_preloads(),
                                     *variants.SCHEDULERS[self.spec.scheduler].preload_files()])]
        s.proc = spawn(s.command, self.run.log(s.name), env=self.env, user=self.user, death=ORPHANED,
                       cpus=self.spec.cpus("scheduler"))
        s.pid = s.proc.pid

    def _start_worker(self, w: Member) -> None:
        w.command = [self.spec.python, "-c", EXIT_AFTER_MAIN, "--gated", "distributed.cli.dask_worker",
                     f"{self.spec.protocol}://{self.scheduler.contact}", "--name", w.name,
                     "--listen-address", f"{self.spec.protocol}://{w.listen}",
                     "--contact-address", f"{self.spec.protocol}://{w.contact}",
                     "--nthreads", str(self.spec.threads), "--memory-limit", str(self.spec.memory_limit()),
                     "--no-dashboard", "--dashboard-address", f"{HOST}:0",
                     "--local-directory", str(self.scratch),
                     *_preloads([*self._own_preloads(), *variants.WORKERS[self.spec.worker].preload_files()])]
        env = self.env
        if self.spec.nanny:
            nanny = self.members[self.members.index(w) + 1]
            w.command += ["--nanny", "--nanny-port", str(nanny.port),
                          "--preload-nanny", str(NANNY_PRELOAD),
                          *[a for f in self._own_preloads() for a in ("--preload-nanny", str(f))]]
            env = dict(env, DASKPROBE_NANNY_CONTACT=f"{self.spec.protocol}://{nanny.contact}")
        else:
            w.command.append("--no-nanny")
        w.proc = spawn(w.command, self.run.log(w.name), env=env, stdin=subprocess.PIPE, user=self.user,
                       death=ORPHANED, cpus=self.spec.cpus("worker"))
        w.pid = w.proc.pid

    def _own_preloads(self) -> list[Path]:
        return [PEER_GUARD, *([COMM_TAP] if self.spec.comm_tap else [])]

    def _find_nanny_child(self, w: Member) -> None:
        """Under a nanny the worker runs in a child the nanny spawned
        (multiprocessing's spawn_main); the process we started is the nanny."""
        nanny = self.members[self.members.index(w) + 1]
        nanny.pid = w.proc.pid
        w.pid = next((pid for pid, cmd in _children(nanny.pid) if "spawn_main" in cmd), None)

    def _wait(self, m: Member, ready) -> None:
        deadline = time.monotonic() + self.spec.start_timeout
        while not ready():
            if m.proc.poll() is not None:
                raise StartError(f"{m.name} exited with code {m.proc.returncode} while starting; "
                                 f"end of {self.run.log(m.name)}:\n{log_tail(self.run.log(m.name))}")
            if time.monotonic() > deadline:
                raise StartError(f"{m.name} not ready after {self.spec.start_timeout:.0f} s; "
                                 f"end of {self.run.log(m.name)}:\n{log_tail(self.run.log(m.name))}")
            time.sleep(0.05)

    def client_address(self) -> str:
        return f"{self.spec.protocol}://{self.scheduler.contact}"

    def stop(self, grace: float = 5.0) -> list[subprocess.Popen]:
        """Workers first, then the scheduler, the proxy (or tap) last so it sees them go. A Dask process
        has done all it does once it logs its end; its atexit handlers may still run, which the
        run does not wait for (it reaps them before it ends). Sockets it still holds then, the
        proxy records as closed when it stops. Those that had to be killed."""
        killed = stop([m.proc for m in self.workers if m.proc], grace, done=self._logged("End worker"))
        killed += stop([self.scheduler.proc] if self.members and self.scheduler.proc else [], grace,
                       done=self._logged("End scheduler"))
        killed += stop_proxy(self.recorder, grace) if self.recorder else []
        if self.comm_dir:
            self._merge_comm_tap(grace)
        if self.scratch != self.run.scratch:  # rmtree follows no link the cluster's user left there
            shutil.rmtree(self.scratch, ignore_errors=True)
        return killed

    def _merge_comm_tap(self, grace: float) -> None:
        from ...probes.comm_capture import merge  # here: it imports pandas, which starting a run needs not
        # A member that logged its end writes the comm tap's last records at exit (its atexit): merged before
        # that, they were lost and the run partial (seen in the tests). Wait for the exits, up to `grace`.
        deadline = time.monotonic() + grace
        for m in self.members:
            with contextlib.suppress(subprocess.TimeoutExpired):
                if m.proc:
                    m.proc.wait(max(0.0, deadline - time.monotonic()))
        said = merge(self.comm_dir, self.run.comm_capture, self.user.uid if self.user else os.geteuid(),
                     {m.pid: m.name for m in self.members if m.pid})
        if said:
            from .say import say
            say(f"comm tap: {'; '.join(said[:5])}" + (f" (and {len(said) - 5} more)" if len(said) > 5 else ""))

    def _logged(self, end: str):
        """Whether a member's process has logged `end` (a --server-cmd scheduler never does: it is
        waited for)."""
        logs = {m.proc.pid: self.run.log(m.name) for m in self.members if m.proc}
        return lambda p: end in log_tail(logs[p.pid], 500)

    def describe(self) -> list[dict]:
        return describe(self.members, self.recorder, tap=self.spec.tap)


def describe(members: list[Member], recorder: subprocess.Popen | None, tap: bool) -> list[dict]:
    """Processes as run.json and the processes table record them: the members, then what records
    their messages (the proxy, or the tap, which is off the data path: a probe)."""
    rows = [{"name": m.name, "role": m.role, "pid": m.pid, "listen": m.listen, "contact": m.contact,
             "command": m.command, "host": m.machine, "found_ns": m.found_ns, "left_ns": m.left_ns}
            for m in members]
    if recorder:
        name, role = ("tap", "probe") if tap else ("proxy", "proxy")
        rows.append({"name": name, "role": role, "pid": recorder.pid, "listen": None, "contact": None,
                     "command": recorder.args})
    return rows


def tls_env(d: Path, user: User | None) -> dict[str, str]:
    """Dask's TLS settings for every process (and the command) with a self-signed certificate and key
    made for the run by openssl in `d` (the cluster's user's, 0600), as Security.temporary() would (it
    needs the `cryptography` package, which the cluster's interpreter may not have): each end checks
    the other's certificate against it, and unencrypted comms are refused."""
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=dask-internal",
                    "-days", "7", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    for f in (cert, key):
        os.chmod(f, 0o600)
        if user and not user.is_us:
            os.chown(f, user.uid, user.gid)
    env = {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(cert), "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
    for role in ("scheduler", "worker", "client"):
        env |= {f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__CERT": str(cert),
                f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__KEY": str(key)}
    return env


def _ungate(proc: subprocess.Popen) -> None:
    """Let a --gated process go on (one that died meanwhile is reported by the wait that follows)."""
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(b"\n")
        proc.stdin.close()


def _preloads(files: list[Path]) -> list[str]:
    return [arg for f in files for arg in ("--preload", str(f))]


def _children(ppid: int) -> list[tuple[int, str]]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == ppid:
                out.append((int(stat.parent.name), (stat.parent / "cmdline").read_text().replace("\0", " ")))
        except (OSError, ValueError, IndexError):
            continue
    return out


def ask_versions(python: str, user: User | None = None, environ: bool = False) -> Callable[[], dict]:
    """Ask an interpreter (the cluster's, the command's: they may differ from ours) for its version
    and its packages', as `user` (what a user's interpreter imports is theirs to choose: never run it
    as root); the call returned waits for the answer. Asked early, answered meanwhile. `environ`: and
    the environment its workers get before they start (PRE_SPAWN), as `pre_spawn_environ`."""
    code = ("import json, sys, platform, importlib.metadata\n"
            "out = {'python': platform.python_version(), 'executable': sys.executable}\n"
            "for m in ('dask', 'distributed', 'tornado', 'msgpack'):\n"
            "    try: out[m] = importlib.metadata.version(m)\n"
            "    except Exception: out[m] = None\n"
            + (PRE_SPAWN + "try: out['pre_spawn_environ'] = pre_spawn()\n"
               "except Exception: pass\n" if environ else "") +
            "print(json.dumps(out))")
    try:
        proc = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, preexec_fn=our_child, **(user.popen() if user else {}))
    except OSError as e:
        failed = {"error": f"{python}: {e}"}  # `e` is unbound once the except clause ends
        return lambda: failed

    def answer() -> dict:
        try:
            return json.loads(proc.communicate(timeout=60)[0])
        except (ValueError, subprocess.TimeoutExpired) as e:
            proc.kill()
            return {"error": f"{python}: {e}"}
    return answer
