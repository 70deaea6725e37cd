"""Decoding captures into tables: anything a peer can send, and files torn by a kill or
a full disk, become rows with their error or are dropped, never the whole analysis."""

import io
import json
import time

import msgpack
import pandas as pd
import pytest

from daskprobe.probes import ebpf_tables, procfs, pyspy
from daskprobe.probes.proxy_capture import CaptureWriter, read_capture
from daskprobe.probes.rundir import RunDir
from daskprobe.tracer.decode import tables
from daskprobe.tracer.decode.messages import messages_table

T0 = 1_000_000_000
DEEP = b"\x91" * 2000 + b"\x00"  # lists nested 2,000 deep


def make_run(tmp_path, messages) -> RunDir:
    """A run directory whose capture holds `messages`: (conn, direction, ms, msg or raw frame 0 bytes)."""
    run = RunDir(tmp_path / "run")
    for sub in ("captures", "logs", "tables"):
        (run / sub).mkdir(parents=True)
    with open(run.proxy_capture, "wb") as f:
        w = CaptureWriter(io.BufferedWriter(f))
        w.open(1, T0, "scheduler", 9)   # the client's connection
        w.open(2, T0, "scheduler", 11)  # worker-0's stream
        for conn, d, t_ms, msg in messages:
            raw = msg if isinstance(msg, bytes) else None
            w.message(conn, d, T0 + int(t_ms * 1e6), None if raw else msg, frame0=raw)
        w.f.flush()
    wall = time.time_ns() - time.monotonic_ns()
    procs = [{"name": n, "role": r, "pid": p, "listen": None, "contact": None, "command": []}
             for n, r, p in (("scheduler", "scheduler", 10), ("client", "client", 9), ("worker-0", "worker", 11))]
    (run / "run.json").write_text(json.dumps({"processes": procs, "clock_anchor": {"monotonic_ns": 0, "wall_ns": wall}}))
    return run


def decoded(run: RunDir) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The messages and attempts tables.build makes of the run's capture, written through their schemas
    (which accept whatever was decoded), here: build reads the samplers' captures in a child."""
    meta = run.meta()
    cap = read_capture(run.proxy_capture)
    msgs, events = messages_table(cap, tables.connections_table(cap, tables.processes_table(meta)))
    attempts = tables.task_tables(events, msgs, meta["clock_anchor"])
    graphs = tables.graphs_table(events["graphs"], msgs)
    for name, df in (("messages", msgs), ("attempts", attempts), ("graphs", graphs)):
        run.write_table(name, df)
    return msgs, attempts


def finished(key, start, stop, **extra):
    return {"op": "task-finished", "key": key, "run_id": 1, "nbytes": 8, "thread": 1,
            "startstops": ({"action": "compute", "start": start, "stop": stop},), "status": "OK", **extra}


def test_what_a_peer_can_send_is_undecodable_rows_and_the_rest_decodes(tmp_path):
    wall = lambda ms: (time.time_ns() - time.monotonic_ns() + T0) / 1e9 + ms / 1e3
    run = make_run(tmp_path, [
        (1, 0, 0, {"op": "update-graph", "keys": ["x"]}),
        (1, 0, 1, b"\x81\x81\x01\x02\x03"),               # a map as a map key
        (1, 0, 2, DEEP),                                   # nesting past msgpack's limit
        (1, 0, 3, b"\xc1"),                                # a byte msgpack never uses
        (2, 1, 4, {"op": "compute-task", "key": "x", "run_id": 1, "stimulus_id": "compute-task--inf"}),
        (2, 0, 5, finished("x", 2**64 - 1, wall(5))),      # a start no run could have
        (2, 0, 6, {"op": "task-finished", "key": "y", "startstops": 5}),
        (2, 0, 7, {"op": "task-erred", "key": ("a", {"b": 1}), "run_id": "not a number"}),
        (2, 1, 8, {"op": "compute-task", "run_id": 2}),    # no key: dispatches nothing (found by fuzz_decode)
    ])
    m, a = decoded(run)
    bad = m[m.op == "undecodable"]
    assert len(bad) == 3 and bad.error.str.len().gt(0).all(), bad
    assert set(m.op) >= {"update-graph", "compute-task", "task-finished", "task-erred"}
    assert a.set_index("key").outcome["x"] == "finished"
    assert a.compute_start_ns.isna().all(), "the impossible start is unknown, not an overflow"


