"""trace.pftrace parsed with Perfetto's own protos, checked for what the UI relies on."""

from collections import Counter, defaultdict

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

TE = pb.TrackEvent


def load(path) -> list:
    t = pb.Trace()
    t.ParseFromString(path.read_bytes())
    return list(t.packet)


def check_trace(packets: list) -> dict:
    """Raise AssertionError on anything the Perfetto UI would choke on; return counts."""
    defined, names, stacks, last_ts, threads = set(), set(), defaultdict(list), {}, set()
    interned = defaultdict(set)
    flows_out, flows_in = Counter(), Counter()
    samples = 0
    assert packets[0].sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    for p in packets:
        d = p.interned_data
        names.update(n.iid for n in d.event_names)
        for field in ("function_names", "mapping_paths", "mappings", "frames", "callstacks"):
            interned[field].update(x.iid for x in getattr(d, field))
        assert all(f.function_name_id in interned["function_names"] and f.mapping_id in interned["mappings"]
                   for f in d.frames)
        assert all(set(c.frame_ids) <= interned["frames"] for c in d.callstacks)
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in defined, f"track {d.uuid} defined twice"
            assert not d.parent_uuid or d.parent_uuid in defined, "parent defined before child"
            defined.add(d.uuid)
            if d.HasField("thread"):
                threads.add((d.thread.pid, d.thread.tid))
            continue
        seq = p.trusted_packet_sequence_id
        assert p.timestamp >= last_ts.get(seq, 0), "timestamps non-decreasing per sequence"
        last_ts[seq] = p.timestamp
        if p.HasField("perf_sample"):
            s = p.perf_sample
            assert s.callstack_iid in interned["callstacks"], "callstack interned before use"
            assert (s.pid, s.tid) in threads, "a sample's thread has a track"
            samples += 1
            continue
        e = p.track_event
        assert e.track_uuid in defined, f"track {e.track_uuid} used before it is defined"
        if e.name_iid:
            assert e.name_iid in names, "interned name used before it is defined"
        if e.type == TE.TYPE_SLICE_BEGIN:
            stacks[e.track_uuid].append(p.timestamp)
        elif e.type == TE.TYPE_SLICE_END:
            assert stacks[e.track_uuid], f"end without begin on track {e.track_uuid}"
            assert stacks[e.track_uuid].pop() <= p.timestamp
        flows_out.update(e.flow_ids)
        flows_in.update(e.terminating_flow_ids)
    assert not any(stacks.values()), "every begin has its end"
    assert flows_out == flows_in, "both ends of every flow present"
    assert max(flows_out.values(), default=1) == 1
    return {"tracks": len(defined), "flows": len(flows_out), "samples": samples}


def test_trace_is_valid_for_the_ui(pinned_run):
    run, _, _ = pinned_run
    counts = check_trace(load(run.trace))
    assert counts["flows"] == run.table("messages").msg_id.nunique()


def test_trace_has_the_expected_tracks(pinned_run):
    run, _, n = pinned_run
    packets = load(run.trace)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in packets if p.HasField("track_descriptor")}
    procs = run.table("processes")
    pids = {d.process.pid for d in tracks.values() if d.HasField("process")}
    assert set(procs[procs.role.isin(["scheduler", "worker", "client"])].pid.astype(int)) <= pids
    by_name = Counter(d.name.split(" ")[0] for d in tracks.values())
    assert by_name["compute"] >= 2 and by_name["dispatch"] >= 2 and by_name["tasks"] == 2
    names = {n.iid: n.name for p in packets for n in p.interned_data.event_names}
    compute_tracks = {u for u, d in tracks.items() if d.name.startswith("compute")}
    slices = Counter(names[p.track_event.name_iid] for p in packets
                     if p.track_event.track_uuid in compute_tracks
                     and p.track_event.type == TE.TYPE_SLICE_BEGIN)
    assert slices == {"inc": n, "sum": 1}
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
