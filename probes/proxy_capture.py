"""Read the proxy's capture file (layout: probes/proxy-core/src/record.rs).

Records are `u32 body_len | u8 kind | body`. A run killed mid-write leaves a
torn last record: it is counted and dropped, everything before it is kept.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
import pandas as pd

OPEN, PEER, MESSAGE, CLOSE, MALFORMED, LOST = 1, 2, 3, 4, 5, 6
FRAMINGS = {1: "current", 2: "legacy"}


@dataclass
class Capture:
    messages: pd.DataFrame  # one row per message; `at` is where its record's frame lengths start
    connections: pd.DataFrame
    malformed: pd.DataFrame
    lost: pd.DataFrame  # connections dropped before they were served (a peer's reset, no fd left); older captures have none
    torn_bytes: int = 0
    data: bytes = b""
    path: Path | None = None  # the file: parallel decoders read it themselves

    def frames(self, at: int) -> dict[int, bytes]:
        return frames_at(self.data, at)

    def frame_lens(self, at: int) -> list[int]:
        (n,) = _U32.unpack_from(self.data, at - 4)
        return list(_lens(n).unpack_from(self.data, at))


_HEAD = struct.Struct("<IB")
_MSG = struct.Struct("<IBBBQQI")
_U32, _Q, _II, _IQ, _Ii, _IBQQ, _H = (struct.Struct(f) for f in ("<I", "<Q", "<II", "<IQ", "<Ii", "<IBQQ", "<H"))
_LENS: dict[int, struct.Struct] = {}
MESSAGE_COLUMNS = ["conn", "direction", "framing", "truncated", "t_first_ns", "t_last_ns", "nframes",
                   "msg_bytes", "at", "frame0_at", "frame0_len"]


def _lens(n: int) -> struct.Struct:
    return _LENS.get(n) or _LENS.setdefault(n, struct.Struct(f"<{n}Q"))


def _strs(data: bytes, pos: int, end: int) -> list[str]:
    out = []
    while pos < end:
        (n,) = _H.unpack_from(data, pos)
        out.append(data[pos + 2:pos + 2 + n].decode("utf-8", "replace"))
        pos += 2 + n
    return out


def frames_at(data: bytes, at: int) -> dict[int, bytes]:
    """Frame index -> kept bytes (frame 0, 2.x payload, msgpack sub-headers) of the message
    record whose frame lengths start at `at`: read when needed, because holding them for
    millions of messages would cost more than the tables."""
    (n,) = _U32.unpack_from(data, at - 4)
    pos = at + 8 * n
    (k,) = _U32.unpack_from(data, pos)
    pos += 4
    frames = {}
    for _ in range(k):
        idx, size = _II.unpack_from(data, pos)
        frames[idx] = data[pos + 8:pos + 8 + size]
        pos += 8 + size
    return frames


def read_capture(path: Path) -> Capture:
    data = path.read_bytes() if path.exists() else b""
    msgs, conns, bad, lost = [], {}, [], []
    pos, size = 0, len(data)
    # The hot loop: millions of records in a large run, so one unpack per field group.
    while pos + 5 <= size:
        length, kind = _HEAD.unpack_from(data, pos)
        body, pos = pos + 5, pos + 4 + length
        if pos > size:
            pos = body - 5
            break
        if kind == MESSAGE:
            msgs.append(_message(data, body))
        elif kind == OPEN:
            conn, t = _IQ.unpack_from(data, body)
            label, listen, peer, upstream, *rest = _strs(data, body + 12, pos)
            conns[conn] = {"conn": conn, "label": label, "listen": listen, "peer_addr": peer,
                           "upstream": upstream, "upstream_local": rest[0] if rest else None,  # added in 0.1
                           "opened_ns": t, "peer_pid": -1, "closed_ns": None,
                           "bytes_to_upstream": 0, "bytes_from_upstream": 0}
        elif kind == PEER:
            conn, pid = _Ii.unpack_from(data, body)
            conns.setdefault(conn, {"conn": conn})["peer_pid"] = pid
        elif kind == CLOSE:
            conn, d, t, nbytes = _IBQQ.unpack_from(data, body)
            c = conns.setdefault(conn, {"conn": conn})
            c["bytes_to_upstream" if d == 0 else "bytes_from_upstream"] = nbytes
            c["closed_ns"] = max(t, c.get("closed_ns") or 0)
        elif kind == MALFORMED:
            conn, d, t, offset = _IBQQ.unpack_from(data, body)
            bad.append({"conn": conn, "direction": d, "t_ns": t, "offset": offset,
                        "reason": _strs(data, body + 21, pos)[0]})
        elif kind == LOST:
            (t,) = _Q.unpack_from(data, body)
            label, reason = _strs(data, body + 8, pos)
            lost.append({"t_ns": t, "label": label, "reason": reason})
    messages = pd.DataFrame(msgs, columns=MESSAGE_COLUMNS)
    # Each direction has its own thread, so records arrive in thread order: a
    # quick reply can be written before its request. Order by first byte.
    order = np.argsort(messages.t_first_ns.to_numpy(), kind="stable")
    messages = messages.iloc[order].reset_index(drop=True)
    messages.insert(0, "msg_id", np.arange(len(messages)))
    return Capture(
        messages=messages,
        connections=pd.DataFrame(list(conns.values())),
        malformed=pd.DataFrame(bad, columns=["conn", "direction", "t_ns", "offset", "reason"]),
        lost=pd.DataFrame(lost, columns=["t_ns", "label", "reason"]),
        torn_bytes=size - pos,
        data=data,
        path=path,
    )


def _message(data: bytes, pos: int) -> tuple:
    conn, d, framing, truncated, t0, t1, n = _MSG.unpack_from(data, pos)
    at = pos + _MSG.size
    prelude = 8 * (n + (2 if framing == 1 else 1))
    # Where frame 0 is kept, its place: decoding then needs one slice, not the frames map.
    kept = at + 8 * n
    (k,) = _U32.unpack_from(data, kept)
    idx, size = _II.unpack_from(data, kept + 4) if k else (-1, 0)
    f0 = kept + 12 if idx == 0 else -1
    return (conn, d, FRAMINGS.get(framing, "?"), bool(truncated), t0, t1, n,
            prelude + sum(_lens(n).unpack_from(data, at)), at, f0, size)


class CaptureWriter:
    """Records as the proxy writes them: for synthetic runs and tests of the readers."""

    def __init__(self, f: io.BufferedWriter):
        self.f = f

    def _record(self, kind: int, body: bytes) -> None:
        self.f.write(struct.pack("<IB", len(body) + 1, kind) + body)

    @staticmethod
    def _str(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<H", len(b)) + b

    def open(self, conn: int, t: int, label: str, peer_pid: int) -> None:
        addr = f"127.0.0.1:{10_000 + conn}"
        self._record(OPEN, struct.pack("<IQ", conn, t) + b"".join(
            self._str(s) for s in (label, addr, addr, addr, addr)))
        self._record(PEER, struct.pack("<Ii", conn, peer_pid))

    def message(self, conn: int, direction: int, t_first: int, msg, opaque: int = 0, latency_ns: int = 40_000,
                frame0: bytes | None = None) -> None:
        """One current-framing message: frame 0 (kept; msg packed, or given raw) and `opaque`
        pickled frames of 100 bytes, its last byte latency_ns after its first."""
        frame0 = msgpack.packb(msg, use_bin_type=True) if frame0 is None else frame0
        lens = [len(frame0)] + [100] * opaque
        body = struct.pack(f"<IBBBQQI{len(lens)}QI", conn, direction, 1, 0, t_first, t_first + latency_ns,
                           len(lens), *lens, 1)
        self._record(MESSAGE, body + struct.pack("<II", 0, len(frame0)) + frame0)
