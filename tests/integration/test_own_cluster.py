"""A command that makes its own cluster (LocalCluster, Client(n_workers=...)) runs on daskprobe's, is
recorded, and is told so while it runs (probes/client_hook, tracer/capture/own_cluster.py). The scripts check
from inside what they got: the scheduler's address, no worker processes or threads of their own."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from daskprobe.probes.rundir import RunDir
from helpers import daskprobe, run_flow, searchable_dir, write_flow

OPTS = ("--probes", "proxy", "--no-trace", "--workers", "2", "--threads", "1")

# What the script itself sees of its cluster: the address it talks to, and whether it started
# workers of its own (LocalCluster's processes are the script's children; processes=False ones are
# Worker objects in it).
SEEN = """
import json, multiprocessing, os, sys
from distributed import Worker

def seen(address):
    print("SEEN", json.dumps({"address": address, "ours": os.environ["DASK_SCHEDULER_ADDRESS"],
                              "children": len(multiprocessing.active_children()),
                              "workers_here": len(Worker._instances)}), flush=True)

def inc(x):
    return x + 1
"""


def _seen(p) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in p.stdout.splitlines() if line.startswith("SEEN ")]


def _on_ours(p) -> None:
    seen = _seen(p)
    assert seen, p.stdout
    for s in seen:
        assert s["address"] == s["ours"] and s["children"] == 0 and s["workers_here"] == 0, s


def _tasks(run) -> int:
    summary = json.loads((run / "summary.json").read_text())
    return sum(j["tasks"] for j in summary["jobs"])


def _said(p) -> list[str]:
    """What daskprobe said of the command's own clusters: each its first line and those indented after it."""
    said, following = [], False
    for line in p.stderr.splitlines():
        if line.startswith("daskprobe: your command's"):
            said.append(line)
        elif following and line.startswith("  "):
            said[-1] += "\n" + line
            continue
        following = line.startswith("daskprobe: your command's")
    return said


def test_local_cluster_processes_runs_on_daskprobes_cluster_said_at_once(tmp_path):
    run, p = run_flow(tmp_path, SEEN + """
import time
from distributed import Client, LocalCluster
if __name__ == "__main__":  # a LocalCluster's processes (without daskprobe) import the script again
    cluster = LocalCluster(n_workers=3, threads_per_worker=1, processes=True)
    client = Client(cluster)
    seen(cluster.scheduler_address)
    time.sleep(3)  # daskprobe reads the hook's pipe as it comes: its words come before the next line
    print("AFTER CLUSTER", file=sys.stderr, flush=True)
    assert sum(client.gather(client.map(inc, range(20)))) == 210
    client.close()
    cluster.close()
""", *OPTS)
    _on_ours(p)
    said = _said(p)
    assert len(said) == 1, p.stderr[-3000:]
    line = said[0]
    assert "LocalCluster(n_workers=3, threads_per_worker=1, processes=True) runs on daskprobe's cluster" in line
    assert "2 worker process(es) x 1 thread(s)" in line and "3 worker(s)" in line and "nannies" in line
    assert "to match: daskprobe run --workers 3 --threads 1 --nanny -- " in line
    assert p.stderr.index(line) < p.stderr.index("AFTER CLUSTER"), "said at once, while the command runs"
    assert "(LocalCluster's runs in your script's)\n  it asked for 3 worker(s); its workers under nannies" in line
    # and again after the summary, whose figures are of the cluster it got
    note = "daskprobe: note: the figures above are of the cluster your command got, not of its LocalCluster as asked " \
           "(3 worker(s); its workers under nannies"
    assert p.stderr.index("where the session went") < p.stderr.index(note) < p.stderr.index("run directory:")
    entry, = run.meta()["own_clusters"]
    assert entry["routed"] and entry["shape"]["workers"] == 3 and entry["shape"]["threads"] == 1
    assert entry["shape"]["processes"] is True
    assert _tasks(run) == 20


