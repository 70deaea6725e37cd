"""Perfetto packets as bytes: track descriptors, interned data, and every event of a run
encoded in bulk (proto_wire), one kind at a time, then written in time order.

Names, frames and stacks are interned once, in the first packet, so no event carries interned
data of its own. What the events are, and on which tracks, is trace_writer's.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from . import proto_wire as W

SEQ = 1
SEQ_HEAD = W.T.seq + W.varint(SEQ)
BEGIN, END, COUNTER = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_COUNTER


class Tracks:
    """Track descriptors, handed to the Writer as soon as a track is first needed (it serializes
    them when the events are written, so a name may be settled later: rename, unique)."""

    def __init__(self, out: "Writer"):
        self.out, self.uuids, self.next = out, {}, itertools.count(1)
        self.made: dict[int, pb.TrackDescriptor] = {}

    def get(self, key, name: str, parent=None, pid=None, counter=False, thread=None) -> int:
        """The uuid of the track for key. pid makes a process track; thread=(pid, tid)
        a thread track, on which the UI shows that thread's CPU samples."""
        if key not in self.uuids:
            uuid = self.uuids[key] = next(self.next)
            d = pb.TrackDescriptor(uuid=uuid, name=name)
            if parent is not None:
                d.parent_uuid = parent
            if pid is not None:
                d.process.pid, d.process.process_name = int(pid), name
            if counter:
                d.counter.SetInParent()
            if thread is not None:
                d.thread.pid, d.thread.tid, d.thread.thread_name = int(thread[0]), int(thread[1]), name
            self.made[uuid] = d
            self.out.descriptor(d)
        return self.uuids[key]

    def rename(self, uuid: int, name: str) -> None:
        """A track's name, settled after it was made (before the events are written)."""
        d = self.made[uuid]
        d.name = name
        if d.HasField("process"):
            d.process.process_name = name
        if d.HasField("thread"):
            d.thread.thread_name = name

    def unique(self) -> None:
        """Sibling tracks (one parent, or none) named alike would look like one in the UI, each
        with half the events: every one but the first gets " (2)", " (3)"... (the names given are
        meant to be unique already: this is the last guard)."""
        taken = {(d.parent_uuid, d.name) for d in self.made.values()}
        seen = set()
        for d in self.made.values():
            key = (d.parent_uuid, d.name)
            if key in seen:
                n = 2
                while (d.parent_uuid, f"{d.name} ({n})") in taken:
                    n += 1
                self.rename(d.uuid, f"{d.name} ({n})")
                taken.add((d.parent_uuid, d.name))
            seen.add(key)


