"""`daskprobe attach` to a cluster all on this host, joined while recording by a worker on another
host (a network namespace): that host's agent is started then and read back; or left by its only
worker on another host, whose agent is then read no more. Ground truth: the joiner's pid and the
function it spins in; the leaver's CPU as its host's /proc counted it."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import daskprobe, write_flow
from daskprobe.probes.rundir import RunDir
from daskprobe.probes.schema import HOST_PID
from test_agent_trust import other_host  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and attach need root")

DASK = str(Path(sys.executable).with_name("dask"))

JOIN_ELSEWHERE = """
import json, os, subprocess, sys, time
from distributed import Client

def crunch(seconds):  # of its thread's CPU: on a busy machine it lasts longer, and is sampled as often
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

host, connected = sys.argv[1:3]
with Client() as c:  # DASK_SCHEDULER_ADDRESS: the attached cluster's
    open(connected, "w").close()  # the test (root) starts a worker on the other host now
    c.wait_for_workers(2, timeout=120)
    new = next(w for w in c.scheduler_info()["workers"] if host in w)
    def agent_there():
        return "@daskprobe-agent-" in open("/proc/net/unix").read()
    deadline = time.monotonic() + 120  # daskprobe looks every 2 s, then starts its relay and the agent there
    while not c.run(agent_there, workers=[new])[new] and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)  # the worker joins the agent once it is up
    c.submit(crunch, 1.5, key="crunch-elsewhere", workers=[new]).result()
    print(json.dumps({"address": new}), flush=True)
"""


@contextlib.contextmanager
def cluster(tmp_path: Path, ours: str, port: int, workers: list[tuple[list[str], str]], ready: int):
    """A scheduler on this host and workers (a command prefix, such as nsenter's, and the host they
    listen on), up once `ready` of them joined: (its address, its processes, which the caller may add
    to; all are ended at the end)."""
    address = f"tcp://{ours}:{port}"
    log = open(tmp_path / "cluster.log", "w")
    procs = [subprocess.Popen([DASK, "scheduler", "--host", ours, "--port", str(port), "--no-dashboard"],
                              stdout=log, stderr=log)]
    procs += [subprocess.Popen([*cmd, DASK, "worker", address, "--host", host, "--nthreads", "1", "--no-nanny",
                                "--no-dashboard"], stdout=log, stderr=log) for cmd, host in workers]
    try:
        up = subprocess.run([sys.executable, "-c", f"from distributed import Client\nwith Client('{address}') as c: "
                             f"c.wait_for_workers({ready}, timeout=60)"], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr[-2000:] + (tmp_path / "cluster.log").read_text()[-3000:]
        yield address, procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_a_worker_joining_on_a_new_host_is_sampled_by_an_agent_started_then(tmp_path, other_host):  # noqa: F811
    ns, ours, theirs = other_host
    port = 20_000 + (os.getpid() + 7) % 10_000
    with cluster(tmp_path, ours, port, [([], ours)], ready=1) as (address, procs):
        out, connected = tmp_path / "run", tmp_path / "connected"
        # the command runs unprivileged (never as root): entering the other host's namespace is the test's
        attach = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "attach", address, "--out", str(out),
                                   "--no-trace", "--probes", "pyspy,proc", "--", sys.executable,
                                   str(write_flow(tmp_path / "join.py", JOIN_ELSEWHERE)), theirs, str(connected)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not connected.exists() and attach.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        joiner = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", DASK, "worker", address, "--host", theirs,
                                   "--nthreads", "1", "--no-nanny", "--no-dashboard"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(joiner)
        stdout, stderr = attach.communicate(timeout=300)
        p = subprocess.CompletedProcess(attach.args, attach.returncode, stdout, stderr)
        assert p.returncode == 0, p.stderr[-3000:]
        meta = json.loads((out / "run.json").read_text())
        assert theirs in meta.get("hosts", {}), p.stderr[-3000:]
        host = meta["hosts"][theirs]
        assert host["complete"], host
        run = RunDir(out)
        pid = host["number"] * HOST_PID + joiner.pid
        procs_table = run.table("processes").set_index("name")
        assert pid in set(procs_table.pid), procs_table[["pid", "listen", "host"]].to_string()
        samples, stacks, frames = run.table("samples"), run.table("stacks"), run.table("frames")
        spun = set(frames.frame_id[frames.function == "crunch"])
        in_crunch = stacks.stack_id[stacks.frame_ids.map(lambda ids: bool(spun & set(ids)))]
        assert samples[samples.pid == pid].stack_id.isin(in_crunch).sum() >= 50, "1.5 s of CPU at 100 Hz: about 150"


def test_ctrl_c_at_the_terminal_ends_attach_and_its_agents_are_still_read_to_the_end(tmp_path, other_host):  # noqa: F811
    """The terminal sends SIGINT to attach's whole process group: the relay that holds the agents' Client
    must outlive it to read them at the end."""
    ns, ours, theirs = other_host
    port = 20_000 + (os.getpid() + 13) % 10_000
    with cluster(tmp_path, ours, port, [(["nsenter", f"--net=/run/netns/{ns}"], theirs)], ready=1) as (address, _):
        out = tmp_path / "run"
        attach = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "attach", address, "--out", str(out),
                                   "--no-trace", "--probes", "pyspy,proc"], stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)  # a terminal's foreground group of its own
        said = []
        for line in attach.stderr:
            said.append(line)
            if line.startswith("daskprobe: recording"):
                break
        time.sleep(2)
        os.killpg(attach.pid, signal.SIGINT)
        said += attach.stderr.readlines()
        assert attach.wait(120) == 0, "".join(said)[-3000:]
        host = json.loads((out / "run.json").read_text())["hosts"][theirs]
        assert host["complete"], "".join(said)[-3000:]


LEAVE_ELSEWHERE = """
import json, time
from distributed import Client

