"""run --workers-per-process: 64 real Dask workers in 2 processes before one scheduler, each its own
connections through the proxy, so each one's messages (its heartbeats too) are recorded as its own."""

from helpers import run_flow

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