class Writer:
    """Packets as bytes (proto_wire): track descriptors as tracks are first needed, then every event
    in time order. Each frame and stack is interned once (a name once per call of names()), all in
    the first packet."""

    def __init__(self, f):
        self.f, self.chunks, self.first = f, [], True
        self.new = []  # interned data not yet written
        self.named = 0  # event names interned so far

    def descriptor(self, d: pb.TrackDescriptor) -> None:
        """A track, in the order made (a parent before its children); serialized by events(), so
        its name may still change (Tracks.rename)."""
        self.chunks.append(d)

    def _packet(self, d: pb.TrackDescriptor) -> bytes:
        flags = W.T.flags + W.varint(pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED) if self.first else b""
        self.first = False
        return W.sub(W.T.packet, SEQ_HEAD + flags + W.sub(W.T.descriptor, d.SerializeToString()))

    def _intern(self, field: bytes, inner: list) -> None:
        """Interned entries of one field, a row each; inner starts with their iids."""
        if len(inner[1][1]):
            self.new.append(W.flat([field, W.sized(inner), *inner])[0].tobytes())

    def names(self, names: pd.Series) -> np.ndarray:
        """Each event name's iid; all interned at once."""
        codes, uniques = pd.factorize(names)
        iids = np.arange(self.named + 1, self.named + len(uniques) + 1)  # names of an earlier call keep theirs
        self._intern(W.T.in_event_names, [W.T.iid, W.varints(iids), *_string(W.T.name, uniques)])
        self.named += len(uniques)
        return codes + 1 + self.named - len(uniques)

    def stacks(self, stacks: pd.Series, frames: pd.DataFrame) -> dict:
        """stack_id -> callstack iid, for stacks of frame ids (root first) of frames (label, path);
        every function, file, frame and stack interned at once."""
        used = pd.unique(np.concatenate([np.asarray(f, dtype="int64") for f in stacks])) if len(stacks) else []
        f = frames.reindex(used)
        fn, labels = pd.factorize(f.label)
        pth, paths = pd.factorize(f.path)  # one mapping per file: its iid is the file's
        frame, pairs = pd.factorize(pd.MultiIndex.from_arrays([fn + 1, pth + 1]))
        self._intern(W.T.in_functions, [W.T.iid, W.varints(np.arange(1, len(labels) + 1)),
                                        *_string(W.T.string, labels)])
        self._intern(W.T.in_paths, [W.T.iid, W.varints(np.arange(1, len(paths) + 1)), *_string(W.T.string, paths)])
        self._intern(W.T.in_mappings, [W.T.iid, W.varints(np.arange(1, len(paths) + 1)), W.T.mapping_path,
                                       W.varints(np.arange(1, len(paths) + 1))])
        pairs = pairs.to_frame(index=False).to_numpy("int64")
        self._intern(W.T.in_frames, [W.T.iid, W.varints(np.arange(1, len(pairs) + 1)), W.T.frame_function,
                                     W.varints(pairs[:, 0]), W.T.frame_mapping, W.varints(pairs[:, 1])])
        iid_of = dict(zip(used, (frame + 1).tolist()))
        ids = np.array([iid_of[x] for ids in stacks for x in ids], dtype=np.int64)
        refs, ref_len = W.flat([W.T.stack_frame, W.varints(ids)])
        owner = np.repeat(np.arange(len(stacks)), [len(x) for x in stacks])  # stacks may be empty
        per_stack = np.bincount(owner, weights=ref_len, minlength=len(stacks)).astype(np.int64)
        iids = np.arange(1, len(stacks) + 1)
        self._intern(W.T.in_stacks, [W.T.iid, W.varints(iids), W.Ragged(refs, per_stack)])
        return dict(zip(stacks.index, iids.tolist()))

    def events(self, buf: np.ndarray, starts: np.ndarray, length: np.ndarray, order: np.ndarray) -> None:
        """The descriptors, then event packets (byte ranges of buf) in `order`. The interned data rides
        in the first descriptor's packet, so every event after it may use it."""
        chunks = [self._packet(d) for d in self.chunks]
        if chunks and self.new:
            chunks[0] = W.sub(W.T.packet, _body(chunks[0]) + W.sub(W.T.interned, b"".join(self.new)))
            self.new = []
        self.f.write(b"".join(chunks))
        self.chunks.clear()
        for lo in range(0, len(order), CHUNK):
            at = order[lo:lo + CHUNK]
            self.f.write(W.gather(buf, starts[at], length[at]).tobytes())


def _string(key: bytes, values) -> list:
    """The parts of a string field, one per row."""
    b = W.blobs([str(v).encode() for v in values])
    return [key, W.varints(b[1]), b]


def _body(packet: bytes) -> bytes:
    """A Trace.packet field's body: past its key (one byte) and its length (a varint)."""
    i = 1
    while packet[i] & 0x80:
        i += 1
    return packet[i + 1:]


ARG_CHARS = 200  # an argument's string is for reading in the UI: longer ones are cut


def event_tail(n: int, flow_out, flow_in, args: dict) -> list[bytes]:
    """Flows through or ending at each slice, then its debug annotations, encoded in bulk."""
    parts = [_flows(W.T.ev_flow, flow_out, n), _flows(W.T.ev_flow_end, flow_in, n)]
    for name, values in args.items():
        values = pd.Series(values, copy=False)
        key = W.sub(W.T.arg_name, name.encode())
        if pd.api.types.is_integer_dtype(values.dtype):
            inner = [key + W.T.arg_int, W.varints(values.to_numpy("int64"))]
        else:
            text = W.blobs([v[:ARG_CHARS].encode() for v in values.astype(str).to_numpy(object)])
            inner = [key + W.T.arg_str, W.varints(text[1]), text]
        parts += [W.T.ev_arg, W.sized(inner), *inner]
    parts = [p for p in parts if p is not None]
    return W.rows(parts) if parts and n else [b""] * n


