"""Thread names (analyzers/thread_state.thread_names) and the trace's track names (dashboards/trace_writer.py,
trace_packets.Tracks): unique among siblings, and every thread named by the best that is known of it."""

import io

import pandas as pd
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from daskprobe.analyzers.thread_state import thread_names
from daskprobe.dashboards.trace_packets import Tracks, Writer, emit
from daskprobe.dashboards.trace_writer import _conn_track_name, _message_slices, _TaskFlows, thread_track_names


def _written(w: Writer) -> list:
    """The track descriptors w writes (no events)."""
    emit(w)
    packets = pb.Trace.FromString(w.f.getvalue()).packet
    return [p.track_descriptor for p in packets if p.HasField("track_descriptor")]


def test_a_connection_to_itself_has_four_tracks_named_by_their_end():
    msgs = pd.DataFrame({"msg_id": [0, 1, 2], "conn": [15, 15, 3], "direction": [0, 1, 0],
                         "src": ["worker-1", "worker-1", "worker-0"], "dst": ["worker-1", "worker-1", "scheduler"],
                         "t_first_ns": [10, 20, 30], "t_last_ns": [11, 21, 31], "op": ["get_data", "reply", "x"],
                         "key": [None] * 3, "n_keys": [0] * 3, "msg_bytes": [100] * 3, "batch_size": [1] * 3})
    w = Writer(io.BytesIO())
    tracks = Tracks(w)
    procs = {n: tracks.get(("proc", n), n, pid=i + 1) for i, n in enumerate(["scheduler", "worker-0", "worker-1"])}
    none = pd.Series([], dtype="int64")
    _message_slices(msgs, tracks, procs, _TaskFlows(none, none, none))
    named = {(d.parent_uuid, d.name) for d in _written(w)}
    w1 = procs["worker-1"]
    assert {(w1, "send → worker-1 (conn 15, from its connecting end)"),
            (w1, "send → worker-1 (conn 15, from its listening end)"),
            (w1, "recv ← worker-1 (conn 15, at its listening end)"),
            (w1, "recv ← worker-1 (conn 15, at its connecting end)"),
            (procs["worker-0"], "send → scheduler (conn 3)"),
            (procs["scheduler"], "recv ← worker-0 (conn 3)")} <= named
    assert _conn_track_name("send", 4, 1, "scheduler", "worker-0") == "send → worker-0 (conn 4)"


def test_thread_names_prefer_python_then_a_set_kernel_name_then_the_process():
    # the threads the analysis saw, with Python's names where the sampler read them
    threads = pd.DataFrame([(10, 10, "MainThread"), (10, 11, None), (10, 12, None), (10, 13, "ThreadPoolExecutor-0_1"),
                            (10, 14, None), (10, 15, "ThreadPoolExecutor-0_1"), (10, 16, None), (20, 20, None),
                            (20, 21, None), (20, 22, None), (20, 23, None), (30, 30, None)],
                           columns=["pid", "tid", "name"])
    threads["process"] = threads.pid.map({10: "worker-0", 20: "proxy", 30: "client"})
    comms = pd.DataFrame([(10, 10, "python3.11"), (10, 11, "python3.11"), (10, 12, "jemalloc_bg_thd"),
                          (10, 13, "python3.11"), (10, 14, "python3.11"), (10, 15, "python3.11"),
                          (20, 20, "daskprobe-proxy"), (20, 21, "daskprobe-proxy"), (20, 22, "daskprobe-proxy"),
                          (30, 30, "python3.11")], columns=["pid", "tid", "comm"])
    names = dict(zip(zip(threads.pid, threads.tid), thread_names(threads, comms)))
    assert names == {
        (10, 10): "MainThread", (10, 11): "worker-0 thread 1", (10, 12): "jemalloc_bg_thd",
        (10, 13): "ThreadPoolExecutor-0_1 #1", (10, 14): "worker-0 thread 2", (10, 15): "ThreadPoolExecutor-0_1 #2",
        (10, 16): "worker-0 thread 3",
        (20, 20): "daskprobe-proxy", (20, 21): "proxy thread 1", (20, 22): "proxy thread 2", (20, 23): "proxy thread 3",
        (30, 30): "main"}
    # the trace takes them as they are, and names a thread only it saw by its process and tid
    made = {(10, 13): "worker-0", (30, 31): "client"}
    assert thread_track_names(threads.assign(name=names.values()), made) == {
        (10, 13): "ThreadPoolExecutor-0_1 #1", (30, 31): "client thread 31"}


def test_sibling_tracks_named_alike_are_told_apart_and_thread_tracks_renamed():
    w = Writer(io.BytesIO())
    tracks = Tracks(w)
    p = tracks.get("p", "worker-0", pid=5)
    a, b = tracks.get("a", "x", parent=p), tracks.get("b", "x", parent=p)
    c = tracks.get("c", "x")  # another parent (none): not a sibling of a and b
    t = tracks.get("t", "thread 6", parent=p, thread=(5, 6))
    tracks.rename(t, "Dask-Offload_0")
    tracks.unique()
    got = {d.uuid: d for d in _written(w)}
    assert [got[u].name for u in (a, b, c)] == ["x", "x (2)", "x"]
    assert got[t].name == got[t].thread.thread_name == "Dask-Offload_0"
    assert got[p].process.process_name == "worker-0"
