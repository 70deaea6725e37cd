"""Scripts that compute with Dask's local schedulers (threads, processes, sync) under `daskprobe run`:
their jobs split as a cluster's are, through the client hook's record of Dask's callbacks and its
pool (analyzers/local.py), and the findings whose premises hold there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from daskprobe.probes.local_scheduler import PREFIX, read_local
from daskprobe.probes.rundir import RunDir
from helpers import drawn, run_flow, write_flow
from test_attach import attach_while, standing  # noqa: F401 (a fixture)

SPIN = """
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a task's BLAS in its own thread only
import dask

def spin(i):
    s = 0
    for k in range(400_000):  # pure Python: holds the GIL
        s += k * k % 7
    return s

if __name__ == "__main__":
    print(sum(dask.compute(*[dask.delayed(spin)(i) for i in range(16)], scheduler="threads", num_workers=4)))
"""

NUMPY = """
import os
os.environ["OPENBLAS_NUM_THREADS"] = "1"
import numpy as np
import dask

def work(i):
    a = np.random.default_rng(i).random(3_000_000)
    for _ in range(3):
        a = np.sort(a)[::-1].copy()  # numpy's sort lets go of the GIL
    return float(a[0])

if __name__ == "__main__":
    print(sum(dask.compute(*[dask.delayed(work)(i) for i in range(16)], scheduler="threads", num_workers=4)))
"""

SYNC_AND_PROCESSES = """
import time

import dask

def inc(x):
    time.sleep(0.01)  # the pool lives a few of the follower's half-second polls (a shorter one may be missed)
    return x + 1

if __name__ == "__main__":
    total = dask.delayed(sum)([dask.delayed(inc)(i) for i in range(200)])
    print(dask.compute(total, scheduler="sync")[0])
    print(dask.compute(total, scheduler="processes", num_workers=2)[0])
"""


def trace_events(run: RunDir) -> dict[str, int]:
    """Track events in the run's trace by name."""
    from collections import Counter

    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    trace = pb.Trace()
    trace.ParseFromString((run / "trace.pftrace").read_bytes())
    names = {e.iid: e.name for p in trace.packet if p.HasField("interned_data") for e in p.interned_data.event_names}
    return Counter(names.get(p.track_event.name_iid, p.track_event.name) for p in trace.packet
                   if p.HasField("track_event"))


def summary_of(run: RunDir) -> dict:
    return json.loads((run / "summary.json").read_text())


def check_split(s: dict) -> None:
    """The split covers the session, as a cluster's does."""
    assert "error" not in s, s.get("error")
    assert sum(s["critical_path_s"].values()) == pytest.approx(s["session_s"], rel=1e-6)
    for j in s["jobs"]:
        assert sum(j["critical_path_s"].values()) == pytest.approx(j["makespan_s"], rel=1e-6)


def test_threads_pure_python_tasks_are_serialised_on_the_gil(tmp_path):
    run, p = run_flow(tmp_path, SPIN)
    s = summary_of(run)
    check_split(s)
    assert s["local_scheduler"]["schedulers"] == ["threads"] and s["local_scheduler"]["pool"] >= 2
    assert s["tasks"] == 16 and "nothing to measure" not in p.stderr
    if s["thread_states"] != "ebpf":
        pytest.skip("no eBPF here: GIL waits are not measured")
    assert s["critical_path_s"]["gil_contention"] > 0.1 * s["session_s"]
    assert [f["id"] for f in s["findings"]][:2].count("local-gil") == 1, s["findings"]
    assert "local scheduler threads" in p.stderr  # the terminal's line
    page = (run / "report.html").read_text()
    assert "serialised on the GIL" in page and "local scheduler threads" in page  # as the terminal said
    body = drawn(tmp_path, run / "report.html")
    plots = (run / "report.html").read_text().count('class="plotly-graph-div"')
    assert "data-errors" not in body and f'data-figures="{plots}"' in body and plots >= 3, body
    trace = trace_events(run)
    assert trace["spin"] == 16, "a compute slice per task, on its thread's track"
    assert any(name.startswith("local scheduler:") for name in trace), "the critical path's track"