def test_local_cluster_threads_runs_on_daskprobes_cluster_over_tcp(tmp_path):
    """LocalCluster(processes=False) would talk inproc://, inside the script: it gets daskprobe's cluster,
    said at once, and its messages are recorded as any run's."""
    run, p = run_flow(tmp_path, SEEN + """
from distributed import Client, LocalCluster
cluster = LocalCluster(processes=False)
client = Client(cluster)
seen(client.scheduler.address)
assert sum(client.gather(client.map(inc, range(10)))) == 55
client.close()
cluster.close()
""", *OPTS)
    _on_ours(p)
    line, = _said(p)
    assert "LocalCluster(processes=False) runs on daskprobe's cluster" in line
    assert "threads of your script's process, over inproc://" in line
    entry, = run.meta()["own_clusters"]
    assert entry["shape"]["workers"] == 1 and entry["shape"]["processes"] is False
    assert f"to match: daskprobe run --workers 1 --threads {entry['shape']['threads']} -- " in line
    assert _tasks(run) == 10
    # its messages are tcp:// ones between processes, recorded as any run's (inproc:// never carries them)
    m = run.table("messages")
    assert ((m.op == "compute-task") & (m.src_role == "scheduler") & (m.dst_role == "worker")).sum() == 10
    assert set(m.src_role[m.op == "update-graph"]) == {"client"}


def test_client_with_cluster_keywords_no_longer_fails(tmp_path):
    run, p = run_flow(tmp_path, SEEN + """
from distributed import Client
if __name__ == "__main__":
    client = Client(n_workers=2, threads_per_worker=1)
    seen(client.scheduler.address)
    assert client.cluster is not None
    assert sum(client.gather(client.map(inc, range(12)))) == 78
    client.close()
""", *OPTS)
    _on_ours(p)
    line, = _said(p)
    assert "Client(n_workers=2, threads_per_worker=1) runs on daskprobe's cluster" in line
    assert "to match: daskprobe run --workers 2 --threads 1 --nanny -- " in line
    assert _tasks(run) == 12


def test_closing_the_scripts_cluster_and_clients_leaves_daskprobes_running(tmp_path):
    """with-blocks, close() twice, Client.shutdown(): the script's connections close, daskprobe's cluster
    runs on: a plain Client after them computes, and every computation is recorded."""
    run, p = run_flow(tmp_path, SEEN + """
from distributed import Client, LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        seen(cluster.scheduler_address)
        assert sum(client.gather(client.map(inc, range(5)))) == 15
    cluster.close()
    client.close()
    client = Client(n_workers=1)
    assert client.submit(inc, 100).result() == 101
    client.shutdown()
    with Client() as client:
        seen(client.scheduler.address)
        assert client.submit(inc, 200).result() == 201
        assert len(client.scheduler_info()["workers"]) == 2
    print("DONE")
""", *OPTS)
    _on_ours(p)
    assert "DONE" in p.stdout and len(_said(p)) == 2, p.stderr[-3000:]
    assert [e["via"] for e in run.meta()["own_clusters"]] == ["LocalCluster", "Client"]
    assert _tasks(run) == 7


def test_plain_client_is_untouched(tmp_path):
    run, p = run_flow(tmp_path, SEEN + """
from distributed import Client
with Client() as client:
    seen(client.scheduler.address)
    assert client.cluster is None
    assert sum(client.gather(client.map(inc, range(8)))) == 36
""", *OPTS)
    _on_ours(p)
    assert not _said(p) and "client hook" not in p.stderr and "note: " not in p.stderr, p.stderr[-3000:]
    assert "own_clusters" not in run.meta() and run.meta()["client_hook"]["reports"] == 0
    assert _tasks(run) == 8


def test_a_local_cluster_subclass_or_another_scheduler_runs_as_written_and_is_said(tmp_path):
    """Its own code may need its own processes: not replaced, but the user hears at once that daskprobe's
    cluster records none of it; the same for a Client given another scheduler's address, said once."""
    _, p = run_flow(tmp_path, SEEN + """
from distributed import Client, LocalCluster
class Mine(LocalCluster):
    pass
if __name__ == "__main__":
    with Mine(n_workers=1, threads_per_worker=1, processes=False) as cluster:
        for _ in range(2):
            with Client(cluster.scheduler_address) as client:
                assert client.submit(inc, 1).result() == 2
        print("THEIRS", cluster.scheduler_address, flush=True)
    with Client(os.environ["DASK_SCHEDULER_ADDRESS"].replace("127.0.0.1", "localhost")) as client:
        assert client.submit(inc, 2).result() == 3
""", *OPTS)
    theirs = next(line.split()[1] for line in p.stdout.splitlines() if line.startswith("THEIRS inproc://"))
    assert "daskprobe: your command started its own Mine (not a LocalCluster daskprobe can stand in for): it runs " \
           "beside daskprobe's cluster, which records none of its work" in p.stderr, p.stderr[-3000:]
    assert p.stderr.count(f"daskprobe: your command's Client connects to {theirs}, not daskprobe's cluster: "
                          "nothing of it is recorded") == 1
    assert p.stderr.count("Client connects to") == 1, "daskprobe's own address, by another name, is no other"
    assert "daskprobe: note: your command's Mine is not in the figures above" in p.stderr
    assert f"daskprobe: note: your command's {theirs} is not in the figures above" in p.stderr


