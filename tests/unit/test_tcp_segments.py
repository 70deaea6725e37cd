"""TCP segments as the eBPF agent records them, and the kernel type information that tells
it where to read their sequence numbers."""

import struct

import pandas as pd
import pytest

from daskprobe.probes import ebpf_format, ebpf_tables
from daskprobe.probes.btf import Btf

READ, SYN, FIN = 0x100, 0x2, 0x1


def segments(tmp_path, rows, ports=None):
    """read_tcp of segments (seq, end_seq, rcv_nxt, flags, data_len) received on port 9000 from 9001
    (or on each row's ports: (local, remote), the proxy's side, 9000, or the peer's, 9001)."""
    path = tmp_path / "ebpf_events.bin"
    ports = ports or [(9000, 9001)] * len(rows)
    path.write_bytes(b"".join(ebpf_format.record(ebpf_format.Event(
        kind=ebpf_format.KINDS["tcp"][0], t0=i, v1=local << 16 | remote, v2=data_len,
        t1=seq << 32 | end, t2=nxt << 32 | flags))
        for i, ((seq, end, nxt, flags, data_len), (local, remote)) in enumerate(zip(rows, ports))))
    conns = pd.DataFrame({"conn": [1], "listen": ["127.0.0.1:9000"], "peer_addr": ["127.0.0.1:9001"],
                          "upstream": ["127.0.0.1:9100"], "upstream_local": ["127.0.0.1:9101"]})
    return ebpf_tables.read_tcp(ebpf_tables.read_events(path), conns)


def test_a_segment_counts_what_it_adds_to_the_stream(tmp_path):
    wrap = 2**32 - 500
    df = segments(tmp_path, [
        (100, 1100, 100, READ, 1000),                     # in order
        (100, 1100, 1100, READ, 1000),                    # sent again: nothing new
        (600, 1600, 1100, READ, 1000),                    # half sent again
        (wrap, 500, wrap, READ, 1000),                    # across the wrap of sequence numbers
        (0, 200_000, 0, READ, 200_000 % 65536),           # merged skbs: data_len wrapped
        (5000, 5501, 5000, READ | FIN, 500),              # the last data, with FIN
        (5500, 5501, 5501, READ | FIN, 0),                # that FIN again
        (7, 8, 7, READ | SYN, 0),                         # a SYN
        (0, 0, 0, 0, 1234),                               # sequence numbers not read: data_len
    ])
    assert df.payload.tolist() == [1000, 1000, 1000, 1000, 200_000, 500, 0, 0, 1234]
    assert df.bytes.tolist() == [1000, 0, 500, 1000, 200_000, 500, 0, 0, 1234]
    assert df[["conn", "direction", "hop"]].drop_duplicates().values.tolist() == [[1, 0, "peer"]]


NAMES = ["int", "a", "b", "outer", "x", "y", "decl"]
INT, STRUCT, UNION, DECL_TAG = 1, 4, 5, 17


def name(n: str) -> int:
    """Where `n` lies in the blob's strings (0: no name)."""
    return 1 + sum(len(s) + 1 for s in NAMES[:NAMES.index(n)]) if n else 0


def btf_type(n: str, kind: int, size: int, tail: bytes = b"", vlen: int = 0, kflag: int = 0) -> bytes:
    return struct.pack("<III", name(n), kflag << 31 | kind << 24 | vlen, size) + tail


def members(*ms: tuple[str, int, int]) -> bytes:
    """(name, type id, offset in bits) of each."""
    return b"".join(struct.pack("<III", name(n), t, off) for n, t, off in ms)


def test_bytes_a_socket_took_in_unprobed_count_at_its_next_segment(tmp_path):
    # a segment no probe saw (on array_flow, 2 of 15,256): rcv_nxt tells what the socket took meanwhile
    up, down = (9000, 9001), (9001, 9000)  # the two directions of one connection, their sequences apart
    df = segments(tmp_path, [
        (0, 1000, 0, READ, 1000),
        (7000, 7100, 7000, READ, 100),                    # the other direction
        (1000, 2000, 1000, READ, 1000),
        (3000, 4000, 3000, READ, 1000),                   # 2000-3000 taken in, never probed
        (7100, 7200, 7100, READ, 100),
        (4000, 4001, 4000, READ | FIN, 0),
        (4000, 4001, 4001, READ | FIN, 0),                # that FIN again: past it, nothing unseen
        (1500, 2500, 4001, READ, 1000),                   # an old segment sent again, late
    ], [up, down, up, up, down, up, up, up])
    assert df.unseen.tolist() == [0, 0, 0, 1000, 0, 0, 0, 0]
    assert df.bytes.tolist() == [1000, 100, 1000, 2000, 100, 0, 0, 0]
    assert df.groupby("direction").bytes.sum().tolist() == [4000, 200]


def btf_blob(types: list[bytes]) -> bytes:
    strings = b"\0" + b"".join(n.encode() + b"\0" for n in NAMES)
    body = b"".join(types)
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(strings)) + body + strings


def test_members_are_found_in_anonymous_unions_and_at_bitfield_offsets(tmp_path):
    types = [
        btf_type("int", INT, 4, struct.pack("<I", 32)),                                         # 1
        btf_type("outer", STRUCT, 0),                                                           # 2: declared empty
        btf_type("", UNION, 4, members(("a", 1, 0), ("b", 1, 0)), vlen=2),                      # 3: union { a; b; }
        btf_type("decl", DECL_TAG, 1, struct.pack("<i", -1)),                                   # 4
        # 5: outer { x; union { a; b; }; a 3-bit y at bit 96 }, its offsets in kflag's encoding
        btf_type("outer", STRUCT, 16, members(("x", 1, 0), ("", 3, 64), ("y", 1, 3 << 24 | 96)), vlen=3, kflag=1),
    ]
    path = tmp_path / "vmlinux"
    path.write_bytes(btf_blob(types))
    btf = Btf(str(path))
    assert [btf.offset("outer", m) for m in ("x", "a", "b", "y")] == [0, 8, 8, 12]
    with pytest.raises(KeyError):
        btf.offset("outer", "z")
    path.write_bytes(btf_blob(types[:-1] + [types[-1][:-4]]))  # its last member cut off
    with pytest.raises(ValueError):
        Btf(str(path))
