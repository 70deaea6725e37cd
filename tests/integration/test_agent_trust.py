"""`daskprobe attach` as root with an agent on another host (a network namespace) whose worker is
hostile: run by nobody, its `client.run` results are a pickle that creates a file and an agent state
whose pid is a string. Ground truth: the owner of that file, and the exit code and run directory of
the recording."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import daskprobe, write_flow
from daskprobe.experiments.netns import other_hosts

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(),
                                reason="network namespaces and a root attach: needs root and setpriv")

DASK = str(Path(sys.executable).with_name("dask"))
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# A worker preload: what its client.run of the agent's `ask` returns, as a hostile worker may.
HOSTILE = """
import json
import daskprobe.probes.agent as agent

real = agent.__dict__.setdefault("real_ask", agent.ask)  # Dask may import a preload twice
PLANT = "{planted}"  # Dask copies a preload into the worker's directory: not beside __file__

class Planted:
    def __reduce__(self):
        return (open, (PLANT, "w"))

def ask(run_id, *words, timeout=30.0):
    if words[0] == "ports":
        return Planted()  # unpickled by whoever holds the recorder's Client
    if words[0] in ("state", "stop"):
        state = json.loads(real(run_id, *words, timeout=timeout))
        for m in state["info"]["members"]:
            m["pid"] = str(m["pid"])
        return json.dumps(state).encode()
    return real(run_id, *words, timeout=timeout)

agent.ask = ask
"""


@pytest.fixture
def other_host():
    """(netns name, our address on the link, its address): a second host joined to this one by a veth."""
    with contextlib.ExitStack() as stack:
        try:
            [(ns, ours, theirs, _)] = stack.enter_context(other_hosts(1, "dpt", 78))
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            pytest.skip(f"no network namespaces here: {getattr(e, 'stderr', '') or e}")
        yield ns, ours, theirs


def test_a_hostile_remote_worker_runs_nothing_as_root_and_costs_the_recording_only_its_host(tmp_path, other_host):
    ns, ours, theirs = other_host
    shared = Path(tempfile.mkdtemp(prefix="daskprobe-agent-trust-"))
    shared.chmod(0o777)
    planted = shared / "pickle-ran"
    preload = write_flow(shared / "hostile.py", HOSTILE.replace("{planted}", str(planted)))
    port = 20_000 + os.getpid() % 10_000
    address = f"tcp://{ours}:{port}"
    env = dict(os.environ, HOME=str(shared), TMPDIR=str(shared))  # the agent's directory too: it keeps it (never read)
    log = open(tmp_path / "cluster.log", "w")
    scheduler = subprocess.Popen([*NOBODY, DASK, "scheduler", "--host", ours, "--port", str(port), "--no-dashboard"],
                                 stdout=log, stderr=log, env=env, cwd=shared)
    worker = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", *NOBODY, DASK, "worker", address, "--host", theirs,
                               "--nthreads", "1", "--no-nanny", "--no-dashboard", "--preload", str(preload)],
                              stdout=log, stderr=log, env=env, cwd=shared)
    try:
        wait = subprocess.run([sys.executable, "-c", f"from distributed import Client\nwith Client('{address}') as c: "
                               "c.wait_for_workers(1, timeout=60)"], capture_output=True, text=True, timeout=120)
        assert wait.returncode == 0, wait.stderr[-2000:] + (tmp_path / "cluster.log").read_text()[-3000:]
        out = tmp_path / "run"
        p = daskprobe("attach", address, "--out", str(out), "--no-trace", "--probes", "pyspy,proc",
                      "--duration", "5", timeout=300)
        assert planted.exists(), "the hostile worker's pickle was never loaded: this test tests nothing"
        assert planted.stat().st_uid == 65534, f"the worker's pickle ran as uid {planted.stat().st_uid}, not the cluster's"
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
        meta = json.loads((out / "run.json").read_text())
        assert meta["partial"] is True and "pid" in meta["probe_errors"][f"agent@{theirs}"], p.stderr[-3000:]
        assert (out / "tables" / "processes.parquet").exists() and (out / "summary.json").exists()
        assert f"a bad reply from {theirs}" in (out / "logs" / "agents.log").read_text()
    finally:
        for proc in (worker, scheduler):
            proc.terminate()
        for proc in (worker, scheduler):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(shared, ignore_errors=True)
