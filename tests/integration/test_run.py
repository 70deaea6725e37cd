"""A real cluster behind the proxy: what the tables must show."""

import json
import os

import pandas as pd

from daskprobe.analyzers.summary_json import SUMMARY
from daskprobe.probes.json_schema import problems
from daskprobe.probes.run_json import RUN_JSON


def test_message_counts_match_the_workload(pinned_run):
    run, _, n = pinned_run
    m = run.table("messages")
    sched_to_worker = m[(m.src_role == "scheduler") & (m.dst_role == "worker")]
    worker_to_sched = m[(m.src_role == "worker") & (m.dst_role == "scheduler")]
    assert (sched_to_worker.op == "compute-task").sum() == n + 1
    assert (worker_to_sched.op == "task-finished").sum() == n + 1
    # every key reaches the client (Dask may report a key again, e.g. after a replica is added)
    told = m[(m.src_role == "scheduler") & (m.dst_role == "client") & (m.op == "key-in-memory")]
    assert set(told.key) == set(sched_to_worker[sched_to_worker.op == "compute-task"].key)
    assert told.key.nunique() == n + 1
    assert ((m.src_role == "client") & (m.op == "update-graph")).sum() >= 1


def test_worker_to_worker_fetch_is_seen(pinned_run):
    run, _, n = pinned_run
    m = run.table("messages")
    fetch = m[(m.src_role == "worker") & (m.dst_role == "worker") & (m.op == "get_data")]
    assert len(fetch) >= 1
    assert fetch.n_keys.sum() >= 1
    replies = m[m.reply_to.isin(fetch.msg_id)]
    assert len(replies) == len(fetch), "each get_data gets its reply"
    assert (replies.src_role == "worker").all()


def test_attempts_table(pinned_run):
    run, _, n = pinned_run
    t = run.table("attempts")
    assert len(t) == n + 1 and t.key.nunique() == n + 1
    assert (t.outcome == "finished").all()
    assert set(t.worker) == {"worker-0", "worker-1"}
    assert set(t.prefix) == {"inc", "sum"}
    # The timeline of each task is causal on the run's one clock.
    tasks = run.table("tasks")
    assert (tasks.graph_ns <= tasks.compute_sent_ns).all() and (tasks.ready_ns <= tasks.compute_sent_ns).all()
    assert (t.compute_sent_ns <= t.compute_recv_ns).all()
    assert (t.finished_sent_ns <= t.finished_recv_ns).all()
    inside = (t.compute_start_ns >= t.compute_recv_ns) & (t.compute_stop_ns <= t.finished_sent_ns)
    assert inside.mean() >= 0.95, t[~inside]
    summed = t[t.prefix == "sum"].iloc[0]
    assert pd.notna(summed.transfer_start_ns), "the sum fetched inputs from the other worker"


def test_connections_and_processes(pinned_run):
    run, _, _ = pinned_run
    meta = run.meta()
    assert meta["partial"] is False and meta["exit_code"] == 0
    procs = run.table("processes")
    # the default records messages from the wire as root (the tap), inside Dask's comms otherwise (no process)
    assert {"scheduler", "worker", "client"} <= set(procs.role)
    assert "tap" in set(procs.name) if os.geteuid() == 0 else "proxy" not in set(procs.name)
    c = run.table("connections")
    cluster_pids = set(procs.pid.dropna().astype(int))
    # A connection whose peer closed before the proxy's /proc scan reached it (a pooled RPC opened
    # during teardown) cannot be traced to a pid: its socket is gone by then.
    lived = (c.closed_ns.fillna(2**62) - c.opened_ns) > 500_000_000  # null: open until the end
    assert (c.peer_pid[lived] > 0).all(), "every connecting process that stayed was found"
    assert lived.sum() >= 2, "both workers' streams to the scheduler stayed"
    # each worker's stream to the scheduler; their RPC connections (a heartbeat a second) come only
    # if the run lasts long enough, and this one may end within a second
    assert ((c.peer_role == "worker") & (c.upstream_role == "scheduler")).sum() >= 2, "traced to the workers"
    assert c[c.peer_role != "client"].peer_pid.isin(cluster_pids).all()
    pairs = set(zip(c.peer_role, c.upstream_role))
    assert {("client", "scheduler"), ("worker", "scheduler"), ("scheduler", "worker"),
            ("worker", "worker")} <= pairs
    assert (c.malformed == 0).all()


def test_requests_and_replies_are_paired(pinned_run):
    run, _, _ = pinned_run
    m = run.table("messages")
    replies = m[m.op == "reply"]
    assert len(replies) > 0
    req = m.set_index("msg_id").loc[replies.reply_to.astype(int)]
    assert (req.conn.to_numpy() == replies.conn.to_numpy()).all()
    assert (req.direction.to_numpy() != replies.direction.to_numpy()).all()
    assert (req.t_first_ns.to_numpy() <= replies.t_first_ns.to_numpy()).all()


def test_stdout_passes_through_untouched(pinned_run):
    _, p, n = pinned_run
    assert p.stdout == f"result {sum(range(1, n + 1))}\n"
    assert "run directory:" in p.stderr.strip().splitlines()[-1]


def test_parallel_decode_matches_serial(pinned_run, monkeypatch):
    """Large captures are decoded by connection in worker processes: same tables as one loop."""
    from daskprobe.probes.proxy_capture import read_capture
    from daskprobe.tracer.decode import messages, tables
    run, _, _ = pinned_run
    meta = run.meta()
    cap = read_capture(run.messages_capture)
    conns = tables.connections_table(cap, tables.processes_table(meta))
    serial, ev1 = messages.messages_table(cap, conns, jobs=1)
    monkeypatch.setattr(messages, "PARALLEL_FROM", 0)
    parallel, ev2 = messages.messages_table(cap, conns, jobs=3)
    assert conns.conn.nunique() >= 3 and len(serial) > 100
    pd.testing.assert_frame_equal(serial, parallel)
    pd.testing.assert_frame_equal(tables.task_tables(ev1, serial, meta["clock_anchor"]),
                                  tables.task_tables(ev2, parallel, meta["clock_anchor"]))


def test_run_json_and_summary_json_hold_only_defined_keys_of_their_types(pinned_run):
    """A real run's files against their definitions, every key (the writers check the keys they write as
    they go; this checks the whole of what a run leaves)."""
    run, _, _ = pinned_run
    for name, keys in (("run.json", RUN_JSON), ("summary.json", SUMMARY)):
        assert problems(json.loads((run / name).read_text()), keys, name) == []
