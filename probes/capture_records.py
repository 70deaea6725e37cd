"""The records of the messages capture (proxy.bin, tap.bin, comm.bin): their one definition (RECORDS)
and how a record is written. It imports nothing but the standard library: the comm tap
(probes/comm_tap.py) loads this file by path inside the cluster's processes, whose interpreter may
not have daskprobe; probes/proxy_capture.py reads with it.

Records are `u32 length | u8 kind | body`, little-endian, the length counting the kind byte.
"""

import struct

OPEN, PEER, MESSAGE, CLOSE, MALFORMED, LOST, SKIP, GAP, DROPS = 1, 2, 3, 4, 5, 6, 7, 8, 9
# Each kind's body, field by field. u8, u32, i32, u64: fixed widths; str: u16 byte length, then
# UTF-8; T[n]: n of T, n an earlier field; frame: u32 frame index, u32 length, that many bytes.
# The proxy writes them (probes/proxy-core/src/record.rs), the reader (proxy_capture.py), the comm tap
# and CaptureWriter are built from them, and tests/unit/test_formats.py holds them to one file the
# proxy's code wrote. Trailing fields were added later (upstream_local in 0.1): an older record ends
# before them.
RECORDS = {
    OPEN: ("open", "conn:u32 opened_ns:u64 label:str listen:str peer_addr:str upstream:str upstream_local:str"),
    PEER: ("peer", "conn:u32 peer_pid:i32"),
    MESSAGE: ("message", "conn:u32 direction:u8 framing:u8 truncated:u8 t_first_ns:u64 t_last_ns:u64 nframes:u32 "
                         "lens:u64[nframes] nkept:u32 kept:frame[nkept]"),
    CLOSE: ("close", "conn:u32 direction:u8 closed_ns:u64 bytes:u64"),
    MALFORMED: ("malformed", "conn:u32 direction:u8 t_ns:u64 offset:u64 reason:str"),
    LOST: ("lost", "t_ns:u64 label:str reason:str"),
    SKIP: ("skip", "conn:u32 direction:u8 t_ns:u64 offset:u64 bytes:u64"),
    GAP: ("gap", "conn:u32 direction:u8 t_ns:u64 offset:u64 bytes:u64"),
    DROPS: ("drops", "t_ns:u64 packets:u64"),
}
# The kinds whose body starts with `conn` (u32): what merging captures renumbers.
WITH_CONN = frozenset(k for k, (_, spec) in RECORDS.items() if spec.startswith("conn:u32"))
# What a message record keeps of its frames, as the proxy (probes/proxy-core/src/framing.rs): frame 0,
# and a later frame at most SUBHEADER_MAX long that starts like a msgpack map; at most KEEP_CAP bytes
# in all (beyond, `truncated`). Payload frames are counted only.
KEEP_CAP = 16 << 20
SUBHEADER_MAX = 64 << 10

FIELDS = {kind: [tuple(f.split(":")) for f in spec.split()] for kind, (_, spec) in RECORDS.items()}
CODES = {"u8": "B", "u32": "I", "i32": "i", "u64": "Q"}
HEAD = struct.Struct("<IB")
# Beside each capture, FILE.status: one line `STATE T_NS BYTES REASON` padded with spaces to
# STATUS_LEN bytes, written whole when the capture opens, then over itself (no new space needed on a
# full disk). STATE: capturing (or killed while it was), ended (every record written), stopped
# (writing failed at BYTES, REASON says why).
STATUS_LEN = 512
_II, _H = struct.Struct("<II"), struct.Struct("<H")


def is_msgpack_map(first: int) -> bool:
    return 0x81 <= first <= 0x8F or first in (0xDE, 0xDF)


def _packer(t: str):
    """How a field of type t is written."""
    item, array, _ = t.partition("[")
    if item == "str":
        return lambda s: _H.pack(len(s.encode())) + s.encode()
    if item == "frame":
        return lambda frames: b"".join(_II.pack(idx, len(b)) + b for idx, b in frames)
    if array:
        return lambda xs: struct.pack(f"<{len(xs)}{CODES[item]}", *xs)
    return struct.Struct("<" + CODES[item]).pack


def _packers(fields: list) -> list:
    """(name, the array it counts or None, its packer) per field."""
    counted = {t.partition("[")[2][:-1]: name for name, t in fields if "[" in t}
    return [(name, counted.get(name), _packer(t)) for name, t in fields]


PACKERS = {kind: _packers(fields) for kind, fields in FIELDS.items()}


def encode(kind: int, values: dict) -> bytes:
    """A record's body of RECORDS[kind] from its fields by name; an array's count is its length."""
    return b"".join(pack(len(values[array]) if array else values[name]) for name, array, pack in PACKERS[kind])


def _message_fixed() -> struct.Struct:
    """The header and the fixed fields a message record starts with (up to nframes), as one Struct."""
    fixed = []
    for _, t in FIELDS[MESSAGE]:
        if t not in CODES:
            break
        fixed.append(CODES[t])
    return struct.Struct("<IB" + "".join(fixed))


_MESSAGE_FIXED = _message_fixed()


def message_record(conn: int, direction: int, framing: int, truncated: int, t_first_ns: int, t_last_ns: int,
                   lens: list, kept: list) -> bytes:
    """record(MESSAGE, ...) with no per-field work: the comm tap builds one per message in the cluster's
    event loops, where the generic path cost twice as much."""
    tail = struct.pack(f"<{len(lens)}QI", *lens, len(kept)) + b"".join(_II.pack(i, len(b)) + b for i, b in kept)
    return _MESSAGE_FIXED.pack(_MESSAGE_FIXED.size - 4 + len(tail), MESSAGE, conn, direction, framing, truncated,
                               t_first_ns, t_last_ns, len(lens)) + tail


def record(kind: int, **fields) -> bytes:
    """A whole record: header and body."""
    body = encode(kind, fields)
    return HEAD.pack(len(body) + 1, kind) + body
