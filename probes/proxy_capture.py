"""The proxy's capture file (captures/proxy.bin), which the packet tap writes too
(captures/tap.bin): its one definition (RECORDS), its reader, and a writer for
synthetic runs and tests.

Records are `u32 length | u8 kind | body`, little-endian, the length counting
the kind byte. A run killed mid-write leaves a torn last record: it is counted
and dropped, everything before it is kept.
"""

from __future__ import annotations

import io
import itertools
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import pandas as pd

from .capture_records import (CLOSE, DROPS, GAP, LOST, MALFORMED, MESSAGE, OPEN, PEER, RECORDS,  # noqa: F401
                              SKIP)
from .capture_records import CODES as _CODES
from .capture_records import FIELDS as _FIELDS
from .capture_records import HEAD as _HEAD
from .capture_records import STATUS_LEN  # noqa: F401
from .capture_records import encode as _encode

FRAMINGS = {1: "current", 2: "legacy"}
# The status beside each capture (capture_records.STATUS_LEN): probes/proxy-core/src/capture.rs writes it.


def _fixed(fields: list[tuple[str, str]]) -> tuple[list[str], struct.Struct]:
    """The fixed-width fields a record starts with: their names, and one Struct for them all."""
    lead = list(itertools.takewhile(lambda f: f[1] in _CODES, fields))
    return [name for name, _ in lead], struct.Struct("<" + "".join(_CODES[t] for _, t in lead))


_FIXED = {kind: _fixed(fields) for kind, fields in _FIELDS.items()}


@dataclass
class Capture:
    messages: pd.DataFrame  # one row per message; `at` is where its record's frame lengths start
    connections: pd.DataFrame
    malformed: pd.DataFrame
    lost: pd.DataFrame  # connections dropped before they were served (a peer's reset, no fd left); older captures have none
    skipped: pd.DataFrame  # the tap's: where it found a direction joined mid-stream in step, and the bytes before unread
    # the tap's: bytes of a direction it never got (the kernel dropped them), from offset; and the packets
    # the kernel dropped for want of room in its ring
    gaps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=_names(GAP)))
    drops: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=_names(DROPS)))
    torn_bytes: int = 0
    data: bytes = b""
    path: Path | None = None  # the file: parallel decoders read it themselves

    def frames(self, at: int) -> dict[int, bytes]:
        return frames_at(self.data, at)

    def frame_lens(self, at: int) -> list[int]:
        (n,) = _U32.unpack_from(self.data, at - 4)
        return list(_lens(n).unpack_from(self.data, at))


_MSG = _FIXED[MESSAGE][1]
_U32, _II, _H = (struct.Struct(f) for f in ("<I", "<II", "<H"))
_LENS: dict[int, struct.Struct] = {}
MESSAGE_COLUMNS = [*_FIXED[MESSAGE][0], "msg_bytes", "at", "frame0_at", "frame0_len"]


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
    msgs, conns, bad, lost, skipped, gaps, drops = [], {}, [], [], [], [], []
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
            r = _decode(OPEN, data, body, pos)
            conns[r["conn"]] = {**r, "peer_pid": -1, "closed_ns": None, "bytes_to_upstream": 0,
                                "bytes_from_upstream": 0}
        elif kind == PEER:
            r = _decode(PEER, data, body, pos)
            conns.setdefault(r["conn"], {"conn": r["conn"]})["peer_pid"] = r["peer_pid"]
        elif kind == CLOSE:
            r = _decode(CLOSE, data, body, pos)
            c = conns.setdefault(r["conn"], {"conn": r["conn"]})
            c["bytes_to_upstream" if r["direction"] == 0 else "bytes_from_upstream"] = r["bytes"]
            c["closed_ns"] = max(r["closed_ns"], c.get("closed_ns") or 0)
        elif kind == MALFORMED:
            bad.append(_decode(MALFORMED, data, body, pos))
        elif kind == LOST:
            lost.append(_decode(LOST, data, body, pos))
        elif kind == SKIP:
            skipped.append(_decode(SKIP, data, body, pos))
        elif kind == GAP:
            gaps.append(_decode(GAP, data, body, pos))
        elif kind == DROPS:
            drops.append(_decode(DROPS, data, body, pos))
    messages = pd.DataFrame(msgs, columns=MESSAGE_COLUMNS)
    # Each direction has its own thread, so records arrive in thread order: a
    # quick reply can be written before its request. Order by first byte.
    order = np.argsort(messages.t_first_ns.to_numpy(), kind="stable")
    messages = messages.iloc[order].reset_index(drop=True)
    messages.insert(0, "msg_id", np.arange(len(messages)))
    return Capture(
        messages=messages,
        connections=pd.DataFrame(list(conns.values())),
        malformed=pd.DataFrame(bad, columns=_names(MALFORMED)),
        lost=pd.DataFrame(lost, columns=_names(LOST)),
        skipped=pd.DataFrame(skipped, columns=_names(SKIP)),
        gaps=pd.DataFrame(gaps, columns=_names(GAP)),
        drops=pd.DataFrame(drops, columns=_names(DROPS)),
        torn_bytes=size - pos,
        data=data,
        path=path,
    )


