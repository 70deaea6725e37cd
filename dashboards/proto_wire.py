"""Protobuf wire encoding for the few Perfetto messages the trace writes per event.

Building one protobuf object per event cost most of the trace stage (about
25 µs each); the bytes are simple enough to write directly, and for many
events at once: a message is a list of parts (constant bytes, or a column of
varints, fixed-width values or byte strings), encoded for all rows together
with numpy. Field numbers and types come from Perfetto's own descriptors, so
they cannot drift from the protos the UI reads; tests parse the result back
with those protos.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

# wire type by descriptor type: varints; 64-bit (double, fixed64); length-delimited (string, message, bytes)
_WIRE = {t: 0 for t in (3, 4, 5, 8, 13, 14)} | {1: 1, 6: 1} | {9: 2, 11: 2, 12: 2}
U64 = (1 << 64) - 1


def varint(n: int) -> bytes:
    """An unsigned varint; a signed int64 field is written as int(v) & U64 (10 bytes when negative)."""
    if n < 0:
        raise ValueError(f"varint of {n}: mask a signed value with & U64")
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(message, field: str) -> bytes:
    """The key of `field` of a Perfetto message class: its number and wire type, from the descriptor."""
    f = message.DESCRIPTOR.fields_by_name[field]
    if f.type not in _WIRE:
        raise TypeError(f"{message.DESCRIPTOR.name}.{field}: descriptor type {f.type} is not encoded here")
    return varint((f.number << 3) | _WIRE[f.type])


def sub(key: bytes, body: bytes) -> bytes:
    """A length-delimited field: a string, bytes or an embedded message."""
    return key + varint(len(body)) + body


class T:
    """Keys of the fields written, named <message>_<field>."""
    packet = tag(pb.Trace, "packet")
    ts = tag(pb.TracePacket, "timestamp")
    seq = tag(pb.TracePacket, "trusted_packet_sequence_id")
    flags = tag(pb.TracePacket, "sequence_flags")
    track_event = tag(pb.TracePacket, "track_event")
    interned = tag(pb.TracePacket, "interned_data")
    perf_sample = tag(pb.TracePacket, "perf_sample")
    descriptor = tag(pb.TracePacket, "track_descriptor")
    ev_type = tag(pb.TrackEvent, "type")
    ev_track = tag(pb.TrackEvent, "track_uuid")
    ev_name = tag(pb.TrackEvent, "name_iid")
    ev_value = tag(pb.TrackEvent, "double_counter_value")
    ev_flow = tag(pb.TrackEvent, "flow_ids")
    ev_flow_end = tag(pb.TrackEvent, "terminating_flow_ids")
    ev_arg = tag(pb.TrackEvent, "debug_annotations")
    arg_name = tag(pb.DebugAnnotation, "name")
    arg_int = tag(pb.DebugAnnotation, "int_value")
    arg_str = tag(pb.DebugAnnotation, "string_value")
    in_event_names = tag(pb.InternedData, "event_names")
    in_functions = tag(pb.InternedData, "function_names")
    in_paths = tag(pb.InternedData, "mapping_paths")
    in_mappings = tag(pb.InternedData, "mappings")
    in_frames = tag(pb.InternedData, "frames")
    in_stacks = tag(pb.InternedData, "callstacks")
    iid = tag(pb.EventName, "iid")  # field 1 in every interned message
    name = tag(pb.EventName, "name")
    string = tag(pb.InternedString, "str")
    mapping_path = tag(pb.Mapping, "path_string_ids")
    frame_function = tag(pb.Frame, "function_name_id")
    frame_mapping = tag(pb.Frame, "mapping_id")
    stack_frame = tag(pb.Callstack, "frame_ids")
    sample_pid = tag(pb.PerfSample, "pid")
    sample_tid = tag(pb.PerfSample, "tid")
    sample_stack = tag(pb.PerfSample, "callstack_iid")


assert all(tag(m, "iid") == T.iid for m in (pb.InternedString, pb.Mapping, pb.Frame, pb.Callstack))


def varints(values) -> tuple[np.ndarray, np.ndarray]:
    """Many varints at once: (bytes, one row per value, as wide as the longest; each value's length)."""
    a = np.asarray(values).astype(np.uint64)  # int64 wraps, as protobuf encodes negatives
    width = max(1, -(-int(a.max(initial=0)).bit_length() // 7))
    groups = np.empty((len(a), width), np.uint8)
    for k in range(width):  # each 7-bit group as a byte, not as a uint64: an eighth of the memory moved
        groups[:, k] = (a >> np.uint64(7 * k)).astype(np.uint8) & 0x7F
    length = 1 + np.searchsorted(np.uint64(1) << np.arange(7, 7 * width, 7, dtype=np.uint64), a, side="right")
    groups |= (np.arange(width) < (length - 1)[:, None]).view(np.uint8) << 7  # the continuation bits
    return groups, length


class Ragged(NamedTuple):
    """A part of any length per row: the rows' bytes end to end, and each row's length."""
    buf: np.ndarray
    length: np.ndarray


def blobs(values: list[bytes]) -> Ragged:
    """Byte strings of any lengths, one per row, as a part."""
    return Ragged(np.frombuffer(b"".join(values), np.uint8), np.fromiter(map(len, values), np.int64, len(values)))


def _parts(parts: list) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each part as (bytes, where each row's piece starts in them, its length): constant bytes, a
    varints() pair (a row of width k per value), an (n, k) uint8 array, or Ragged."""
    n = next(len(p[1]) if isinstance(p, tuple) else len(p) for p in parts if not isinstance(p, bytes))
    out = []
    for p in parts:
        if isinstance(p, bytes):
            out.append((np.frombuffer(p, np.uint8), np.zeros(n, np.int64), np.full(n, len(p))))
        elif isinstance(p, Ragged):
            out.append((p.buf, np.cumsum(p.length) - p.length, p.length))
        else:
            m, length = p if isinstance(p, tuple) else (p, np.full(n, p.shape[1]))
            out.append((m.ravel(), np.arange(n, dtype=np.int64) * m.shape[1], length))
    return out


def flat(parts: list) -> tuple[np.ndarray, np.ndarray]:
    """Every row's parts end to end, all rows in one byte array; and each row's length."""
    parts = [_padded(p) if isinstance(p, Ragged) and p.length.max(initial=0) <= PAD_MAX else p for p in parts]
    if not any(isinstance(p, Ragged) for p in parts):
        return _flat_padded(parts)
    pieces = _parts(parts)
    offset = np.cumsum([0] + [len(b) for b, _, _ in pieces[:-1]])
    starts = np.stack([s + o for (_, s, _), o in zip(pieces, offset)], axis=1)
    length = np.stack([length for _, _, length in pieces], axis=1)
    buf = np.concatenate([b for b, _, _ in pieces])
    return gather(buf, starts.ravel(), length.ravel()), length.sum(axis=1)


PAD_MAX = 64  # a ragged part no longer than this is padded; longer ones (thousands of flows) are gathered


def _padded(p: Ragged) -> tuple[np.ndarray, np.ndarray]:
    """A Ragged part as a varints()-like pair: rows padded to the longest, and each row's length."""
    m = np.zeros((len(p.length), int(p.length.max(initial=0))), np.uint8)
    m[np.arange(m.shape[1]) < p.length[:, None]] = p.buf
    return m, p.length


def _flat_padded(parts: list) -> tuple[np.ndarray, np.ndarray]:
    """flat() of parts of bounded width (no Ragged): the rows side by side, each part padded to
    its width, and the bytes kept by one mask (row-major order is the rows end to end)."""
    n = next(len(p[1]) if isinstance(p, tuple) else len(p) for p in parts if not isinstance(p, bytes))
    blocks, masks, length = [], [], np.zeros(n, np.int64)
    for p in parts:
        if isinstance(p, bytes):
            m, k = np.broadcast_to(np.frombuffer(p, np.uint8), (n, len(p))), np.full(n, len(p))
        else:
            m, k = p if isinstance(p, tuple) else (p, np.full(n, p.shape[1]))
        blocks.append(m)
        masks.append(np.arange(m.shape[1]) < k[:, None])
        length += k
    return np.hstack(blocks)[np.hstack(masks)], length


def rows(parts: list) -> list[bytes]:
    """Per row, its parts end to end."""
    buf, length = flat(parts)
    ends, b = np.cumsum(length), buf.tobytes()
    return [b[s:e] for s, e in zip((ends - length).tolist(), ends.tolist())]


def gather(buf: np.ndarray, starts: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The byte ranges [start, start + length) of buf, end to end."""
    kind = np.int32 if len(buf) < 2**31 else np.int64  # half the index bytes to move, where they fit
    at = np.cumsum(length) - length
    return buf[np.repeat((starts - at).astype(kind), length) + np.arange(int(length.sum()), dtype=kind)]


def sized(parts: list) -> tuple[np.ndarray, np.ndarray]:
    """Parts of a message, as the varints() pair of its length (to prefix a length-delimited field)."""
    return varints(sum(length for _, _, length in _parts(parts)))
