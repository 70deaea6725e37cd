"""The trace's hand-written protobuf bytes read back with Perfetto's own protos."""

import io

import numpy as np
import pandas as pd
from google.protobuf.internal.encoder import _VarintBytes
from hypothesis import given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from daskprobe.dashboards import proto_wire as W
from daskprobe.dashboards.trace_packets import BEGIN, COUNTER, END, Writer, emit, encode
from daskprobe.dashboards.trace_writer import _no_overlap, _slices


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20))
def test_varints_in_bulk_are_the_varints_one_by_one(values):
    m, length = W.varints(np.array(values, dtype=np.uint64))
    assert [bytes(m[i, :length[i]]) for i in range(len(values))] == [W.varint(v) for v in values] \
        == [_VarintBytes(v) for v in values]  # protobuf's own encoder


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(1, 2**40), st.floats(allow_nan=False)), min_size=1,
                max_size=20))
def test_counter_packets_in_bulk_parse_as_the_counters_they_encode(events):
    counters = pd.DataFrame(events, columns=["ts", "track", "value"])
    f = io.BytesIO()
    emit(Writer(f), encode(_slices([], [], [], []).assign(name=0), counters, SAMPLES.iloc[:0], {}))
    packets = pb.Trace.FromString(f.getvalue()).packet
    got = sorted((p.timestamp, p.track_event.type, p.track_event.track_uuid, p.trusted_packet_sequence_id,
                  p.track_event.double_counter_value) for p in packets)
    assert got == sorted((ts, COUNTER, track, 1, value) for ts, track, value in events)


SAMPLES = pd.DataFrame({"ts": [30, 40], "pid": [100, 100], "tid": [101, 101], "stack_id": [5, 6]})


def test_the_writers_packets_parse_with_their_interned_data_flows_and_arguments():
    f = io.BytesIO()
    w = Writer(f)
    w.descriptor(pb.TrackDescriptor(uuid=1, name="t"))
    slices = pd.concat([
        _slices([1], [10], [15], ["inc"], flow_out=pd.Series([2**63 + 5], index=[0]), flow_in=[7],
                args={"key": ["inc-1"], "nbytes": [-1]}),
        _slices([1], [20], [25], ["inc"], args={"nbytes": [2**40]})], ignore_index=True)
    counters = pd.DataFrame({"ts": [15], "track": [1], "value": [3.5]})
    frames = pd.DataFrame({"label": ["main", "f", "g"], "path": ["a.py", "a.py", "b.py"]})
    stacks = w.stacks(pd.Series({5: [0, 1], 7: [], 6: [0, 2]}), frames)  # sharing their root frame; one empty
    emit(w, encode(_no_overlap(slices.assign(name=w.names(slices.name))), counters, SAMPLES, stacks))
    p = pb.Trace.FromString(f.getvalue()).packet
    assert p[0].sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED and p[0].track_descriptor.name == "t"
    interned = p[0].interned_data  # everything, once, before any event uses it
    assert [(n.iid, n.name) for n in interned.event_names] == [(1, "inc")]
    assert [s.str for s in interned.function_names] == [b"main", b"f", b"g"] and len(interned.frames) == 3
    assert [list(c.frame_ids) for c in interned.callstacks] == [[1, 2], [], [1, 3]]
    kinds = [(q.timestamp, q.track_event.type if q.HasField("track_event") else "sample") for q in p[1:]]
    assert kinds == [(10, BEGIN), (15, END), (15, COUNTER), (20, BEGIN), (25, END), (30, "sample"), (40, "sample")]
    e = p[1].track_event
    assert p[1].sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE and e.name_iid == 1
    assert list(e.flow_ids) == [2**63 + 5] and list(e.terminating_flow_ids) == [7]
    assert {a.name: a.string_value or a.int_value for a in e.debug_annotations} == {"key": "inc-1", "nbytes": -1}
    assert p[4].track_event.name_iid == 1 and p[4].track_event.debug_annotations[0].int_value == 2**40
    assert [(q.perf_sample.pid, q.perf_sample.tid, q.perf_sample.callstack_iid) for q in p[6:]] == \
        [(100, 101, 1), (100, 101, 3)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 50), st.integers(0, 50)), max_size=30))
def test_slices_made_sequential_in_bulk_as_one_by_one(rows):
    s = pd.DataFrame(rows, columns=["track", "start", "end"]).astype("int64")
    got = _no_overlap(s.assign(name="x", extra=b""))
    ref = s.sort_values(["track", "start", "end"], kind="stable").reset_index(drop=True)
    start, end = ref.start.tolist(), ref.end.tolist()
    for i in range(len(ref)):  # each start clipped to the previous end on its track; 1 ns at least
        if i and ref.track[i] == ref.track[i - 1]:
            start[i] = max(start[i], end[i - 1])
        end[i] = max(end[i], start[i] + 1)
    assert got.start.tolist() == start and got.end.tolist() == end


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=3 * W.PAD_MAX)), min_size=1, max_size=20),
       st.binary(max_size=4))
def test_rows_end_to_end_whether_padded_or_gathered(rows, const):
    values, blobs = zip(*rows)
    parts = [const, W.varints(np.array(values, dtype=np.uint64)), W.blobs(list(blobs)),
             np.full((len(rows), 2), 7, np.uint8)]
    want = [const + W.varint(v) + b + b"\x07\x07" for v, b in rows]
    buf, length = W.flat(parts)
    assert length.tolist() == [len(r) for r in want] and buf.tobytes() == b"".join(want)
    assert W.rows(parts) == want
