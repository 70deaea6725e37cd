"""One `daskprobe run`: lay out the run directory, start the cluster behind the
probes, run the user's command, tear everything down, then finalize."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from ...probes import rates
from ...probes.base import LAST_READ_TIMEOUT, Probe, ended_early, is_root
from . import dask_versions
from .cluster import Cluster, ClusterSpec, StartError, ask_versions
from ...probes.local_scheduler import CommandCaptures, descendants, pool_process, runs_as
from ...probes.procs import our_child, pin
from ...probes.rundir import RunDir
from ...probes.users import User
from .say import disk_of, record, say
from .. import variants

class Interrupted(BaseException):
    """A signal, unwinding to teardown: a BaseException, so no `except Exception`
    on the way (a probe's start, say) can swallow it."""

    def __init__(self, signum: int):
        self.signum = signum


def clock_anchor() -> dict:
    """One instant on both clocks, to map CLOCK_MONOTONIC ns to wall time."""
    return {"monotonic_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}


class Signals:
    """SIGINT and SIGTERM, in the three phases of a run. While the command runs
    (and while finalizing): pass the signal to the command, then unwind
    (Interrupted). During teardown: do not unwind, but hurry: a second signal
    stops waiting for graceful exits. The first signal is kept for the exit code."""

    def __init__(self):
        self.client: subprocess.Popen | None = None
        self.unwinding, self.hurry, self.signum = True, False, None
        self.deferring = False

    def __enter__(self):
        self.saved = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, h in self.saved.items():
            signal.signal(s, h)

    def _handle(self, signum, frame):
        self.signum = self.signum or signum
        if self.client and self.client.poll() is None:
            self.client.send_signal(signum)
        if self.deferring:
            return  # unwinds when the block ends (deferred)
        if self.unwinding:
            raise Interrupted(signum)
        self.hurry = True

    @contextlib.contextmanager
    def deferred(self):
        """A block a signal must not cut: it unwinds once the block ends. An import cut halfway
        leaves a package half-made in sys.modules (numpy's: every stage failed after)."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        self.check()

    def check(self) -> None:
        """Unwind now if a signal came whose Interrupted was lost: raised inside a finalizer
        (a __del__ that ran at that moment), Python prints it as ignored and goes on."""
        if self.signum and self.unwinding:
            if self.client and self.client.poll() is None:
                self.client.send_signal(self.signum)
            raise Interrupted(self.signum)

    @property
    def grace(self) -> float:
        return 0.2 if self.hurry else 5.0


def _ready(started: list[Probe], run: RunDir) -> None:
    """Wait for each started probe to capture; one that cannot is stopped and recorded as skipped."""
    skipped = {}
    for p in list(started):
        try:
            p.ready()
        except Exception as e:  # a probe that fails to start must not cost the run
            started.remove(p)
            p.stop(0.5)
            skipped.update(dict.fromkeys(p.name.split(","), f"failed to start: {e}"))
            say(f"probe {p.name} skipped: failed to start: {e}")
    if skipped:
        run.update_meta(skipped=run.meta().get("skipped", {}) | skipped)


def _start_probes(probes: list[Probe], run: RunDir, ports: set[int], started: list[Probe]) -> None:
    """Start what can run here (into `started`, so that an interrupted start-up
    still stops what did start); say why the rest cannot and record it."""
    skipped = {}
    for p in probes:
        why = p.available()
        if why is None:
            partly = p.partly_skipped()
            started.append(p)  # before it starts: an interrupted start is still stopped
            try:
                p.start(run, ports)
                skipped.update(partly)
                continue
            except Exception as e:  # a probe that fails to start must not cost the run
                started.remove(p)
                p.stop(0.5)
                why = f"failed to start: {e}"
        skipped.update(dict.fromkeys(p.name.split(","), why))
    for name, why in skipped.items():
        say(f"probe {name} skipped: {why}")
    run.update_meta(skipped=run.meta().get("skipped", {}) | skipped)


def _watch(probes: list[Probe], rows: list[dict]) -> None:
    for row in rows:
        if row["pid"]:
            for p in probes:
                if row["role"] in p.roles:
                    try:
                        p.watch(row)
                    except BrokenPipeError:  # its helper died: teardown records that, the run goes on
                        pass


def _processes(cluster: Cluster, probes: list[Probe], client: subprocess.Popen | None = None,
               command: list[str] = ()) -> list[dict]:
    """run.json's `processes`: the cluster, daskprobe and its probes' helpers
    (measured like the cluster), and the user's command once it runs."""
    own = {"name": "daskprobe", "role": "probe", "pid": os.getpid(), "listen": None, "contact": None,
           "command": sys.argv}
    helpers = [row for p in probes if (row := p.process_row())]
    return cluster.describe() + [own] + helpers + ([_client_row(client, command)] if client else []) + \
        getattr(client, "followed", [])


def _client_python(command: list[str], depth: int = 0) -> str | None:
    """The command's interpreter, if it is a Python: the command itself, or the one a script's
    shebang names (`#!/usr/bin/env python3` or a path)."""
    exe = shutil.which(command[0])
    if exe and re.fullmatch(r"python[\d.]*", Path(exe).name):
        return exe
    try:  # a FIFO or a device there must not hang or feed a root daskprobe
        fd = os.open(exe or command[0], os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            first = f.readline(256) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return None
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    words = words[1:] if words[:1] and Path(words[0]).name == "env" else words
    return _client_python(words[:1], depth + 1) if words and depth < 2 else None


def _check_client_python(command: list[str], mine: dict, cluster: dict) -> None:
    """Warn when the command's interpreter cannot talk to the cluster: no distributed, or another
    version than the scheduler's (Dask refuses or misbehaves across versions)."""
    if not mine.get("distributed"):
        say(f"warning: {command[0]} has no distributed: your command cannot connect a Client to the cluster")
    elif cluster.get("distributed") and mine["distributed"] != cluster["distributed"]:
        say(f"warning: {command[0]} has distributed {mine['distributed']}, the cluster {cluster['distributed']}: "
            "Dask expects the same version on both sides (--python picks the cluster's interpreter)")


def run(spec: ClusterSpec, command: list[str], run: RunDir, probe_names: list[str], probes: list[Probe],
        signals: Signals, sample_rate: float = rates.SAMPLE_RATE, cpu_hz: int = rates.CPU_HZ, warm_up=None,
        user: User | None = None) -> int:
    """Run the command against a cluster behind the probes; the user's exit code. The cluster and the
    command run as `user` (None: as daskprobe), the probes as daskprobe. `warm_up` runs
    while the cluster's processes start and the probes get ready (the eBPF agent compiles for
    most of a second): what it loads then is not loaded while the run finalizes, nor while the command
    runs."""
    layout = {"workers": spec.workers, "threads": spec.threads, "nanny": spec.nanny,
              "workers_per_process": spec.workers_per_process, "memory_limit": spec.memory_limit(),
              "proxy_delay_us": spec.proxy_delay_us, "protocol": spec.protocol, "scheduler": spec.scheduler,
              "worker": spec.worker, "server_cmd": spec.server_cmd, "scheduler_cpu": spec.scheduler_cpu,
              "python": spec.python,
              "user": user.name if user else None, "uid": user.uid if user else os.geteuid()}
    run.update_meta(partial=True, command=command, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    clock_anchor=clock_anchor(), config=spec.config, probes=probe_names, skipped={},
                    sample_rate=sample_rate, cpu_hz=cpu_hz, cpus=len(os.sched_getaffinity(0)), cluster=layout)
    code, client, started, cluster, hook, local = 1, None, [], None, None, None
    try:  # from here on a signal, at whatever phase, unwinds through the same teardown
        wire = _recorder_said(spec)
        say(f"starting a scheduler, {spec.workers} worker(s){' and the probes' + wire if probes else ''} ...")
        if spec.scheduler_cpu is not None:
            say(f"the scheduler alone on CPU {spec.scheduler_cpu}; the workers and the command on CPU(s) "
                f"{','.join(map(str, sorted(spec.cpus('worker'))))}")
        versions = {"daskprobe": _own_version(), "host": platform.platform()}
        run.update_meta(versions=versions)
        cluster_versions, client_python = ask_versions(spec.python, user, environ=True), _client_python(command)
        client_versions = client_python and ask_versions(client_python, user)
        cluster = Cluster(spec, run, user)
        phases = [("layout", time.perf_counter())]
        cluster.layout()
        _start_probes(probes, run, cluster.ports(), started)  # first: the eBPF agent compiles for a while
        phases.append(("probes", time.perf_counter()))
        signals.check()
        cluster.start()
        phases.append(("cluster started", time.perf_counter()))
        signals.check()
        if warm_up:  # here, not in a thread: a signal inside an import must not leave another thread its lock
            with signals.deferred():
                warm_up()
            phases.append(("warm-up", time.perf_counter()))
        signals.check()
        versions["cluster"] = cluster_versions()
        environ = versions["cluster"].pop("pre_spawn_environ", None)
        run.update_meta(versions=versions, cluster=layout | {"worker_environ": environ})
        for why in dask_versions.warnings(versions["cluster"]):
            say(f"warning: the cluster's {why}")
        if client_versions:
            _check_client_python(command, client_versions(), versions["cluster"])
        phases.append(("versions", time.perf_counter()))
        cluster.ready()
        phases.append(("cluster ready", time.perf_counter()))
        _ready(started, run)
        phases.append(("probes ready", time.perf_counter()))
        signals.check()
        # the probes other than the proxy start while the cluster does: they cover the run from here
        run.update_meta(probes_ready_ns=time.monotonic_ns())
        _watch(started, _processes(cluster, started))
        run.update_meta(processes=_processes(cluster, started), scheduler_address=cluster.client_address())
        # DASKPROBE_WORKER tells a workload its results are placeholders (zero worker).
        env = dict(cluster.env, DASK_SCHEDULER_ADDRESS=cluster.client_address(), DASKPROBE_WORKER=spec.worker)
        local = CommandCaptures(user)  # where the command's local schedulers are recorded (its client hook)
        env |= local.env()
        hook = _client_hook(run, spec, command)
        env = hook.channel.env(env, cluster.client_address())
        signals.check()
        started_ns = time.monotonic_ns()
        cpus = spec.cpus("client")
        client = signals.client = subprocess.Popen(command, env=user.env(env) if user else env,
                                                   preexec_fn=lambda: (our_child(), pin(cpus)),
                                                   pass_fds=hook.channel.pass_fds, **(user.popen() if user else {}))
        hook.channel.started()
        run.update_meta(command_started_ns=started_ns)
        phases.append(("command started", time.perf_counter()))
        run.update_meta(startup_s={b: round(tb - ta, 3) for (_, ta), (b, tb) in zip(phases, phases[1:])})
        _watch(started, [_client_row(client, command)])
        run.update_meta(processes=_processes(cluster, started, client, command))
        code = _wait(client, signals, lambda: (hook.hear(), _follow_children(client, started, run, cluster, command,
                                                                             user, local)), wake=hook.channel)
        record(run, command_ended_ns=time.monotonic_ns())  # a full disk by now must not cost the exit code
    except StartError as e:
        say(f"cluster failed to start: {e}")
    except FileNotFoundError as e:
        say(str(e))
    except Interrupted as e:
        early = " during start-up: the command never ran" if client is None else ""
        say(f"interrupted by {signal.Signals(e.signum).name}{early}; stopping the cluster")
        record(run, interrupted=f"by {signal.Signals(e.signum).name}{early}")
        code = 128 + e.signum
    finally:
        signals.unwinding = False
        stopped_early = _teardown(run, signals, client, cluster, started, command, local)
        if hook:
            hook.ended()
    return _ended(run, signals, code, stopped_early)


def _client_hook(run: RunDir, spec: ClusterSpec | None, command: list[str]):
    """The client hook's pipe and its reports' handlers; `spec`: daskprobe's cluster (None: attached)."""
    from .client_hook import Listener  # here: it imports this module
    return Listener(run, spec, command)


def attach(cluster, command: list[str], duration: float | None, run: RunDir, probe_names: list[str],
           probes: list[Probe], signals: Signals, sampling: rates.Sampling = rates.Sampling(),
           user: User | None = None) -> int:
    """Record a cluster that is already running (an Attached) while a command runs against it (as `user`,
    None: as daskprobe), for `duration` seconds, or until interrupted; the command's exit code (0 without
    one). Nothing of the cluster is started or stopped."""
    address = cluster.client_address()
    run.update_meta(partial=True, command=command, attached=address, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    clock_anchor=clock_anchor(), config={}, probes=probe_names, skipped={},
                    sample_rate=sampling.rate, cpu_hz=sampling.cpu_hz, cpus=len(os.sched_getaffinity(0)),
                    versions={"daskprobe": _own_version(), "host": platform.platform()})
    code, client, started, hook, local = 1, None, [], None, None
    try:
        say(f"attaching to {address} ...")
        cluster.layout()
        threads = {w.get("nthreads") for w in cluster.worker_info}
        run.update_meta(cluster={"attached": address, "workers": len(cluster.workers), "nanny": None,
                                 "threads": threads.pop() if len(threads) == 1 else None, "server_cmd": None})
        if why := cluster.unread:
            say(f"{why}; recording the processes' samples and Dask's own task stream instead (no critical path)")
            run.update_meta(skipped={"messages": why})
        if mine := cluster.unreadable():
            say(f"on this host but not profiled: {'; '.join(mine)} (another user's: run attach as the cluster's "
                "user, or as root); only their messages or Dask's task stream record them")
        if away := cluster.deploy_agents(sampling if "pyspy" in probe_names else None):
            say(away)
        _start_probes(probes, run, cluster.ports(), started)
        cluster.start()
        _ready(started, run)
        run.update_meta(probes_ready_ns=time.monotonic_ns())
        _watch(started, _processes(cluster, started))
        run.update_meta(processes=_processes(cluster, started), scheduler_address=address)
        say(f"recording a scheduler and {len(cluster.workers)} worker(s)"
            + (" while the command runs" if command else f" for {duration:g} s" if duration else "; Ctrl-C ends it"))
        follow = lambda: _follow(cluster, started, run, client, command)  # noqa: E731
        if command:
            hook = _client_hook(run, None, command)
            local = CommandCaptures(user)  # the command's local schedulers, as in run
            env = hook.channel.env(dict(cluster.env, DASK_SCHEDULER_ADDRESS=address) | local.env(), address)
            client = signals.client = subprocess.Popen(command, env=user.env(env) if user else env,
                                                       preexec_fn=our_child, pass_fds=hook.channel.pass_fds,
                                                       **(user.popen() if user else {}))
            hook.channel.started()
            _watch(started, [_client_row(client, command)])
            run.update_meta(processes=_processes(cluster, started, client, command))
            code = _wait(client, signals, lambda: (follow(), hook.hear(), _follow_children(
                client, started, run, cluster, command, user, local)), wake=hook.channel)
        else:
            code = _sleep(duration, signals, follow)
        record(run, command_ended_ns=time.monotonic_ns())
    except (OSError, RuntimeError) as e:
        say(f"cannot attach to {address}: {e}")
    except Interrupted as e:
        code = 0 if not command and e.signum == signal.SIGINT else 128 + e.signum  # Ctrl-C: the way to end
        record(run, command_ended_ns=time.monotonic_ns())
        if duration and not command and (ready := run.meta().get("probes_ready_ns")):
            took = (time.monotonic_ns() - ready) / 1e9
            say(f"interrupted after {took:.1f} s of the {duration:g} s asked for")
            record(run, interrupted_after_s=round(took, 3))
    finally:
        signals.unwinding = False
        stopped_early = _teardown(run, signals, client, cluster, started, command, local)
        if hook:
            hook.ended()
        if said := cluster.collect_agents():
            say(said)
            record(run, processes=_processes(cluster, started, client, command))
            stopped_early = stopped_early or bool(cluster.partial_hosts)
    return _ended(run, signals, code, stopped_early)


def _ended(run: RunDir, signals: Signals, code: int, stopped_early: bool) -> int:
    """The session's end in run.json, once everything has stopped; signals unwind again (finalizing)."""
    record(run, exit_code=code, ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"), partial=signals.hurry or stopped_early)
    signals.unwinding = True
    return code


def _follow(cluster, started: list[Probe], run: RunDir, client, command) -> None:
    """Workers that joined an attached cluster while recording: named, watched and recorded like
    those there at the start (else their messages would be taken for a client's). Those that
    left: said, and listed in run.json's `left`."""
    new, left = cluster.look()
    if new:
        say(f"joined: {', '.join(f'{m.name} ({m.listen})' for m in new)}")
        _watch(started, [row for row in _processes(cluster, started) if row["name"] in {m.name for m in new}])
        run.update_meta(processes=_processes(cluster, started, client, command))
    if left:
        say(f"left the cluster: {', '.join(f'{m.name} ({m.listen})' for m in left)}")
        run.update_meta(left=sorted(cluster.left))


def _sleep(duration: float | None, signals: Signals, every=lambda: None) -> int:
    end = time.monotonic() + duration if duration else float("inf")
    while time.monotonic() < end:
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))
        signals.check()
        every()
    return 0


def _wait(client: subprocess.Popen, signals: Signals, every=lambda: None, wake=None) -> int:
    """The command's exit code; a signal whose Interrupted was lost (see Signals.check) is acted on
    within half a second, even one that came as the command was being started. Waits on a pidfd:
    Popen.wait(timeout) polls, waking 20 times a second for the whole run. `every` is called
    each time round (at least every half second, and at once when `wake`, a Channel, has data)."""
    exited = os.pidfd_open(client.pid)
    try:
        while client.poll() is None:
            select.select([exited] + ([wake] if wake is not None and wake.open else []), [], [], 0.5)
            signals.check()
            every()
        return client.returncode
    finally:
        os.close(exited)


def _teardown(run: RunDir, signals: Signals, client, cluster: Cluster | None, started: list[Probe],
              command, local: CommandCaptures | None = None) -> bool:
    """Stop everything, each step whatever the others did: no orphans, whatever failed.
    True if a probe (or the proxy's capture) stopped before the end: the run is partial."""
    died = {p.name: why for p in started if (why := p.died())}  # before stopping: then all have ended
    recorder = "tap" if cluster and cluster.spec.tap else "comm" if cluster and cluster.spec.comm_tap else "proxy"
    if cluster and (why := ended_early(cluster.recorder)):
        died[recorder] = why
    killed = []
    steps = [("stopping the command", lambda: _reap(client, signals.grace))]
    steps += [("collecting the command's local-scheduler captures", lambda: _collect(run, local))] if local else []
    steps += [(f"probe {p.name}'s last read", lambda p=p: p.last_read(min(LAST_READ_TIMEOUT, signals.grace)))
              for p in started]
    steps += [("stopping the cluster", lambda: killed.extend(cluster.stop(signals.grace)))] if cluster else []
    steps += [(f"stopping probe {p.name}", lambda p=p: p.stop(signals.grace)) for p in started]
    seconds = {}
    for what, step in steps:
        start = time.perf_counter()
        try:
            step()
        except Exception as e:  # one failed stop must not leave the rest running
            say(f"{what} failed: {type(e).__name__}: {e}")
        seconds[what] = round(time.perf_counter() - start, 3)
    record(run, teardown_s=seconds)
    note_killed(run, killed, f"did not stop within {signals.grace:g} s of SIGTERM (a task still running?)")
    errors = died | {p.name: p.error for p in started if getattr(p, "error", None)}
    if cluster and (stopped := _capture_stopped(run, recorder)):
        errors[recorder] = stopped
    if cluster:
        record(run, processes=_processes(cluster, started, client, command))
    record(run, probe_errors=errors)
    for name, error in errors.items():
        full = "No space left" in error or "quota" in error.lower()
        say(f"probe {name} stopped early: {error}" + (f" ({disk_of(run.path)})" if full else ""))
    return bool(errors)


def _follow_children(client: subprocess.Popen, started: list[Probe], run: RunDir, cluster: Cluster, command,
                     user: User | None, local: CommandCaptures) -> None:
    """The command's new descendants of its user's that imported Dask's local scheduler (a processes
    scheduler's pool: its tasks run there; its hook writes a capture file at once), watched by the probes
    as the command is, and named in run.json's processes. Other children are left alone. The capture
    directory is looked at first: a walk of the command's descendants (a file per thread of each)
    every half second was half of daskprobe's CPU while a command ran."""
    uid = user.uid if user else os.geteuid()
    seen = {row["pid"] for row in getattr(client, "followed", [])}
    candidates = local.writers() - seen - {client.pid}
    if not candidates:
        return
    new = [p for p in descendants(client.pid) if p in candidates and runs_as(p, uid) and pool_process(p, client.pid)]
    if not new:
        return
    rows = [{"name": f"client child {p}", "role": "client", "pid": p, "listen": None, "contact": None,
             "command": [str(client.pid)]} for p in new]
    client.followed = getattr(client, "followed", []) + rows
    _watch(started, rows)
    record(run, processes=_processes(cluster, started, client, command))


def _collect(run: RunDir, local: CommandCaptures) -> None:
    for why in local.collect(run / "captures"):
        say(f"local-scheduler capture {why}")


def _recorder_said(spec: ClusterSpec) -> str:
    """Which recorder takes the messages, and why, where it is not the proxy (tls:// says its own)."""
    if spec.tap:
        return " (messages from the wire: the tap; --probes all for the proxy)"
    if spec.comm_tap and spec.protocol == "tcp":
        why = ", as the tap needs root" if not is_root() else ""
        return f" (messages inside Dask's comms: the comm tap{why}; --probes all for the proxy)"
    return ""


def _capture_stopped(run: RunDir, recorder: str) -> str | None:
    """The proxy forwards on (and the tap reads on) when its capture cannot be written: its status
    file says why it stopped capturing (its log too, unless the full disk refused that line)."""
    from ...probes.proxy_capture import read_status  # here: it imports pandas, which starting a run needs not
    status = read_status({"tap": run.tap_capture, "comm": run.comm_capture}.get(recorder, run.proxy_capture))
    if status and status["state"] == "stopped":
        return f"capture stopped at {status['bytes']:,} bytes: {status['reason']}"
    try:
        log = run.log(recorder).read_text(errors="replace")
    except OSError:
        return None
    return next((ln.strip() for ln in log.splitlines() if "capture stopped" in ln), None)


def note_killed(run: RunDir, procs: list[subprocess.Popen], why: str) -> None:
    """Say which of the run's processes had to be killed, and why; add them to run.json's `killed`."""
    if not procs:
        return
    meta = run.meta()
    by_pid = {p["pid"]: p["name"] for p in meta.get("processes", [])}
    names = [by_pid.get(p.pid, f"pid {p.pid}") for p in procs]
    say(f"{', '.join(names)} {why}: killed")
    record(run, killed=meta.get("killed", []) + names)


def _reap(client: subprocess.Popen | None, grace: float) -> None:
    if client is None or client.poll() is not None:
        return
    try:
        client.wait(grace)
    except subprocess.TimeoutExpired:
        client.kill()
        client.wait()


def _client_row(client: subprocess.Popen, command: list[str]) -> dict:
    return {"name": "client", "role": "client", "pid": client.pid,
            "listen": None, "contact": None, "command": command}


def _own_version() -> str:
    from importlib.metadata import version
    return version("daskprobe")


def default_command() -> list[str]:
    """The built-in demo workload, run by this interpreter."""
    return [sys.executable, "-m", variants.DEMO_MODULE]
