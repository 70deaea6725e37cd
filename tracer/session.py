"""One `daskprobe run`: lay out the run directory, start the cluster behind the
probes, run the user's command, tear everything down, then finalize."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time

from ..probes.base import Probe
from .cluster import Cluster, ClusterSpec, StartError, interpreter_versions
from ..probes.procs import die_with_parent
from ..probes.rundir import RunDir
from .registry import experiments

class Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def say(msg: str) -> None:
    # Our own words go to stderr: the command's stdout passes through untouched.
    print(f"daskprobe: {msg}", file=sys.stderr, flush=True)


def clock_anchor() -> dict:
    """One instant on both clocks, to map CLOCK_MONOTONIC ns to wall time."""
    return {"monotonic_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}


class _Signals:
    """SIGINT/SIGTERM: pass them to the user's command, then unwind to teardown."""

    def __init__(self):
        self.client: subprocess.Popen | None = None

    def __enter__(self):
        self.saved = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, h in self.saved.items():
            signal.signal(s, h)

    def _handle(self, signum, frame):
        if self.client and self.client.poll() is None:
            self.client.send_signal(signum)
        raise Interrupted(signum)


def _start_probes(probes: list[Probe], run: RunDir, ports: set[int]) -> list[Probe]:
    """Start what can run here; say why the rest cannot and record it."""
    started, skipped = [], {}
    for p in probes:
        why = p.available()
        if why is None:
            partly = p.partly_skipped()
            try:
                p.start(run, ports)
                started.append(p)
                skipped.update(partly)
                continue
            except Exception as e:  # a probe that fails to start must not cost the run
                why = f"failed to start: {e}"
        skipped.update(dict.fromkeys(p.name.split(","), why))
    for name, why in skipped.items():
        say(f"probe {name} skipped: {why}")
    run.update_meta(skipped=skipped)
    return started


def _watch(probes: list[Probe], rows: list[dict]) -> None:
    for row in rows:
        if row["pid"]:
            for p in probes:
                if row["role"] in p.roles:
                    p.watch(row)


def _processes(cluster: Cluster, probes: list[Probe], client: subprocess.Popen | None = None,
               command: list[str] = ()) -> list[dict]:
    """run.json's `processes`: the cluster, daskprobe and its probes' helpers
    (measured like the cluster), and the user's command once it runs."""
    own = {"name": "daskprobe", "role": "probe", "pid": os.getpid(), "listen": None, "contact": None,
           "command": sys.argv}
    helpers = [row for p in probes if (row := p.process_row())]
    return cluster.describe() + [own] + helpers + ([_client_row(client, command)] if client else [])


def run(spec: ClusterSpec, command: list[str], out: str | None, probe_names: list[str],
        probes: list[Probe], sample_rate: float = 100.0, cpu_hz: int = 99) -> tuple[int, RunDir]:
    run = RunDir.create(out, command)
    run.update_meta(partial=True, command=command, started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    clock_anchor=clock_anchor(), config=spec.config, probes=probe_names, skipped={},
                    sample_rate=sample_rate, cpu_hz=cpu_hz,
                    cluster={"workers": spec.workers, "threads": spec.threads, "nanny": spec.nanny,
                             "proxy_delay_us": spec.proxy_delay_us,
                             "scheduler": spec.scheduler, "worker": spec.worker,
                             "server_cmd": spec.server_cmd, "python": spec.python},
                    versions={"daskprobe": _own_version(), "host": platform.platform(),
                              "cluster": interpreter_versions(spec.python)})
    cluster = Cluster(spec, run)
    code, client, started = 1, None, []
    with _Signals() as signals:
        try:
            cluster.layout()
            started = _start_probes(probes, run, cluster.ports())
            cluster.start()
            _watch(started, _processes(cluster, started))
            run.update_meta(processes=_processes(cluster, started), scheduler_address=cluster.client_address())
            # DASKPROBE_WORKER tells a workload its results are placeholders (zero worker).
            env = dict(cluster.env, DASK_SCHEDULER_ADDRESS=cluster.client_address(), DASKPROBE_WORKER=spec.worker)
            client = signals.client = subprocess.Popen(command, env=env, preexec_fn=die_with_parent)
            _watch(started, [_client_row(client, command)])
            run.update_meta(processes=_processes(cluster, started, client, command))
            code = client.wait()
        except StartError as e:
            say(f"cluster failed to start: {e}")
        except FileNotFoundError as e:
            say(str(e))
        except Interrupted as e:
            say(f"interrupted by {signal.Signals(e.signum).name}; stopping the cluster")
            code = 128 + e.signum
        finally:
            _reap(client)
            cluster.stop()
            for p in started:
                p.stop()
            run.update_meta(processes=_processes(cluster, started, client, command))
    run.update_meta(exit_code=code, ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"), partial=False)
    return code, run


def _reap(client: subprocess.Popen | None, grace: float = 5.0) -> None:
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
    return [sys.executable, "-m", experiments().DEMO_MODULE]