def test_threads_numpy_tasks_do_not_fire_the_gil_finding(tmp_path):
    run, _ = run_flow(tmp_path, NUMPY)
    s = summary_of(run)
    check_split(s)
    assert s["local_scheduler"]["schedulers"] == ["threads"]
    assert "local-gil" not in [f["id"] for f in s["findings"]], s["findings"]
    if s["thread_states"] == "ebpf":  # the premise fails as measured, not only as decided
        assert s["critical_path_s"]["gil_contention"] < 0.1 * s["session_s"]


def test_sync_and_processes_jobs(tmp_path):
    run, _ = run_flow(tmp_path, SYNC_AND_PROCESSES)
    s = summary_of(run)
    check_split(s)
    loc = s["local_scheduler"]
    assert sorted(loc["by_job"]) == ["0", "1"]
    assert (loc["by_job"]["0"]["scheduler"], loc["by_job"]["0"]["pool"]) == ("sync", 1)
    assert loc["by_job"]["1"]["scheduler"] == "processes"
    assert [j["tasks"] for j in s["jobs"]] == [201, 201]
    tasks = run.table("local_tasks")
    sync, procs = tasks[tasks.job == 0], tasks[tasks.job == 1]
    assert (sync.exec_tid == sync.tid).all() and (procs.exec_pid != procs.pid).all()
    assert procs.computed_ns.notna().all() and (procs.enter_ns >= procs.sent_ns).all()
    meta = run.meta()
    children = [r["pid"] for r in meta["processes"] if r["name"].startswith("client child")]
    assert set(procs.exec_pid.astype(int)) <= set(children)  # the pool's processes were followed
    if "pyspy" not in meta.get("skipped", {}) and os.geteuid() == 0:  # Yama lets a user's sampler read
        sampled = set(run.table("samples").pid)  # only processes that named it (the command, not its children)
        assert set(procs.exec_pid.astype(int)) & sampled, "no sample of the pool's processes"


def test_the_hook_writes_what_the_reader_reads(tmp_path):
    """The writer inside a real interpreter, the reader here: one definition (LINES) between them. A pool
    of threads runs tasks that depend on one another; every dispatch gets its run and its result."""
    flow = write_flow(tmp_path / "flow.py", """
        import sys
        sys.path.insert(0, sys.argv[1])
        import daskprobe_hook_local_scheduler as hook
        hook.install()
        import dask
        def inc(x):
            return x + 1
        xs = [dask.delayed(inc)(i) for i in range(20)]
        print(dask.compute(dask.delayed(sum)(xs), scheduler="threads")[0])
    """)
    from daskprobe.probes.client_hook import HOOK_DIR
    env = dict(os.environ, DASKPROBE_LOCAL_CAPTURES=str(tmp_path))
    subprocess.run([sys.executable, str(flow), str(HOOK_DIR)], check=True, env=env, timeout=120)
    jobs, tasks = read_local(sorted(tmp_path.glob(f"{PREFIX}*")))
    assert len(jobs) == 1 and jobs.end_ns.notna().all() and len(tasks) == 21
    t = tasks
    assert (t.sent_ns <= t.enter_ns).all() and (t.enter_ns <= t.loaded_ns).all()
    assert (t.loaded_ns <= t.computed_ns).all() and (t.computed_ns <= t.exit_ns).all() and (t.exit_ns <= t.done_ns).all()
    assert (t.exec_tid != t.tid).all() and not t.failed.any()
    assert len(t[t.key.str.startswith("sum")].deps.iloc[0]) == 20


LOCAL_ONLY = """
import dask

def inc(x):
    return x + 1

if __name__ == "__main__":
    print(dask.compute(dask.delayed(sum)([dask.delayed(inc)(i) for i in range(100)]), scheduler="threads")[0])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="attach reads packets: it needs root")
def test_attach_records_a_commands_local_scheduler(tmp_path, standing):
    """attach's command, like run's, gets its local schedulers recorded (before: nothing to measure)."""
    _, info = standing
    out, p = attach_while(tmp_path, info["address"], LOCAL_ONLY)
    assert p.returncode == 0, p.stderr[-3000:]
    s = summary_of(RunDir(out))
    check_split(s)
    assert s["local_scheduler"]["schedulers"] == ["threads"] and s["tasks"] == 101
