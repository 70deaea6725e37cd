"""attach --comm-dir: a tls:// cluster whose processes loaded daskprobe's comm tap gives its messages to an
attached recording (those from its start on), where the packet tap can read none."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers import daskprobe, searchable_dir, write_flow

from daskprobe.probes.rundir import RunDir
from daskprobe.probes.users import cluster_user
from daskprobe.tracer.capture.cluster import COMM_TAP, free_port, tls_env

FLOW = """
from distributed import Client
with Client() as c:
    assert sum(c.gather(c.map(lambda x: x + 1, range(10)))) == 55
"""


def _wait(path: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text(errors="replace") if path.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text(errors="replace")[-3000:]
        time.sleep(0.1)


def _started(cmd, log: Path, ready: str, procs: list, **popen) -> int:
    """The process of cmd(port) once its log says `ready`: its port. A port free when chosen may be taken
    before the process binds it on a busy machine: then another one."""
    for attempt in range(3):
        port = free_port()
        with open(log, "wb") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", *cmd(port)], stdout=out, stderr=subprocess.STDOUT,
                                          **popen))
        try:
            _wait(log, ready, procs[-1])
            return port
        except AssertionError:
            if attempt == 2 or "Address already in use" not in log.read_text(errors="replace"):
                raise
            procs.pop().wait(60)


def test_attach_reads_a_tls_clusters_comm_tap():
    """The cluster runs as the user the command will (not root, as a user's own cluster would), which owns
    the comm tap's directory; root reads it."""
    tmp = searchable_dir("comm-tap-attach")
    user = cluster_user()
    comm, certs = (Path(tempfile.mkdtemp(dir=tmp)) for _ in range(2))
    for d in (comm, certs):
        os.chown(d, user.uid, user.gid)
    env = user.env(dict(os.environ, DASKPROBE_COMM_TAP_DIR=str(comm)) | tls_env(certs, user))
    common = ["--no-dashboard", "--preload", str(COMM_TAP)]
    logs = [tmp / "scheduler.log", tmp / "worker.log"]
    popen = dict(env=env, cwd=tmp, **user.popen())
    procs = []
    try:
        port = _started(lambda port: ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
                                      "--protocol", "tls", *common], logs[0], "Scheduler at", procs, **popen)
        address = f"tls://127.0.0.1:{port}"
        _started(lambda port: ["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                               "--listen-address", f"tls://127.0.0.1:{port}", *common], logs[1], "Registered to",
                 procs, **popen)
        flow = write_flow(tmp / "flow.py", FLOW)
        out = tmp / "run"
        p = daskprobe("attach", address, "--comm-dir", str(comm), "--probes", "proc", "--no-agents", "--no-trace",
                      "--out", str(out), "--", sys.executable, str(flow), env=env)
        assert p.returncode == 0, p.stderr[-4000:]
    finally:
        for proc in reversed(procs):  # the worker first: without its scheduler it would try to reconnect
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert "comm tap" in p.stderr
    m = RunDir(out).table("messages")
    sent = m[(m.src_role == "scheduler") & (m.dst_role == "worker") & (m.op == "compute-task")]
    assert len(sent) == 10
    assert ((m.src_role == "worker") & (m.op == "task-finished")).sum() == 10
    assert ((m.src_role == "client") & (m.op == "update-graph")).sum() >= 1
    # the worker registered before the recording began: that is left out
    assert not (m.op == "register-worker").any()
