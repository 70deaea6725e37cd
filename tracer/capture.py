"""Read the proxy's capture file (layout: probes/proxy-core/src/record.rs).

Records are `u32 body_len | u8 kind | body`. A run killed mid-write leaves a
torn last record: it is counted and dropped, everything before it is kept.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

OPEN, PEER, MESSAGE, CLOSE, MALFORMED = 1, 2, 3, 4, 5
FRAMINGS = {1: "current", 2: "legacy"}


@dataclass
class Capture:
    messages: pd.DataFrame
    connections: pd.DataFrame
    malformed: pd.DataFrame
    torn_bytes: int = 0
    # frame index -> bytes, per message row (frame 0, 2.x payload, msgpack sub-headers)
    kept: list[dict[int, bytes]] = field(default_factory=list)


class _Reader:
    def __init__(self, buf: memoryview, pos: int, end: int):
        self.buf, self.pos, self.end = buf, pos, end

    def more(self) -> bool:
        return self.pos < self.end

    def take(self, fmt: str):
        vals = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return vals if len(vals) > 1 else vals[0]

    def str(self) -> str:
        n = self.take("H")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def raw(self, n: int) -> bytes:
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b


def read_capture(path: Path) -> Capture:
    data = memoryview(path.read_bytes()) if path.exists() else memoryview(b"")
    msgs, kept, conns, bad = [], [], {}, []
    pos = 0
    while pos + 5 <= len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        if pos + 4 + length > len(data):
            break
        kind = data[pos + 4]
        r = _Reader(data, pos + 5, pos + 4 + length)
        pos += 4 + length
        if kind == MESSAGE:
            row, frames = _message(r)
            msgs.append(row)
            kept.append(frames)
        elif kind == OPEN:
            conn, t = r.take("IQ")
            label, listen, peer, upstream = r.str(), r.str(), r.str(), r.str()
            up_local = r.str() if r.more() else None  # added in 0.1: older captures lack it
            conns[conn] = {"conn": conn, "label": label, "listen": listen, "peer_addr": peer,
                           "upstream": upstream, "upstream_local": up_local, "opened_ns": t, "peer_pid": -1,
                           "closed_ns": None, "bytes_to_upstream": 0, "bytes_from_upstream": 0}
        elif kind == PEER:
            conn, pid = r.take("Ii")
            conns.setdefault(conn, {"conn": conn})["peer_pid"] = pid
        elif kind == CLOSE:
            conn, d, t, nbytes = r.take("IBQQ")
            c = conns.setdefault(conn, {"conn": conn})
            c["bytes_to_upstream" if d == 0 else "bytes_from_upstream"] = nbytes
            c["closed_ns"] = max(t, c.get("closed_ns") or 0)
        elif kind == MALFORMED:
            conn, d, t, offset = r.take("IBQQ")
            bad.append({"conn": conn, "direction": d, "t_ns": t, "offset": offset, "reason": r.str()})
    # Each direction has its own thread, so records arrive in thread order: a
    # quick reply can be written before its request. Order by first byte.
    order = sorted(range(len(msgs)), key=lambda i: msgs[i]["t_first_ns"])
    msgs = [dict(msgs[i], msg_id=n) for n, i in enumerate(order)]
    kept = [kept[i] for i in order]
    return Capture(
        messages=pd.DataFrame(msgs, columns=["msg_id", "conn", "direction", "framing", "truncated",
                                             "t_first_ns", "t_last_ns", "nframes", "frame_bytes", "msg_bytes"]),
        connections=pd.DataFrame(list(conns.values())),
        malformed=pd.DataFrame(bad, columns=["conn", "direction", "t_ns", "offset", "reason"]),
        torn_bytes=len(data) - pos,
        kept=kept,
    )


def _message(r: _Reader) -> tuple[dict, dict[int, bytes]]:
    conn, d, framing, truncated, t0, t1, n = r.take("IBBBQQI")
    lens = r.take(f"{n}Q") if n else ()
    lens = (lens,) if n == 1 else tuple(lens)
    frames = {}
    for _ in range(r.take("I")):
        idx, size = r.take("II")
        frames[idx] = r.raw(size)
    prelude = 8 * (n + (2 if framing == 1 else 1))
    row = {"conn": conn, "direction": d, "framing": FRAMINGS.get(framing, "?"), "truncated": bool(truncated),
           "t_first_ns": t0, "t_last_ns": t1, "nframes": n, "frame_bytes": list(lens),
           "msg_bytes": prelude + sum(lens)}
    return row, frames
