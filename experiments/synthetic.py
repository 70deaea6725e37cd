"""A synthetic run directory of any size, for benchmarking the analysis.

    python -m daskprobe.experiments.synthetic --tasks 1M --workers 8 --out runs/synthetic-1M

Writes run.json and captures/proxy.bin as the proxy would for a two-level
reduction: `tasks` leaves, sums of FAN_IN leaves each, one total. Messages
carry the fields and batching of distributed 2026.8 (compute-task and
free-keys batches to each worker, task-finished batches back, key-in-memory
to the client, heartbeats), on a schedule of PER_TASK_US per task, so that
`daskprobe build` and `report` decode and analyse it exactly like a real run.
Opaque parts (pickled run_spec, graph) are counted in the frame lengths and
not kept, as the proxy does.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import numpy as np

from ..tracer.bench.workloads import count
from ..probes import rates
from ..probes.proxy_capture import CaptureWriter
from ..probes.rundir import RunDir

FAN_IN = 100
PER_TASK_US = 250     # scheduler throughput of about 4,000 tasks/s
BATCH_US = 2_000      # batched streams flush every 2 ms
PID_BASE = 40_000


def schedule(n_leaves: int, workers: int, t0: int) -> dict[str, np.ndarray]:
    """When each task is dispatched, runs and finishes (CLOCK_MONOTONIC ns), and where."""
    n_sums = -(-n_leaves // FAN_IN)
    n = n_leaves + n_sums + 1
    dispatch = t0 + 5_000_000 + np.arange(n, dtype=np.int64) * PER_TASK_US * 1_000
    start = dispatch + 200_000
    stop = start + 50_000
    return {"dispatch": dispatch, "start": start, "stop": stop, "finished": stop + 100_000,
            "worker": np.arange(n) % workers, "n_leaves": np.int64(n_leaves), "n": np.int64(n)}


def key_of(i: int, n_leaves: int, n: int) -> str:
    if i < n_leaves:
        return f"leaf-{i}"
    return "total" if i == n - 1 else f"sum-{i - n_leaves}"


def deps_of(i: int, n_leaves: int, n: int) -> list[int]:
    if i < n_leaves:
        return []
    if i == n - 1:
        return list(range(n_leaves, n - 1))
    first = (i - n_leaves) * FAN_IN
    return list(range(first, min(first + FAN_IN, n_leaves)))


def write_run(out: Path, n_leaves: int, workers: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "captures").mkdir(exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    (out / "tables").mkdir(exist_ok=True)
    anchor = {"monotonic_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}
    wall = (anchor["wall_ns"] - anchor["monotonic_ns"]) / 1e9
    t0 = anchor["monotonic_ns"]
    s = schedule(n_leaves, workers, t0)
    with open(out / "captures" / "proxy.bin", "wb") as f:
        w = CaptureWriter(io.BufferedWriter(f, 1 << 22))
        w.open(1, t0, "scheduler", PID_BASE + 999)
        for k in range(workers):
            w.open(2 + k, t0, "scheduler", PID_BASE + k)
        w.message(1, 0, t0, {"op": "update-graph", "expr_ser": {"__Serialized__": 1},
                             "keys": {"__Set__": True, "as-list": ["total"]}}, opaque=int(s["n"]) // 1000 + 1)
        _stream(w, s, wall)
        end = int(s["finished"][-1]) + 100_000
        w.message(1, 1, end, {"op": "key-in-memory", "key": "total", "type": b"int"})
        w.f.flush()
    meta = _meta(anchor, workers, int(s["n"]))
    RunDir(out).update_meta(**meta)  # checked as a run's run.json is
    return meta


def _stream(w: CaptureWriter, s: dict, wall: float) -> None:
    """Per worker, per 2 ms window: a compute-task batch out and a task-finished batch back."""
    n_leaves, n = int(s["n_leaves"]), int(s["n"])
    windows = (s["dispatch"] - s["dispatch"][0]) // (BATCH_US * 1_000)
    order = np.lexsort((s["worker"], windows))  # tasks are in window order already; this groups workers
    group = windows[order] * len(order) + s["worker"][order]
    bounds = np.flatnonzero(np.diff(group)) + 1
    for mine in np.split(order, bounds):
        conn, win = 2 + int(s["worker"][mine[0]]), int(windows[mine[0]])
        sent = int(s["dispatch"][mine[-1]])
        w.message(conn, 1, sent, [_compute_task(int(i), s, wall, n_leaves, n) for i in mine], opaque=len(mine))
        done = int(s["finished"][mine[-1]])
        w.message(conn, 0, done, [_task_finished(int(i), s, wall, n_leaves, n) for i in mine])
        if win % 500 == 0:  # a heartbeat a second: the clock-offset estimate needs them
            w.message(conn, 0, done + 1_000, {"op": "heartbeat_worker", "now": done / 1e9 + wall,
                                              "metrics": {}, "reply": True})
            w.message(conn, 1, done + 200_000, {"status": "OK", "time": done / 1e9 + wall + 1e-4})


def _compute_task(i: int, s: dict, wall: float, n_leaves: int, n: int) -> dict:
    deps = deps_of(i, n_leaves, n)
    return {"op": "compute-task", "key": key_of(i, n_leaves, n), "run_id": i, "priority": (0, 1, i),
            "stimulus_id": f"compute-task-{s['dispatch'][i] / 1e9 + wall - 1e-4:.7f}",
            "who_has": {key_of(d, n_leaves, n): [f"tcp://127.0.0.1:{10_002 + int(s['worker'][d])}"] for d in deps},
            "nbytes": {key_of(d, n_leaves, n): 28 for d in deps}, "run_spec": {"__Pickled__": 1}}


def _task_finished(i: int, s: dict, wall: float, n_leaves: int, n: int) -> dict:
    start, stop = s["start"][i] / 1e9 + wall, s["stop"][i] / 1e9 + wall
    return {"op": "task-finished", "key": key_of(i, n_leaves, n), "run_id": i, "nbytes": 28, "type": b"int",
            "typename": "int", "metadata": {}, "thread": 140000000 + int(s["worker"][i]),
            "startstops": ({"action": "compute", "start": start, "stop": stop},),
            "stimulus_id": f"task-finished-{stop:.7f}", "status": "OK"}


def _meta(anchor: dict, workers: int, tasks: int) -> dict:
    procs = [{"name": "scheduler", "role": "scheduler", "pid": PID_BASE + 998, "listen": "127.0.0.1:10001",
              "contact": "127.0.0.1:10001", "command": ["synthetic"]},
             {"name": "client", "role": "client", "pid": PID_BASE + 999, "listen": None, "contact": None,
              "command": ["synthetic"]}]
    procs += [{"name": f"worker-{k}", "role": "worker", "pid": PID_BASE + k, "listen": f"127.0.0.1:{10_002 + k}",
               "contact": f"127.0.0.1:{10_002 + k}", "command": ["synthetic"]} for k in range(workers)]
    return {"partial": False, "synthetic": True, "command": ["synthetic", f"{tasks} tasks"], "clock_anchor": anchor,
            "config": {}, "probes": ["proxy"], "skipped": {}, "sample_rate": rates.SAMPLE_RATE, "cpu_hz": rates.CPU_HZ,
            "cluster": {"workers": workers, "threads": 1, "nanny": False, "proxy_delay_us": 0, "scheduler": "ws",
                        "worker": "normal", "server_cmd": None, "python": "synthetic"},
            "versions": {"daskprobe": "synthetic", "cluster": {"python": "3.11.7", "distributed": "2026.8.0"}},
            "processes": procs, "exit_code": 0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="1M", help="leaf tasks (the run has about 1%% more), e.g. 100K, 1M")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    meta = write_run(Path(args.out), count(args.tasks), args.workers)
    print(f"wrote {args.out}: {meta['command'][1]} on {args.workers} workers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
