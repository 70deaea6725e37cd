"""The paper's experiments: graphs that check their own results, the random
scheduler, the zero worker, and `daskprobe bench` (sweep, resume, timeout, figures)."""

import re
import sys
from pathlib import Path

import pandas as pd
from helpers import daskprobe, drawn, run_flow

SMALL_GRAPHS = ["merge-200", "merge_slow-4-0.01", "tree-6", "numpy-400-100", "groupby-1-60s-6h",
                "join-1-60s-6h", "bag-300-4", "xarray-25"]

EVERY_GRAPH_FLOW = """
from distributed import Client
from daskprobe.tracer.bench.workloads import build

with Client() as client:
    for name in {graphs!r}:
        graph = build(name)
        result = client.compute(graph.collection).result()
        assert graph.check(result), (name, result)
        assert not graph.check(result + 1), f"{{name}}: the check accepts a wrong result"
        print("checked", name)
"""

# Each step needs the one before: Dask keeps the chain where its data is.
CHAIN_FLOW = """
from distributed import Client

def inc(x):
    return x + 1

with Client() as client:
    client.wait_for_workers(3)
    x = client.submit(inc, 0, key="step-0")
    for i in range(1, 40):
        x = client.submit(inc, x, key=f"step-{i}")
    assert x.result() == 40
"""


def test_every_graph_checks_its_result(tmp_path):
    run, p = run_flow(tmp_path, EVERY_GRAPH_FLOW.format(graphs=SMALL_GRAPHS), "--probes", "none")
    assert p.stdout.split() == [w for g in SMALL_GRAPHS for w in ("checked", g)]


def _chain_workers(tmp_path, scheduler: str) -> list[str]:
    run, _ = run_flow(tmp_path / scheduler, CHAIN_FLOW, "--workers", "3", "--scheduler", scheduler,
                      "--probes", "proxy")
    tasks = run.table("attempts").set_index("key")
    return [tasks.worker[f"step-{i}"] for i in range(40)]


def test_random_scheduler_scatters_what_ws_keeps_together(tmp_path):
    (tmp_path / "ws").mkdir()
    (tmp_path / "random").mkdir()
    ws = _chain_workers(tmp_path, "ws")
    assert len(set(ws)) == 1, "ws keeps a chain on the worker that holds its input"
    rnd = _chain_workers(tmp_path, "random")
    moves = sum(a != b for a, b in zip(rnd, rnd[1:]))
    # Uniform over 3 workers, a step moves with probability 2/3: 26 of 39 expected.
    assert len(set(rnd)) == 3 and moves >= 15, rnd


def test_zero_worker_keeps_bookkeeping_and_drops_compute(tmp_path):
    # 8 tasks of 3 s each on 2 workers take 12 s when run; the zero worker runs none.
    run, p = run_flow(tmp_path, "import runpy, sys\nsys.argv = ['w', 'merge_slow-8-3']\n"
                      "runpy.run_module('daskprobe.tracer.bench.workloads', run_name='__main__')\n",
                      "--worker", "zero", "--probes", "proxy")
    assert "skipped (zero worker" in p.stdout
    tasks = run.table("attempts")
    assert len(tasks) == 9 and (tasks.compute_stop_ns == tasks.compute_start_ns).all()
    assert run.meta()["cluster"]["worker"] == "zero" and run.meta()["finalize_errors"] == {}
    assert tasks.thread.notna().all()
    ops = run.table("messages").op.value_counts()
    assert ops["compute-task"] == 9 and ops["task-finished"] == 9
    merge = tasks[tasks.prefix == "merge"].iloc[0]
    assert merge.transfer_stop_ns > merge.transfer_start_ns, "inputs on the other worker are still fetched"
    assert ops.get("get_data", 0) >= 1
    assert float(re.search(r'"makespan_s": ([\d.]+)', p.stdout).group(1)) < 6


def test_bench_sweeps_resumes_and_times_out(tmp_path):
    out = tmp_path / "bench"
    sweep = ["bench", "--graphs", "merge-100,tree-5", "--workers", "1,2", "--scheduler", "ws,random",
             "--worker", "zero", "--repeat", "1", "--out", str(out)]
    p = daskprobe(*sweep, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 8 and (df.status == "ok").all(), df[["graph", "status", "error"]]
    assert set(df.tasks) == {101, 31}
    assert (df.aot_s - df.makespan_s / df.tasks).abs().max() < 1e-12
    for run_dir in df.run_dir:
        assert (Path(run_dir) / "run.json").exists()
    speed = pd.read_csv(out / "speedups.csv")
    assert sorted(speed.workers) == [1, 2] and (speed.graphs == 2).all()
    body = drawn(tmp_path, out / "bench.html")
    # speedups, AOT vs tasks, AOT vs workers; strong scaling needs the normal worker
    assert "data-errors" not in body and 'data-figures="3"' in body, body
    page = (out / "bench.html").read_text()
    assert "<h2>Strong scaling</h2>" not in page, "a figure without data is left out"
    assert "Strong scaling (needs normal-worker runs at two or more worker counts" in page, "and says what would draw it"

    again = daskprobe(*sweep, timeout=60)
    assert again.returncode == 0 and "8 of 8 runs already done" in again.stderr
    assert pd.read_csv(out / "results.csv").equals(df)

    slow = daskprobe("bench", "--graphs", "merge_slow-2-60", "--workers", "1", "--repeat", "1",
                     "--timeout", "5", "--out", str(out), timeout=120)
    assert slow.returncode == 1
    row = pd.read_csv(out / "results.csv").iloc[-1]
    assert row.status == "timeout" and len(pd.read_csv(out / "results.csv")) == 9
    assert "merge_slow-2-60" in (Path(row.run_dir) / "run.json").read_text()


def test_compare_by_worker_mode(tmp_path):
    flow = tmp_path / "flow.py"
    flow.write_text("import runpy, sys\nsys.argv = ['w', 'merge-300']\n"
                    "runpy.run_module('daskprobe.tracer.bench.workloads', run_name='__main__')\n")
    runs = []
    for mode in ("normal", "zero"):
        runs.append(str(tmp_path / mode))
        p = daskprobe("run", "--out", runs[-1], "--worker", mode, "--probes", "proxy", "--", sys.executable, str(flow))
        assert p.returncode == 0, p.stderr[-3000:]
    p = daskprobe("compare", *runs, "--by", "worker-mode", "--out", str(tmp_path / "cmp"))
    assert p.returncode == 0, p.stderr
    df = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(df["worker-mode"]) == ["normal", "zero"] and (df.tasks == 301).all()
    assert df.set_index("worker-mode")["critical_path_s.compute"]["zero"] == 0