def crunch(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

host = __import__("sys").argv[1]
with Client() as c:  # DASK_SCHEDULER_ADDRESS: the attached cluster's
    there = next(w for w in c.scheduler_info()["workers"] if host in w)
    def agent_there():
        return "@daskprobe-agent-" in open("/proc/net/unix").read()
    deadline = time.monotonic() + 120  # daskprobe starts the agents there first
    while not c.run(agent_there, workers=[there])[there] and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(12)  # a read of that host's agent or two (every 10 s), its threads asleep meanwhile
    c.submit(crunch, 1.0, key="crunch-elsewhere", workers=[there]).result()
    time.sleep(12)  # read again: its threads asleep since their last switch, their intervals still open
    c.retire_workers([there], close_workers=True)  # that host's last member: its agent is not read again
    time.sleep(15)  # the recording goes on without it
    print(json.dumps({"address": there}), flush=True)
"""


def test_a_hosts_last_worker_leaving_gets_no_cpu_after_its_last_read(tmp_path, other_host):  # noqa: F811
    """Its agent's final `stop` never runs (nothing left to ask it through): the threads asleep at its
    last read must not count as on a CPU from their last switch on. Ground truth: the host's /proc."""
    ns, ours, theirs = other_host
    port = 20_000 + (os.getpid() + 19) % 10_000
    out = tmp_path / "run"
    with cluster(tmp_path, ours, port, [([], ours), (["nsenter", f"--net=/run/netns/{ns}"], theirs)], ready=2) as \
            (address, _), contextlib.ExitStack() as cleanup:
        cleanup.callback(_end_agent_left, out, theirs)
        p = daskprobe("attach", address, "--out", str(out), "--no-trace", "--probes", "pyspy,proc", "--",
                      sys.executable, str(write_flow(tmp_path / "leave.py", LEAVE_ELSEWHERE)), theirs, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        left = json.loads(p.stdout.strip().splitlines()[-1])["address"]
        host = json.loads((out / "run.json").read_text())["hosts"][theirs]
        assert not host["complete"] and not host["skipped"], host  # read as it went, its eBPF probes on
        name = RunDir(out).table("processes").set_index("listen").name[left.split("://")[1]]
        check = json.loads((out / "summary.json").read_text())["cpu_check"][name]
        # the CPU its thread states and samples say against what its host's /proc counted (test_hosts' bound)
        assert check["proc_s"] and 0.8 < check["ratio"] < 1.25, check


def _end_agent_left(out: Path, host: str) -> None:
    """The agent a host's last worker left waits out its lease, then keeps its captures: ended here."""
    if not (out / "run.json").exists():
        return
    kept = json.loads((out / "run.json").read_text()).get("hosts", {}).get(host, {})
    if kept.get("agent_pid"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(kept["agent_pid"], signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{kept['agent_pid']}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if str(kept.get("dir")).startswith("/tmp/daskprobe-agent-"):
            shutil.rmtree(kept["dir"], ignore_errors=True)
