"""trace.pftrace parsed with Perfetto's own protos, checked for what the UI relies on."""

import json
import re
from collections import Counter

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from helpers import check_trace, load

TE = pb.TrackEvent


def test_trace_is_valid_for_the_ui(pinned_run):
    run, _, _ = pinned_run
    counts = check_trace(load(run.trace))
    done = run.table("attempts").dropna(subset=["compute_start_ns", "finished_sent_ns"])
    # a flow per message, and one per task from its compute-task through its compute to its task-finished
    assert counts["chained_flows"] == len(done) > 0
    assert counts["flows"] == run.table("messages").msg_id.nunique() + len(done)


def test_trace_has_the_expected_tracks(pinned_run):
    run, proc, n = pinned_run
    packets = load(run.trace)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in packets if p.HasField("track_descriptor")}
    procs = run.table("processes")
    pids = {d.process.pid for d in tracks.values() if d.HasField("process")}
    assert set(procs[procs.role.isin(["scheduler", "worker", "client"])].pid.astype(int)) <= pids
    by_name = Counter(d.name.split(" ")[0] for d in tracks.values())
    assert by_name["dispatch"] >= 2 and by_name["tasks"] == 2
    names = {n.iid: n.name for p in packets for n in p.interned_data.event_names}
    # compute slices sit on the tracks of the threads that ran them, by the tids the tasks themselves
    # recorded (the UI puts a thread's CPU samples on the track of its tid)
    workers = set(procs[procs.role == "worker"].pid.astype(int))
    worker_threads = {u: (d.thread.pid, d.thread.tid) for u, d in tracks.items()
                      if d.HasField("thread") and d.thread.pid in workers}
    begins = [p.track_event for p in packets if p.track_event.type == TE.TYPE_SLICE_BEGIN]
    slices = Counter(names[e.name_iid] for e in begins if e.track_uuid in worker_threads)
    assert slices == {"inc": n, "sum": 1}
    ran = {worker_threads[e.track_uuid] for e in begins if e.track_uuid in worker_threads and names[e.name_iid] == "inc"}
    own = json.loads(proc.stderr.split("RAN_ON", 1)[1].splitlines()[0])
    assert ran == {(pid, tid) for pid, tid in own}
    counters = [p for p in packets if p.track_event.type == TE.TYPE_COUNTER]
    assert counters and all(p.track_event.double_counter_value >= 0 for p in counters)


def test_validator_catches_broken_traces(pinned_run):
    run, _, _ = pinned_run
    packets = load(run.trace)
    first_end = next(i for i, p in enumerate(packets) if p.track_event.type == TE.TYPE_SLICE_END)
    broken = packets[:first_end] + packets[first_end + 1:]
    try:
        check_trace(broken)
    except AssertionError:
        return
    raise AssertionError("a trace missing a slice end passed the checks")


def track_name_problems(packets: list, py_names: dict, comms: dict) -> list[str]:
    """What makes the trace's track names hard to read: two sibling tracks (same parent, or both at the
    top) named alike, a thread track without a name, or named only by its tid ("thread 1234") or by
    its interpreter's default ("python3.11") while the thread has a Python or kernel name.
    py_names and comms: (pid, tid) -> the thread's Python name (the sampler's) and kernel name."""
    tracks = [p.track_descriptor for p in packets if p.HasField("track_descriptor")]
    name = {d.uuid: (d.thread.thread_name or d.name) if d.HasField("thread") else
            (d.process.process_name or d.name) if d.HasField("process") else d.name for d in tracks}
    problems = [f"{n} sibling tracks named {k[1]!r} (parent {k[0]})"
                for k, n in Counter((d.parent_uuid, name[d.uuid]) for d in tracks).items() if n > 1]
    for d in tracks:
        if not d.HasField("thread"):
            continue
        thread, got = (d.thread.pid, d.thread.tid), name[d.uuid]
        if not got.strip():
            problems.append(f"thread track {thread} has no name")
        elif re.fullmatch(r"thread \d+", got):
            problems.append(f"thread track {thread} named only by its tid ({got!r}; Python name "
                            f"{py_names.get(thread)!r}, kernel name {comms.get(thread)!r})")
        elif GENERIC_COMM.fullmatch(got):
            problems.append(f"thread track {thread} named by its interpreter's default, {got!r}")
    return problems


GENERIC_COMM = re.compile(r"python[0-9.]*")


def _known_names(run) -> tuple[dict, dict]:
    s = run.table("samples", columns=["pid", "tid", "thread_name"]).dropna(subset=["thread_name"])
    s = s[s.thread_name != ""].drop_duplicates(["pid", "tid"], keep="last")
    comms = run.table("thread_names", missing_ok=True)
    return (dict(zip(zip(s.pid, s.tid), s.thread_name)), dict(zip(zip(comms.pid, comms.tid), comms.comm)))


def test_track_names_are_unique_and_name_every_thread(pinned_run):
    run, _, _ = pinned_run
    packets = load(run.trace)
    py_names, comms = _known_names(run)
    assert py_names and comms  # the samples name Python threads; the kernel names every thread it listed
    assert track_name_problems(packets, py_names, comms) == []
    threads = [p.track_descriptor for p in packets if p.track_descriptor.HasField("thread")]
    # a Python thread is named by Python (each worker's MainThread at least)
    workers = run.table("processes").query("role == 'worker'").pid.astype(int)
    for pid in workers:
        assert any(d.thread.pid == pid and d.thread.thread_name.startswith("MainThread") for d in threads), pid
