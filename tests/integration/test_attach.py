"""`daskprobe attach` against a cluster that ran before it and goes on after it. Ground truth:
the keys the scripts computed, and the pids the cluster's own processes report."""

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pandas as pd
import pytest

from helpers import daskprobe, write_flow
from daskprobe.probes.rundir import RunDir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="attach reads packets: it needs root")

STANDING = """
import json, operator, os, sys
from distributed import Client, LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster, \\
            Client(cluster) as c:
        c.gather(c.map(operator.add, range(100), range(100), key=[f"before-{i}" for i in range(100)]))
        pids = sorted(c.run(os.getpid).values()) + [c.run_on_scheduler(os.getpid)]
        print(json.dumps({"address": cluster.scheduler_address, "pids": pids}), flush=True)
        sys.stdin.readline()  # attached, recorded, detached: it must still work
        print(c.submit(operator.add, 1, 2, key="after-detach").result(), flush=True)
"""

SECOND = """
import operator
from distributed import Client
with Client() as c:  # DASK_SCHEDULER_ADDRESS: the attached cluster's
    fs = c.map(operator.add, range(300), range(300), key=[f"after-{i}" for i in range(300)])
    print(c.submit(sum, fs, key="after-sum").result())
"""


@pytest.fixture
def standing(tmp_path):
    """The STANDING cluster, up and having worked: (its process, what it printed)."""
    proc = subprocess.Popen([sys.executable, str(write_flow(tmp_path / "standing.py", STANDING))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield proc, json.loads(proc.stdout.readline())
    finally:
        proc.kill()


def attach_while(tmp_path, address: str, script: str) -> tuple[Path, subprocess.CompletedProcess]:
    """`daskprobe attach` to the cluster while the script runs against it: (the run directory, how it went)."""
    out = tmp_path / "run"
    return out, daskprobe("attach", address, "--out", str(out), "--no-trace", "--",
                          sys.executable, str(write_flow(tmp_path / "script.py", script)))


def test_attach_records_every_task_after_it_and_leaves_the_cluster_running(tmp_path, standing):
    standing, truth = standing
    out, p = attach_while(tmp_path, truth["address"], SECOND)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == str(sum(2 * i for i in range(300)))
    keys = set(RunDir(out).table("attempts").key)
    assert {f"after-{i}" for i in range(300)} | {"after-sum"} <= keys
    assert not any(k.startswith("before-") for k in keys)
    procs = RunDir(out).table("processes").set_index("name")
    assert sorted(procs.pid[["worker-0", "worker-1"]]) + [procs.pid["scheduler"]] == truth["pids"]
    # its main thread sat in stdin.readline() from before the attach to after it: asleep all along
    # (read every 200 ms as a thread off a CPU: some 10 reads over the script, half asked for a slow
    # machine's sake; a CPU tick never found it)
    pid = truth["pids"][-1]
    cpu, smp = RunDir(out).table("cpu_samples"), RunDir(out).table("samples")
    main = cpu[(cpu.pid == pid) & (cpu.tid == pid) & (cpu.source == "pyspy")]
    ticks = smp[(smp.pid == pid) & (smp.tid == pid) & (smp.source == "pyspy")].tick.fillna(False).sum()
    assert len(main) >= 5 and main.on_cpu.mean() < 0.05 and ticks <= 1, (len(main), main.on_cpu.mean(), ticks)
    standing.stdin.write("go on\n")
    standing.stdin.flush()
    assert standing.stdout.readline().strip() == "3", "the cluster no longer works after the recording"
    assert standing.wait(60) == 0


@pytest.mark.parametrize("banner", [b"", b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n" * 4])  # silent; talks first
def test_attach_to_something_that_is_not_a_scheduler_says_so(tmp_path, banner):
    with socket.create_server(("127.0.0.1", 0)) as s:
        def greet():
            with s.accept()[0] as conn:
                conn.sendall(banner)
                conn.recv(1)
        threading.Thread(target=greet, daemon=True).start()
        p = daskprobe("attach", f"tcp://127.0.0.1:{s.getsockname()[1]}", "--out", str(tmp_path / "run"),
                      "--duration", "1", timeout=120)
    assert p.returncode != 0 and "cannot attach to tcp://127.0.0.1:" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "run").exists(), "nothing was recorded: no run directory"


IN_A_SCRIPT = """
import operator, sys
import daskprobe
from distributed import Client, LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster, \\
            Client(cluster) as c:
        c.gather(c.map(operator.add, range(50), range(50), key=[f"before-{i}" for i in range(50)]))
        with daskprobe.record(c, out=sys.argv[1], trace=False) as path:
            c.gather(c.map(operator.add, range(200), range(200), key=[f"inside-{i}" for i in range(200)]))
        c.gather(c.map(operator.add, range(50), range(50), key=[f"after-{i}" for i in range(50)]))
        print("recorded into", path)
"""


def test_record_in_a_script_records_the_block_only(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, str(write_flow(tmp_path / "script.py", IN_A_SCRIPT)), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and f"recorded into {out}" in p.stdout, p.stderr[-3000:]
    keys = set(RunDir(out).table("attempts").key)
    assert {f"inside-{i}" for i in range(200)} <= keys
    assert not any(k.startswith(("before-", "after-")) for k in keys)
    assert (out / "report.html").exists() and (out / "summary.json").exists()


JOINING = """
import json, operator, os, subprocess, sys, time
from distributed import Client
with Client() as c:  # DASK_SCHEDULER_ADDRESS: the attached cluster's
    before = set(c.scheduler_info()["workers"])
    worker = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "dask"), "worker",
                               os.environ["DASK_SCHEDULER_ADDRESS"], "--no-nanny", "--nthreads", "1",
                               "--host", "127.0.0.1", "--no-dashboard"], stderr=subprocess.DEVNULL)
    c.wait_for_workers(len(before) + 1, timeout=60)
    new = (set(c.scheduler_info()["workers"]) - before).pop()
    c.gather(c.map(operator.add, range(50), range(50), key=[f"joined-{i}" for i in range(50)], workers=[new]))
    time.sleep(3)  # long enough for daskprobe to look for joiners
    c.gather(c.map(operator.add, range(50), range(50), key=[f"later-{i}" for i in range(50)], workers=[new]))
    assert c.run(os.getpid, workers=[new]) == {new: worker.pid}  # the scheduler connects to its port
    print(json.dumps({"address": new, "pid": worker.pid}), flush=True)
    time.sleep(0.5)  # a connection that ends within the tap's first look at it (20-50 ms) keeps no pid
    c.retire_workers([new])
    worker.wait(60)
    time.sleep(3)  # and for it to see that the worker left
"""


def test_a_worker_that_joins_while_recording_is_named_and_recorded_as_one(tmp_path, standing):
    out, p = attach_while(tmp_path, standing[1]["address"], JOINING)
    assert p.returncode == 0, p.stderr[-3000:]
    joined = json.loads(p.stdout.strip().splitlines()[-1])
    assert "joined: worker-2" in p.stderr and "left the cluster: worker-2" in p.stderr
    assert json.loads((out / "run.json").read_text())["left"] == ["worker-2"]
    procs = RunDir(out).table("processes").set_index("name")
    assert procs.pid["worker-2"] == joined["pid"] and procs.listen["worker-2"] == joined["address"].split("://")[1]
    attempts = RunDir(out).table("attempts")
    mine = attempts[attempts.key.str.startswith(("joined-", "later-"))]
    assert len(mine) == 100 and (mine.worker == "worker-2").all(), mine.worker.value_counts()
    assert not (attempts.worker == "client").any()
    conns = RunDir(out).table("connections")  # its own port was watched from when it was found
    assert ((conns.upstream_name == "worker-2") & (conns.peer == "scheduler")).any(), \
        conns[["peer_addr", "peer_pid", "peer", "upstream_name", "opened_ns", "closed_ns"]].to_string()


TLS_CLUSTER = """
import json, os, sys
from distributed import Client, LocalCluster
from distributed.security import Security
if __name__ == "__main__":  # its TLS credentials from Dask's config (the environment)
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", protocol="tls://", dashboard_address=None,
                      security=Security()) as cluster, Client(cluster) as c:
        print(json.dumps({"address": cluster.scheduler_address, "workers": c.run(os.getpid)}), flush=True)
        sys.stdin.readline()
"""

SPINNING = """
import time
from distributed import Client

def spin(i):  # pure Python for 50 ms
    end = time.perf_counter() + 0.05
    while time.perf_counter() < end:
        pass
    return i

with Client() as c:
    print(sum(c.gather(c.map(spin, range(40), key=[f"spin-{i}" for i in range(40)]))))
"""


def computing_in(run: RunDir, compute: pd.DataFrame, function: str) -> tuple[int, float]:
    """The samples of each task's thread while it computed (Dask's task stream: `compute`), and the
    share of them in `function`. A share, not a count: a busy machine holds the sampler back."""
    samples, stacks, frames = run.table("samples"), run.table("stacks"), run.table("frames")
    pids = run.table("processes").set_index("name").pid
    fn = set(frames.frame_id[frames.function == function])
    in_fn = set(stacks.stack_id[stacks.frame_ids.map(lambda ids: bool(fn & set(ids)))])
    computing = pd.concat([samples.stack_id[(samples.pid == pids[t.worker]) & (samples.ident == t.thread)
                                            & samples.t_ns.between(t.start_ns, t.stop_ns)]
                           for t in compute.itertuples()])
    return len(computing), float(computing.isin(in_fn).mean()) if len(computing) else 0.0


def test_attach_to_a_tls_cluster_says_its_messages_cannot_be_read_and_records_its_task_stream(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    if os.geteuid() == 0:  # the command (a client of the cluster) runs as the system user 'daskprobe', never root
        os.chown(key, pwd.getpwnam("daskprobe").pw_uid, -1)
    tls = {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(cert), "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
    for role in ("SCHEDULER", "WORKER", "CLIENT"):
        tls |= {f"DASK_DISTRIBUTED__COMM__TLS__{role}__CERT": str(cert),
                f"DASK_DISTRIBUTED__COMM__TLS__{role}__KEY": str(key)}
    env = dict(os.environ, **tls)
    cluster = subprocess.Popen([sys.executable, str(write_flow(tmp_path / "cluster.py", TLS_CLUSTER))],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        truth = json.loads(cluster.stdout.readline())
        out = tmp_path / "run"
        p = daskprobe("attach", truth["address"], "--out", str(out), "--no-trace", "--", sys.executable,
                      str(write_flow(tmp_path / "spinning.py", SPINNING)), env=env)
    finally:
        cluster.kill()
    assert p.returncode == 0 and p.stdout.strip() == str(sum(range(40))), p.stderr[-3000:]
    assert "tls:// comms are encrypted" in p.stderr.split("recording")[0], "said at the start"
    run = RunDir(out)
    meta = run.meta()
    assert "messages" in meta["skipped"] and not (out / "captures" / "tap.bin").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert "tls://" in summary["error"]
    # Dask's own task stream instead: every task, on the worker that ran it (its pid: ground truth)
    stream = run.table("task_stream")
    compute = stream[stream.action == "compute"].set_index("key")
    ts = summary["task_stream"]
    assert ts["tasks"] == 40 and ts["compute_s"] == pytest.approx((compute.stop_ns - compute.start_ns).sum() / 1e9), ts
    assert {f"spin-{i}" for i in range(40)} <= set(compute.index), sorted(compute.index)[:5]
    procs = run.table("processes").set_index("name")
    by_pid = {pid: addr for addr, pid in truth["workers"].items()}
    for name in ("worker-0", "worker-1"):
        assert f"tls://{procs.listen[name]}" == by_pid[procs.pid[name]]
    assert set(compute.worker[compute.prefix == "spin"]) <= {"worker-0", "worker-1"}
    # each spins 50 ms of the wall clock, more when a busy machine keeps it off a CPU; ms, not s or us
    took = (compute.stop_ns - compute.start_ns)[compute.prefix == "spin"] / 1e6
    command_ms = (meta["command_ended_ns"] - meta["probes_ready_ns"]) / 1e6
    assert took.between(45, command_ms).all(), (took.describe(), command_ms)
    assert compute.start_ns.min() > meta["probes_ready_ns"] - 1e9 and compute.stop_ns.max() < meta["command_ended_ns"]
    # and the processes' samples: a task's thread while it computed, in `spin`, under its own name
    computing, share = computing_in(run, compute, "spin")
    assert computing >= 20 and share >= 0.8, (computing, share)  # about 200: 40 x 50 ms at 100 Hz
    page = (out / "report.html").read_text()
    assert "No critical path" in page and "Task stream (Dask&#x27;s)" in page, "drawn from it in the report"
    assert "gil" in meta["skipped"] or "GIL wait per thread" in page, "and what the samples say, with no message"


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_attach_without_root_records_samples_and_the_task_stream(tmp_path):
    """A user's own cluster, recorded by that user: no tap (it needs root), so no messages; the
    sampler reads the user's processes (same uid, no Yama here) and Dask's task stream the tasks."""
    home = Path(tempfile.mkdtemp(prefix="daskprobe-nobody-"))  # pytest's folders are root's, 0700
    try:
        os.chown(home, 65534, 65534)
        env = dict(os.environ, HOME=str(home))
        can = subprocess.run([*NOBODY, sys.executable, "-c", "import daskprobe.tracer.commands"], capture_output=True, env=env)
        if can.returncode:
            pytest.skip(f"user nobody cannot run this checkout's Python: {can.stderr.decode()[-300:]}")
        cluster = subprocess.Popen([*NOBODY, sys.executable, str(write_flow(home / "cluster.py", STANDING))],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=home)
        try:
            truth = json.loads(cluster.stdout.readline())
            out = home / "run"
            p = subprocess.run([*NOBODY, sys.executable, "-m", "daskprobe.tracer.commands", "attach", truth["address"],
                                "--out", str(out), "--no-trace", "--", sys.executable,
                                str(write_flow(home / "spinning.py", SPINNING))],
                               capture_output=True, text=True, timeout=240, env=env, cwd=home)
        finally:
            cluster.kill()
        assert p.returncode == 0 and p.stdout.strip() == str(sum(range(40))), p.stderr[-3000:]
        assert "not root" in p.stderr.split("recording")[0], "said at the start"
        run = RunDir(out)
        assert run.meta()["skipped"]["messages"].startswith("not root") and not run.tap_capture.exists()
        stream = run.table("task_stream")
        assert {f"spin-{i}" for i in range(40)} <= set(stream.key[stream.action == "compute"])
        procs = run.table("processes").set_index("name")
        assert sorted(procs.pid[["worker-0", "worker-1"]]) + [procs.pid["scheduler"]] == truth["pids"]
        computing, share = computing_in(run, stream[stream.action == "compute"], "spin")
        assert computing >= 20 and share >= 0.8, (computing, share)  # about 200: 40 x 50 ms at 100 Hz
    finally:
        shutil.rmtree(home, ignore_errors=True)


LATE = """
import operator, time
from distributed import Client
time.sleep(5)  # the script's own start: before it connects, no client of the cluster's
with Client() as c:
    print(c.submit(operator.add, 1, 2, key="late").result())
"""


def test_attachs_own_questions_to_the_scheduler_are_not_a_clients(tmp_path, standing):
    """daskprobe asks the scheduler for its workers every 2 s; the session starts at the first byte of
    the user's client, not at daskprobe's first question, and none of it is the client's time."""
    _, truth = standing
    out, p = attach_while(tmp_path, truth["address"], LATE)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["session_s"] < 4 and summary["critical_path_s"]["client"] < 2, \
        (summary["session_s"], summary["critical_path_s"])
    conns = RunDir(out).table("connections")
    assert (conns.peer == "daskprobe").any(), conns[["peer", "peer_role", "peer_pid"]]
