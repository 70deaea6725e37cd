"""The comm tap on the backends a script's own in-process cluster may use (inproc://, and ucx:// where
distributed-ucxx is installed), and the benchmark that compares them (experiments/comm_backends.py).
Under `daskprobe run` a script's LocalCluster(processes=False) runs on daskprobe's tcp cluster instead
(test_own_cluster); these load the comm tap into the script's process as a preload of its cluster."""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from daskprobe.experiments import comm_backends
from daskprobe.probes import wire

from helpers import NO_UCX, UCX_PYTHON

# Deterministic graphs: every task is computed once, on any backend (keys named, no stealing).
GRAPHS = ["merge-40", "tree-4"]
TASKS = 41 + 15
# Sent on a timer, or in the shutdown's races, or told again when a replica came: their count follows
# the run's timing (as test_comm_tap). Handshakes are checked apart: one each way per connection.
TIMED = {"heartbeat_worker", "heartbeat-client", "adjust-heartbeat-interval", "key-in-memory", "remove-worker",
         "retire_workers", "terminate", "reply", "value", "handshake", "worker-status-change", "close-stream"}
# A loaded machine makes the scheduler steal work, which adds messages of its own: off, as the runs compare
STEADY = {"DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False"}
# Follow where each task ran, which the scheduler decides anew each run: the data fetched from the other
# worker (get_data, batched as requests overlap), its replicas told and released. Slack: 3 messages or 15%.
PLACED = {"get_data", "add-keys", "release-worker-data", "free-keys"}


def _ops(cap) -> tuple[Counter, Counter]:
    """(direction, op) counts of the decoded messages, and the handshakes per direction."""
    ops, shakes = Counter(), Counter()
    for r in cap.messages.itertuples():
        msg = wire.decode_frame0(cap.frames(r.at)[0])
        if wire.is_handshake(msg):
            shakes[r.direction] += 1
            continue
        for item in msg if isinstance(msg, (list, tuple)) else [msg]:
            op = item.get("op") if isinstance(item, dict) else None
            if op and op not in TIMED:
                ops[(r.direction, op)] += 1
    return ops, shakes


def _run(python: str, protocol: str, work: Path) -> tuple[Counter, Counter, pd.DataFrame]:
    rows, cap = comm_backends.run_backend(python, protocol, GRAPHS, work, STEADY)
    assert [r["graph"] for r in rows] == GRAPHS
    return *_ops(cap), cap.messages


def _same_messages(tcp, other) -> None:
    """The same ops both ways (those that follow the tasks' placement within slack); one handshake each way
    per connection; each message's time a span."""
    (ops_a, shakes_a, _), (ops_b, shakes_b, m) = tcp, other
    exact = {k for k in ops_a.keys() | ops_b.keys() if k[1] not in PLACED}
    assert {k: ops_a[k] for k in exact} == {k: ops_b[k] for k in exact}
    for k in (ops_a.keys() | ops_b.keys()) - exact:
        assert abs(ops_a[k] - ops_b[k]) <= max(3, 0.15 * ops_a[k]), (k, ops_a[k], ops_b[k])
    assert ops_b[(1, "compute-task")] == ops_b[(0, "task-finished")] == TASKS
    assert shakes_a[0] == shakes_a[1] and shakes_b[0] == shakes_b[1] > 0, (shakes_a, shakes_b)
    took = m.t_last_ns - m.t_first_ns
    assert (took >= 0).all() and (took > 0).mean() > 0.5


def test_inproc_messages_match_tcp(tmp_path):
    """A LocalCluster(processes=False) talks inproc:// (objects on queues, never bytes): the comm tap records
    each message as Dask would frame it, and the ops are those of the same cluster on tcp://, exactly but
    for those the run's timing decides (TIMED). Each inproc connection's handshakes are recorded both
    ways (a connecting end may wait on its queue before the listener has numbered the connection)."""
    tcp = _run(sys.executable, "tcp", tmp_path)
    inproc = _run(sys.executable, "inproc", tmp_path)
    _same_messages(tcp, inproc)


@pytest.mark.skipif(not UCX_PYTHON, reason=NO_UCX)
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="UCX listens on every interface: its run needs root for a loopback-only network namespace")
def test_ucx_messages_match_tcp(tmp_path):
    """ucx:// through distributed-ucxx on CPU: the ops recorded by the comm tap are those of the same cluster
    on tcp:// (the same Python, so the same Dask)."""
    tcp = _run(UCX_PYTHON, "tcp", tmp_path)
    ucx = _run(UCX_PYTHON, "ucx", tmp_path)
    _same_messages(tcp, ucx)


def test_benchmark_writes_median_and_spread_in_alternating_order(tmp_path):
    out = tmp_path / "out"
    assert comm_backends.main(["--graphs", "merge-30", "--repeat", "2", "--backends", "tcp,inproc,ucx",
                               "--ucx-python", "", "--out", str(out)]) == 0
    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.backend) == ["tcp", "inproc", "inproc", "tcp"]
    assert (runs.messages > 0).all() and (runs.us_per_message > 0).all() and (runs.cpu_ms_per_task > 0).all()
    table = (out / "table.md").read_text()
    assert "| merge-30 | tcp | 2 |" in table and "| merge-30 | inproc | 2 |" in table
    assert "not run: ucx: no --ucx-python" in table
