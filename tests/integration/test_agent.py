"""The per-host agent (probes/agent.py) without a cluster: a process joins it as a Dask plugin's
setup would, and the agent samples it, hands its captures back, answers no other user, reads
nothing outside its directory, and leaves nothing behind. Ground truth: the joiner's pid and the
function it spins in."""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from daskprobe.probes.agent import ask
from daskprobe.probes.base import native_binary
from daskprobe.probes.pyspy import read_samples

pytestmark = pytest.mark.skipif(native_binary("daskprobe-sampler") is None, reason="the sampler is not built")

JOINER = """
import sys, threading
from daskprobe.probes.agent import join
from daskprobe.probes.rates import Sampling
join(sys.argv[1], Sampling(100.0, 49, True), "tcp://10.0.0.9:4321", "worker")  # a rate the user chose
print("joined", flush=True)
done = threading.Event()

def crunch():
    while not done.is_set():
        pass

threading.Thread(target=crunch, daemon=True).start()
sys.stdin.readline()  # until the test has seen enough of it
done.set()
"""

NOBODY = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(b"\\0daskprobe-agent-" + sys.argv[1].encode())
try:
    s.sendall(b"pid\\n")
    s.shutdown(socket.SHUT_WR)
    print(repr(s.recv(100)))
except OSError:  # closed unread: refused too
    print(repr(b""))
"""


def test_agent_samples_its_joiners_and_hands_back_its_captures_only_to_its_user(tmp_path):
    run_id = uuid.uuid4().hex[:12]
    joiner = subprocess.Popen([sys.executable, "-c", JOINER, run_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert joiner.stdout.readline().strip() == "joined"
        agent = int(ask(run_id, "pid"))
        # its probes sample as the user asked the recorder: the rate kept, eBPF's CPU samples at 49 Hz
        probes = subprocess.run(["pgrep", "-a", "-P", str(agent)], capture_output=True, text=True).stdout
        assert any("daskprobe-sampler" in p and "--fixed" in p.split() for p in probes.splitlines()), probes
        assert all("--cpu 49" in p for p in probes.splitlines() if "ebpf_agent" in p), probes
        if os.geteuid() == 0 and Path("/usr/bin/setpriv").exists():
            other = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                    "-c", NOBODY, run_id], capture_output=True, text=True, timeout=30)
            assert other.stdout.strip() == "b''", other.stderr
        deadline = time.monotonic() + 120  # about 1 s at 100 Hz; more where a busy machine gives less CPU
        while len(_spun(ask(run_id, "read", "captures/pyspy.tsv", "0"), joiner.pid, tmp_path)) < 50:
            assert time.monotonic() < deadline, "not 50 samples of the spinning joiner in 120 s"
            time.sleep(0.5)
        state = json.loads(ask(run_id, "stop"))
        files = state["files"]
        assert "captures/pyspy.tsv" in files and files["captures/pyspy.tsv"] > 0, files
        assert ask(run_id, "read", "../../../etc/passwd", "0") == b"", "nothing outside its directory"
        fetched = tmp_path / "pyspy.tsv"
        fetched.write_bytes(ask(run_id, "read", "captures/pyspy.tsv", "0"))
        members = state["info"]["members"]
        assert [(m["pid"], m["name"]) for m in members] == [(joiner.pid, "tcp://10.0.0.9:4321")]
        assert ask(run_id, "done") == b"ok"
    finally:
        joiner.communicate("\n", timeout=30)
    spun = _spun(fetched.read_bytes(), joiner.pid, tmp_path)
    assert len(spun) >= 50, len(spun)  # what was seen before, handed back whole
    deadline = time.monotonic() + 10
    while Path(f"/proc/{agent}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{agent}").exists(), "the agent ended when told"
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"daskprobe-agent-{run_id}-*")), "its directory is gone"


SQUATTER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(b"\\0daskprobe-agent-" + sys.argv[1].encode())
s.listen(1)
print("bound", flush=True)
conn, _ = s.accept()
conn.sendall(b'{"info": {}, "files": {"../../../../tmp/owned": 6}}')
conn.close()
time.sleep(5)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="needs root and setpriv")
def _spun(capture: bytes, pid: int, tmp_path: Path):
    """The samples of the joiner in its crunch loop, in a capture's bytes."""
    (tmp_path / "so-far.tsv").write_bytes(capture)
    samples, stacks, frames = read_samples(tmp_path / "so-far.tsv")
    crunch = set(frames.frame_id[frames.function == "crunch"])
    return samples[(samples.pid == pid) & samples.stack_id.map(
        stacks.set_index("stack_id").frame_ids.map(lambda ids: bool(crunch & set(ids))))]


def test_an_agent_socket_held_by_another_user_is_not_believed():
    run_id = uuid.uuid4().hex[:12]
    squatter = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                 "-c", SQUATTER, run_id], stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "bound"
        with pytest.raises(PermissionError, match="uid 65534"):
            ask(run_id, "stop")
    finally:
        squatter.kill()
        squatter.wait()



RECORDER = """
import sys, time
from distributed import Client
from daskprobe.probes.agent import SchedulerAgent, WorkerAgent
c = Client(sys.argv[1])
for plugin in (WorkerAgent("deadbeef0001", (100.0,), {"127.0.0.1"}, c.id),
               SchedulerAgent("deadbeef0001", (100.0,), {"127.0.0.1"}, c.id)):
    c.register_plugin(plugin)
print("registered", flush=True)
time.sleep(600)
"""


def test_a_recorder_killed_takes_its_plugins_with_it(tmp_path):
    """kill -9 of the recorder: the scheduler drops its client, and the plugins go with it (else every
    worker started later would start an agent for a recording nobody reads)."""
    import signal
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as c:
        recorder = subprocess.Popen([sys.executable, "-c", RECORDER, cluster.scheduler_address],
                                    stdout=subprocess.PIPE, text=True)
        try:
            assert recorder.stdout.readline().strip() == "registered"
            names = lambda: set(c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins)))  # noqa: E731
            assert "daskprobe-deadbeef0001" in names()
            recorder.send_signal(signal.SIGKILL)
            recorder.wait(10)
            deadline = time.monotonic() + 30
            while "daskprobe-deadbeef0001" in names() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "daskprobe-deadbeef0001" not in names()
            workers = c.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins))
            assert "daskprobe-deadbeef0001" not in workers
        finally:
            recorder.kill()