def test_any_msgpack_value_is_decoded_or_reported(tmp_path):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=8),
                     st.binary(max_size=8))
    value = st.recursive(leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.one_of(st.text(max_size=4), st.sampled_from(["op", "key", "keys", "startstops", "who_has", "run_id"])),
        inner, max_size=4), max_leaves=12)
    msg = st.one_of(value, st.fixed_dictionaries(
        {"op": st.sampled_from(["compute-task", "task-finished", "task-erred", "update-graph", "free-keys",
                                "steal-request", "reschedule", "key-in-memory"]), "key": value}, optional={
            "keys": value, "run_id": value, "startstops": value, "who_has": value, "stimulus_id": value}))

    run = make_run(tmp_path, [])

    @hypothesis.settings(max_examples=40, deadline=None, database=None)  # 1M: experiments/fuzz_decode.py
    @hypothesis.given(st.lists(st.one_of(msg, st.binary(max_size=40)), min_size=1, max_size=8))
    def decodes(items):
        frames = [i if isinstance(i, bytes) else msgpack.packb(i, use_bin_type=True) for i in items]
        with open(run.proxy_capture, "wb") as f:
            w = CaptureWriter(io.BufferedWriter(f))
            w.open(1, T0, "scheduler", 9)
            w.open(2, T0, "scheduler", 11)
            for i, frame in enumerate(frames):
                w.message(1 + i % 2, i % 2, T0 + i, None, frame0=frame)
            w.f.flush()
        msgs, _ = decoded(run)
        assert set(msgs.msg_id) == set(range(len(frames))), "every message became at least one row"
    decodes()


def test_a_torn_last_line_is_dropped_not_the_table(tmp_path):
    proc = tmp_path / procfs.CAPTURE
    proc.write_text("1000\t5\t10\t2\t300\t120000123\n2000\t5\t12\t2\t300\t140000456\n3000\t5\t13\t2\t300\t15")
    assert procfs.read_proc(proc).cpu_s.tolist() == [0.120000123, 0.140000456]
    proc.write_text("1000\t5\t10\t2\t300\n2000\t5\t12\t2\t300\n3000\t5\t13\t2\t")  # before cpu_ns
    assert procfs.read_proc(proc).cpu_s.tolist() == [12 / procfs.CLK_TCK, 14 / procfs.CLK_TCK]
    small = tmp_path / "ebpf_small.tsv"
    small.write_text("gil\t5\t6\t100\t2\noffcpu\t5\t6\t")
    assert ebpf_tables.read_small(small).total_ns.tolist() == [100]
    whole = "F\t0\tspin\t/app/flow.py\t12\nS\t1000\t42\t43\t1\t0\tMainThread\t0\t7\n"
    for torn in ("S\t2000\t42\t43\t1\t0\tMainThread\t0\t", "F\t1\tmain\t/app/flow.py\t"):  # cut after a tab
        sampled = tmp_path / "pyspy.tsv"
        sampled.write_text(whole + torn)
        samples, _, frames = pyspy.read_samples(sampled)
        assert samples.t_ns.tolist() == [1000] and frames.frame_id.tolist() == [0]