def read_status(capture: Path) -> dict | None:
    """The capture writer's status (STATUS_LEN): state, t_ns, bytes, reason; None without one (a
    capture from before daskprobe 0.2, or none)."""
    try:
        fd = os.open(f"{capture}.status", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        state, t_ns, end, reason = (f.read(STATUS_LEN).decode("utf-8", "replace").strip().split(" ", 3) + [""] * 4)[:4]
    if not (t_ns.isdigit() and end.isdigit()):
        return None
    return {"state": state, "t_ns": int(t_ns), "bytes": int(end), "reason": reason}


def losses(cap: Capture, status: dict | None) -> dict:
    """What a capture says it lost ({} if nothing), for run.json's `lost`: the tap's packets the kernel
    dropped, the stretches (gaps) of how many connections they cut, the bytes never seen and the
    bytes left unread for them (a cut message and what followed until the next message boundary);
    and where its writer stopped, and why (a full disk)."""
    out = {}
    if len(cap.gaps) or len(cap.drops):
        gap_at = cap.gaps.groupby(["conn", "direction"]).offset.min().rename("gap_at")
        after = cap.skipped.join(gap_at, on=["conn", "direction"], how="inner")
        out |= {"packets_dropped": int(cap.drops.packets.sum()), "gaps": len(cap.gaps),
                "connections": int(cap.gaps.conn.nunique()), "bytes_never_seen": int(cap.gaps.bytes.sum()),
                "bytes_unread": int(after[after.offset > after.gap_at].bytes.sum())}
    if status and status["state"] == "stopped":
        out["stopped"] = {"t_ns": status["t_ns"], "at_bytes": status["bytes"], "reason": status["reason"]}
    return out


def _names(kind: int) -> list[str]:
    return [name for name, _ in _FIELDS[kind]]


def _decode(kind: int, data: bytes, pos: int, end: int) -> dict:
    """A record of fixed-width fields then strs (every kind but MESSAGE), by field name;
    the fields an older record ends before are None."""
    fixed = _FIXED[kind][1]
    values = [*fixed.unpack_from(data, pos), *_strs(data, pos + fixed.size, end)]
    names = _names(kind)
    return dict(zip(names, values + [None] * (len(names) - len(values))))


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

    def record(self, kind: int, **fields) -> None:
        """A record of RECORDS[kind] from its fields by name; an array's count is its length."""
        body = _encode(kind, fields)
        self.f.write(_HEAD.pack(len(body) + 1, kind) + body)

    def open(self, conn: int, t: int, label: str, peer_pid: int) -> None:
        addr = f"127.0.0.1:{10_000 + conn}"
        self.record(OPEN, conn=conn, opened_ns=t, label=label, listen=addr, peer_addr=addr, upstream=addr,
                    upstream_local=addr)
        self.record(PEER, conn=conn, peer_pid=peer_pid)

    def message(self, conn: int, direction: int, t_first: int, msg, opaque: int = 0, latency_ns: int = 40_000,
                frame0: bytes | None = None) -> None:
        """One current-framing message: frame 0 (kept; msg packed, or given raw) and `opaque`
        pickled frames of 100 bytes, its last byte latency_ns after its first."""
        frame0 = msgpack.packb(msg, use_bin_type=True) if frame0 is None else frame0
        self.record(MESSAGE, conn=conn, direction=direction, framing=1, truncated=0, t_first_ns=t_first,
                    t_last_ns=t_first + latency_ns, lens=[len(frame0)] + [100] * opaque, kept=[(0, frame0)])
