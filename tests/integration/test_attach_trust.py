"""`daskprobe attach` as root against a cluster that is not trusted: a scheduler run by an
unprivileged user (nobody) that answers with pickles and lists a local service as a worker. Ground
truth: a file the pickle would create, and the pid of the service it names."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import daskprobe, write_flow
from daskprobe.probes.rundir import RunDir

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(),
                                reason="root attaching to a user's scheduler: needs root and setpriv")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# Dask's framing by hand: every identity reply carries a `__Pickled__` sub-frame whose pickle opens
# (creates) a file, as distributed.protocol.loads would run it; its one worker is whatever listens
# at the port it is given (here a service of root's that is not Dask).
FAKE_SCHEDULER = """
import msgpack, pickle, socket, struct, sys, threading

class Evil:
    def __reduce__(self):
        return (open, (sys.argv[1], "w"))

def frames_of(msg, *extra):
    frames = [msgpack.packb(msg, use_bin_type=True), *extra]
    prelude = struct.pack(f"<Q{len(frames)}Q", len(frames), *map(len, frames))
    return struct.pack("<Q", len(prelude) + sum(map(len, frames))) + prelude + b"".join(frames)

def read(conn):
    def exactly(n):
        buf = b""
        while len(buf) < n:
            got = conn.recv(n - len(buf))
            if not got:
                raise EOFError
            buf += got
        return buf
    exactly(8)
    n = struct.unpack("<Q", exactly(8))[0]
    lengths = struct.unpack(f"<{n}Q", exactly(8 * n))
    frames = [exactly(k) for k in lengths]
    return msgpack.unpackb(frames[0], raw=False, strict_map_key=False)

def serve(conn, me, worker):
    with conn:
        try:
            read(conn)
            conn.sendall(frames_of({"compression": None, "python": (3, 11, 7), "pickle-protocol": 5}))
            while True:
                op = read(conn).get("op")
                if op == "identity":
                    pickled = msgpack.packb({"pickled-obj": pickle.dumps(Evil()), "num-sub-frames": 0})
                    conn.sendall(frames_of({"type": "Scheduler", "id": "fake", "address": me, "services": {},
                                            "workers": {worker: {"type": "Worker", "id": "w", "nthreads": 1,
                                                                 "extra": {"__Pickled__": 1}}},
                                            "note": {"__Pickled__": 1}}, pickled))
                else:
                    conn.sendall(frames_of(None))
        except (EOFError, OSError):
            pass

server = socket.create_server(("127.0.0.1", 0))
me = f"tcp://127.0.0.1:{server.getsockname()[1]}"
print(me, flush=True)
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn, me, sys.argv[2]), daemon=True).start()
"""

SERVICE = """
import socket, time
s = socket.create_server(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)

def private_service_loop():  # a name that must not reach a capture
    while True:
        time.sleep(0.01)

private_service_loop()
"""


@pytest.fixture
def shared():
    """A directory nobody can write in and root can read (pytest's are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="daskprobe-trust-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def attach_to_fake(tmp_path, shared, worker: str, planted: Path):
    """`daskprobe attach` (root) for 4 s to FAKE_SCHEDULER run by nobody: (the run directory, how it went)."""
    fake = subprocess.Popen([*NOBODY, sys.executable, str(write_flow(shared / "fake.py", FAKE_SCHEDULER)),
                             str(planted), worker], stdout=subprocess.PIPE, text=True)
    try:
        address = fake.stdout.readline().strip()
        out = tmp_path / "run"
        return out, daskprobe("attach", address, "--out", str(out), "--no-trace", "--probes", "pyspy,proc",
                              "--duration", "4", timeout=240)
    finally:
        fake.kill()
        fake.wait()


def test_root_attach_runs_no_pickle_a_users_scheduler_sends(tmp_path, shared):
    planted = shared / "pickle-ran"
    out, p = attach_to_fake(tmp_path, shared, "tcp://127.0.0.1:1", planted)  # a worker nobody runs
    assert not planted.exists(), f"the scheduler's pickle ran as uid {planted.stat().st_uid}"
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.returncode == 0, p.stderr[-3000:]  # the pickled fields left unread, the rest used
    procs = RunDir(out).table("processes").set_index("name")
    assert procs.pid["scheduler"] > 0 and procs.listen["worker-0"] == "127.0.0.1:1"
    assert "no process" in json.loads((out / "run.json").read_text())["unverified"]["worker-0"]


def test_root_attach_profiles_no_local_service_a_scheduler_names_as_a_worker(tmp_path, shared):
    service = subprocess.Popen([sys.executable, "-c", SERVICE], stdout=subprocess.PIPE, text=True)  # root's
    try:
        port = int(service.stdout.readline())
        out, p = attach_to_fake(tmp_path, shared, f"tcp://127.0.0.1:{port}", shared / "pickle-ran")
    finally:
        service.kill()
        service.wait()
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    procs = RunDir(out).table("processes").set_index("name")
    samples = RunDir(out).table("samples")
    assert service.pid not in set(samples.pid), "the service was sampled"
    assert procs.pid.isna()["worker-0"] and service.pid not in set(procs.pid.dropna())
    meta = json.loads((out / "run.json").read_text())
    assert "identity" in meta["unverified"]["worker-0"], meta.get("unverified")  # the reason, in run.json
    assert "not profiled: worker-0" in p.stderr