def test_a_peer_on_another_host_is_the_one_member_there_else_a_client():
    s = 10**9
    procs = pd.DataFrame({"name": ["scheduler", "worker-0", "worker-1", "worker-2", "worker-3", "worker-4", "worker-5"],
                          # worker-0's pid is its agent's (host 1's pid 7): the agent's host is not this one
                          "pid": pd.array([11, 2**22 + 7, None, None, None, None, None], dtype="Int64"),
                          "host": ["local", "10.0.0.2", "10.0.0.3", "10.0.0.3", "fe80::2", "10.0.0.5", "10.0.0.5"],
                          "listen": ["10.0.0.1:8786", "10.0.0.2:4001", "10.0.0.3:4001", "10.0.0.3:4002", "[fe80::2]:9",
                                     "10.0.0.5:4001", "10.0.0.5:4001"],
                          # worker-4 restarted at its address: seen gone at 102 s, its successor found at 103 s
                          "found_ns": pd.array([None] * 6 + [103 * s], dtype="Int64"),
                          "left_ns": pd.array([None] * 5 + [102 * s, None], dtype="Int64")})
    peers = pd.Series(["10.0.0.2:50001", "10.0.0.3:50002", "10.0.0.9:50003", "[fe80::2]:50004", "10.0.0.1:50005",
                       "10.0.0.5:50006", "10.0.0.5:50007", "10.0.0.5:50008"])
    opened = pd.Series([5 * s] * 5 + [50 * s, 110 * s, 101_500_000_000])
    named = tables._member_elsewhere(peers, opened, procs)
    # one member there: it; two on 10.0.0.3: cannot tell; nobody there, or the scheduler's own host: a client;
    # on a host whose worker restarted, the one there when the connection opened, unless both may have been
    assert named.tolist() == ["worker-0", None, None, "worker-3", None, "worker-4", "worker-5", None]
    # and the listening end: by address and time, the restarted worker's predecessor before it left
    to = pd.Series(["10.0.0.5:4001"] * 3 + ["10.0.0.3:4002", "10.0.0.9:1"])
    listener = tables._listener(to, pd.Series([50 * s, 110 * s, 101_500_000_000, 5 * s, 5 * s]), procs)
    assert listener.tolist() == ["worker-4", "worker-5", None, "worker-2", None]


def test_another_hosts_capture_that_cannot_be_merged_costs_only_itself(tmp_path):
    run = make_run(tmp_path, [(1, 0, 1, {"op": "identity"}), (2, 0, 2, {"op": "heartbeat_worker"})])
    theirs = run / "hosts" / "10.0.0.2" / "captures"
    theirs.mkdir(parents=True)
    (theirs / "tap.bin").write_bytes(run.proxy_capture.read_bytes())
    meta = run.meta() | {"hosts": {"10.0.0.2": {"offset_ns": 0, "uncertainty_ns": 1}}}  # no number: cannot merge
    run.write_file("run.json", json.dumps(meta))
    cap = tables._with_agents(run, tables.processes_table(meta), meta["hosts"])
    assert len(cap.messages) == 2, "this host's messages, all of them"
    assert "KeyError" in run.meta()["both_ends_error"]


def test_an_offcpu_interval_written_open_at_a_read_and_again_later_is_one_interval(tmp_path):
    """An agent writes each interval still open when its captures are read (up to then), and again
    at the next read or when its thread comes back: the longest record stands, once."""
    from daskprobe.probes import ebpf_format
    kind = ebpf_format.KINDS["offcpu"][0]
    events = [ebpf_format.Event(kind=kind, pid=5, tid=6, t0=100, t1=0, t2=200, v1=1),  # open at a read
              ebpf_format.Event(kind=kind, pid=5, tid=7, t0=150, t1=0, t2=180, v1=1),  # another thread's
              ebpf_format.Event(kind=kind, pid=5, tid=6, t0=100, t1=250, t2=300, v1=1),  # it woke and ran
              ebpf_format.Event(kind=kind, pid=5, tid=6, t0=100, t1=0, t2=240, v1=1)]  # a read before, written late
    (tmp_path / "ebpf_events.bin").write_bytes(b"".join(map(ebpf_format.record, events)))
    off = ebpf_tables.read_offcpu(ebpf_tables.read_events(tmp_path / "ebpf_events.bin"))
    assert sorted(zip(off.tid, off.out_ns, off.in_ns, off.blocked_ns)) == [(6, 100, 300, 150), (7, 150, 180, 0)]