def _flows(key: bytes, flows, n: int):
    """A part: per slice, key + fixed64 of each of its flow ids; None if no slice has one."""
    if flows is None or not len(flows):
        return None
    ids = flows.sort_index(kind="stable") if isinstance(flows, pd.Series) else pd.Series(np.asarray(flows))
    one = np.concatenate([np.frombuffer(key, np.uint8)[None, :].repeat(len(ids), 0),
                          ids.to_numpy().astype(np.uint64).astype("<u8").view(np.uint8).reshape(-1, 8)], axis=1)
    return W.Ragged(one.ravel(), np.bincount(ids.index.to_numpy(), minlength=n) * one.shape[1])


NEEDS_STATE = W.T.flags + W.varint(pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE)
CHUNK = 1 << 18  # events encoded at once: bounds the index arrays of a large run


def emit(w: Writer, *encoded: list) -> None:
    """Events encoded (by encode(), in one go or in parts) written in time order; at equal times
    ends, then counters and samples, then begins, so adjacent slices do not cross."""
    bufs, lengths, ts, rank = (sum((list(e[i]) for e in encoded), []) for i in range(4))
    length = np.concatenate(lengths) if ts else np.zeros(0, np.int64)
    order = np.lexsort((np.concatenate(rank), np.concatenate(ts))) if ts else length
    w.events(np.concatenate(bufs) if ts else np.zeros(0, np.uint8), np.cumsum(length) - length, length, order)


def encode(slices: pd.DataFrame, counters: pd.DataFrame, samples: pd.DataFrame, stacks: dict) -> list:
    """Every event packet encoded in bulk, per kind: [buffers, their lengths, times, ranks at equal
    times]. Slices are named by iid (Writer.names), samples' stacks by stacks (Writer.stacks)."""
    kinds = [  # (events, time column, rank at equal times, payload field, its parts, uses interned data)
        (slices, "start", 2, W.T.track_event, lambda d: [
            W.T.ev_type + W.varint(BEGIN) + W.T.ev_track, W.varints(d.track.to_numpy("int64")), W.T.ev_name,
            W.varints(d.name.to_numpy("int64")), W.blobs(d.extra.tolist())], True),
        (slices, "end", 0, W.T.track_event, lambda d: [
            W.T.ev_type + W.varint(END) + W.T.ev_track, W.varints(d.track.to_numpy("int64"))], False),
        (counters, "ts", 1, W.T.track_event, lambda d: [
            W.T.ev_type + W.varint(COUNTER) + W.T.ev_track, W.varints(d.track.to_numpy("int64")), W.T.ev_value,
            d.value.to_numpy("float64").astype("<f8").view(np.uint8).reshape(-1, 8)], False),
        (samples, "ts", 1, W.T.perf_sample, lambda d: [
            W.T.sample_pid, W.varints(d.pid.to_numpy("int64")), W.T.sample_tid, W.varints(d.tid.to_numpy("int64")),
            W.T.sample_stack, W.varints(d.stack_id.map(stacks).to_numpy("int64"))], True)]
    bufs, lengths, ts, rank = [], [], [], []
    for events, time, order, key, payload, interned in kinds:
        for lo in range(0, len(events), CHUNK):
            d = events.iloc[lo:lo + CHUNK]
            t = d[time].to_numpy("int64")
            buf, length = W.flat(packet_parts(t, key, payload(d), interned))
            bufs.append(buf), lengths.append(length), ts.append(t), rank.append(np.full(len(t), order))
    return [bufs, lengths, ts, rank]


def packet_parts(ts: np.ndarray, key: bytes, payload: list, interned: bool = False) -> list:
    """The parts of TracePackets, one per row: a timestamp and one payload field (`key`)."""
    body = [SEQ_HEAD + (NEEDS_STATE if interned else b"") + W.T.ts, W.varints(ts), key, W.sized(payload), *payload]
    return [W.T.packet, W.sized(body), *body]
