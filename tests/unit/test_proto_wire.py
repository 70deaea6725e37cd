"""The trace's hand-written protobuf bytes read back with Perfetto's own protos."""

import io

import numpy as np
import pandas as pd
from google.protobuf.internal.encoder import _VarintBytes
from hypothesis import given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from daskprobe.tracer import proto_wire as W
from daskprobe.tracer.trace_writer import BEGIN, COUNTER, END, _bulk, _Writer


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20))
def test_varints_in_bulk_are_the_varints_one_by_one(values):
    m, length = W.varints(np.array(values, dtype=np.uint64))
    assert [bytes(m[i, :length[i]]) for i in range(len(values))] == [W.varint(v) for v in values] \
        == [_VarintBytes(v) for v in values]  # protobuf's own encoder


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(1, 2**40), st.floats(allow_nan=False)), min_size=1,
                max_size=20))
def test_bulk_packets_parse_as_the_events_they_encode(events):
    ev = pd.DataFrame(events, columns=["ts", "track", "value"])
    for kind, extra in ((END, []), (COUNTER, ["value"])):
        trace = pb.Trace()
        trace.ParseFromString(b"".join(_bulk(ev, kind, extra)))
        assert len(trace.packet) == len(ev)
        for p, (ts, track, value) in zip(trace.packet, events):
            e = p.track_event
            assert (p.timestamp, e.type, e.track_uuid, p.trusted_packet_sequence_id) == (ts, kind, track, 1)
            assert e.double_counter_value == (value if extra else 0.0)


def test_the_writers_packets_parse_with_their_interned_data_flows_and_arguments():
    f = io.BytesIO()
    w = _Writer(f)
    w.descriptor(pb.TrackDescriptor(uuid=1, name="t"))
    w.event(10, BEGIN, 1, name="inc", flow_out=[2**63 + 5], flow_in=[7], args={"key": "inc-1", "nbytes": -1})
    w.event(20, BEGIN, 1, name="inc", args={"nbytes": 2**40})  # the name again: interned once
    w.sample(30, 100, 101, 5, [("main", "a.py"), ("f", "a.py")])
    w.sample(40, 100, 101, 6, [("main", "a.py"), ("g", "b.py")])  # shares its root frame with stack 5
    w.flush()
    p = pb.Trace.FromString(f.getvalue()).packet
    assert p[0].sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED and p[0].track_descriptor.name == "t"
    e = p[1].track_event
    assert p[1].sequence_flags == pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    assert [(n.iid, n.name) for n in p[1].interned_data.event_names] == [(1, "inc")] and e.name_iid == 1
    assert list(e.flow_ids) == [2**63 + 5] and list(e.terminating_flow_ids) == [7]
    assert {a.name: a.string_value or a.int_value for a in e.debug_annotations} == {"key": "inc-1", "nbytes": -1}
    assert p[2].track_event.name_iid == 1 and not p[2].interned_data.event_names
    assert p[2].track_event.debug_annotations[0].int_value == 2**40
    first, second = p[3].interned_data, p[4].interned_data
    assert [s.str for s in first.function_names] == [b"main", b"f"] and [s.str for s in second.function_names] == [b"g"]
    assert len(second.frames) == 1 and list(second.callstacks[0].frame_ids) == [1, 3]
    assert (p[4].perf_sample.pid, p[4].perf_sample.tid, p[4].perf_sample.callstack_iid) == (100, 101, 2)