STANDING = """
import json, sys
from distributed import LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster:
        print(json.dumps({"address": cluster.scheduler_address}), flush=True)
        sys.stdin.readline()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="attach reads packets: it needs root")
def test_attach_gives_the_commands_own_cluster_the_attached_one(tmp_path):
    standing = subprocess.Popen([sys.executable, str(write_flow(tmp_path / "standing.py", STANDING))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = json.loads(standing.stdout.readline())["address"]
        out = tmp_path / "run"
        p = daskprobe("attach", address, "--out", str(out), "--no-trace", "--", sys.executable,
                      str(write_flow(tmp_path / "flow.py", SEEN + """
from distributed import Client
if __name__ == "__main__":
    with Client(n_workers=4, threads_per_worker=1) as client:
        seen(client.scheduler.address)
        assert client.submit(inc, 1, key="own-1").result() == 2
""")))
    finally:
        standing.kill()
    assert p.returncode == 0, p.stderr[-3000:]
    _on_ours(p)
    line, = _said(p)
    assert "Client(n_workers=4, threads_per_worker=1) runs on the attached cluster instead" in line
    assert "it asked for 4 worker(s) x 1 thread(s) as processes under nannies" in line and "to match" not in line
    assert "own-1" in set(RunDir(out).table("attempts").key)


def test_the_run_options_said_give_the_workers_asked_for(tmp_path):
    """Following the 'to match' options: the command's LocalCluster gets workers as it asked, threads and
    memory limit as its workers report them, and nothing is said to differ."""
    flow = SEEN + """
from distributed import Client, LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=2, memory_limit="1GiB") as cluster, Client(cluster) as c:
        seen(cluster.scheduler_address)
        print("WORKERS", json.dumps(sorted((w["nthreads"], w["memory_limit"])
                                           for w in c.scheduler_info()["workers"].values())), flush=True)
"""
    _, first = run_flow(tmp_path, flow, *OPTS)
    match = _said(first)[0].split("to match: daskprobe run ", 1)[1].split(" -- ")[0]
    assert match == f"--workers 1 --threads 2 --nanny --memory-limit {2**30}"
    again = searchable_dir("again")
    _, p = run_flow(again, flow, "--probes", "proxy", "--no-trace", *match.split())
    _on_ours(p)
    line, = _said(p)
    assert "its workers are as it asked" in line and "to match" not in line and "note: " not in p.stderr
    assert json.loads(p.stdout.split("WORKERS", 1)[1]) == [[2, 2**30]]


# A task's numpy product, and what its worker's environment and threads were: the threads of its process
# that Python never started (the kernel's count against Python's) are a BLAS pool's.
BLAS = """
import os, threading, time
import numpy as np
from distributed import Client

def unseen():
    return len(set(map(int, os.listdir("/proc/self/task"))) - {t.native_id for t in threading.enumerate()})

def blas():
    a = np.ones((300, 300))
    a @ a
    # the fewest of three reads: a thread Python is starting is in /proc a moment before it is in threading's list
    counts = []
    for _ in range(3):
        counts.append(unseen())
        time.sleep(0.05)
    return {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}, min(counts)

with Client() as c:
    print("BLAS", repr(c.submit(blas).result()), flush=True)
"""


def test_workers_without_a_nanny_get_the_environment_a_nanny_gives_one_blas_thread_each(tmp_path):
    # As `dask worker` and LocalCluster have it (distributed.nanny.pre-spawn-environ): else each worker's
    # BLAS runs a thread per CPU beside the task threads, which the user's own cluster would not.
    _, p = run_flow(tmp_path, BLAS, "--probes", "none", "--no-trace")
    env, native = ast.literal_eval(p.stdout.split("BLAS ", 1)[1].splitlines()[0])
    assert env == {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"} and native == 0, (env, native)
