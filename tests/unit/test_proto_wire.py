"""The trace's hand-written protobuf bytes read back with Perfetto's own protos."""

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from daskprobe.tracer import proto_wire as W
from daskprobe.tracer.trace_writer import COUNTER, END, _bulk


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20))
def test_varints_in_bulk_are_the_varints_one_by_one(values):
    m, length = W.varints(np.array(values, dtype=np.uint64))
    assert [bytes(m[i, :length[i]]) for i in range(len(values))] == [W.varint(v) for v in values]


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
