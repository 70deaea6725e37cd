"""run --workers-per-process: 64 real Dask workers in 2 processes before one scheduler, each its own
connections through the proxy, so each one's messages (its heartbeats too) are recorded as its own."""

import json
import os
import sys

import pytest

from helpers import daskprobe, run_flow

FLOW = """
import json, time
from distributed import Client

with Client() as client:
    workers = client.scheduler_info(n_workers=-1)["workers"]
    print(json.dumps({"workers": len(workers), "hosts": len({w["host"] for w in workers.values()})}))
    time.sleep(3)  # at 64 workers Dask asks each for a heartbeat every 2 s
    futures = client.map(lambda x: x + 1, range(200), pure=False)
    client.gather(futures)
"""


def test_64_workers_in_two_processes_each_recorded_as_itself(tmp_path):
    run, p = run_flow(tmp_path, FLOW, "--workers", "64", "--workers-per-process", "32", "--worker", "zero",
                      "--probes", "proxy", "--no-trace")
    assert '"workers": 64' in p.stdout, p.stdout
    meta = run.meta()
    assert meta["cluster"]["workers_per_process"] == 32 and meta["lost"] == {}
    workers = [r for r in meta["processes"] if r["role"] == "worker"]
    assert len(workers) == 64 and len({r["pid"] for r in workers if r["pid"]}) == 2  # sampled once each
    msgs = run.table("messages")
    names = {f"worker-{i}" for i in range(64)}
    assert set(msgs[msgs.src_role == "worker"].src) == names, "each worker's messages are its own"
    beats = msgs[(msgs.op == "heartbeat_worker") & (msgs.dst == "scheduler")]
    assert set(beats.src) == names, "each worker's heartbeats reach the scheduler"
    assert set(msgs[msgs.op == "compute-task"].dst) <= names
    assert (msgs.op == "task-finished").sum() >= 200


PINNED = """
import json, os
from distributed import Client

def cpus(listed):  # "0,2-3" -> [0, 2, 3]
    ends = [part.split("-") for part in listed.split(",")]
    return [c for e in ends for c in range(int(e[0]), int(e[-1]) + 1)]

def allowed(pid):
    # the kernel's word, for every thread the process has by now (its event loop's, its executor's, ...)
    return sorted({tuple(cpus(open(f"/proc/{pid}/task/{t}/status").read().split("Cpus_allowed_list:")[1].split()[0]))
                   for t in os.listdir(f"/proc/{pid}/task")})

with Client() as client:
    client.submit(sum, [1, 2]).result()  # every worker's executor thread started
    scheduler = client.run_on_scheduler(os.getpid)
    workers = sorted(set(client.run(os.getpid).values()))
    print(json.dumps({"scheduler": allowed(scheduler), "workers": [allowed(w) for w in workers],
                      "client": allowed(os.getpid())}))
"""


def test_the_scheduler_alone_on_its_cpu(tmp_path):
    """--scheduler-cpu: the kernel lets every thread of the scheduler run on that CPU alone, and every
    thread of the workers (two in one process, one in another) and of the command on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("one CPU: nothing to keep apart")
    run, p = run_flow(tmp_path, PINNED, "--workers", "3", "--workers-per-process", "2", "--worker", "zero",
                      "--scheduler-cpu", str(cpus[-1]), "--probes", "proc", "--no-trace")
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    others = cpus[:-1]
    assert seen["scheduler"] == [[cpus[-1]]]
    assert seen["workers"] == [[others], [others]] and seen["client"] == [others]
    assert run.meta()["cluster"]["scheduler_cpu"] == cpus[-1]


def test_a_scheduler_cpu_not_ours_is_refused_before_anything_starts(tmp_path):
    p = daskprobe("run", "--scheduler-cpu", "4095", "--out", str(tmp_path / "run"), "--", sys.executable, "-c",
                  "print('ran')", timeout=60)
    assert p.returncode != 0 and "ran" not in p.stdout
    assert "--scheduler-cpu 4095: the CPUs daskprobe may use are" in p.stderr, p.stderr
