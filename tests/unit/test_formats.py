"""Each capture format has one definition, and its writers and readers are held to it.

The proxy's records and the sampler's lines go through files in tests/data/formats that
the Rust writers' own code wrote: `cargo test` fails when those writers no longer write
them byte for byte, these tests when the Python side no longer reads (or writes) them as
the values the Rust tests wrote. eBPF events: the C struct, the ctypes class and the numpy
dtype generated from ebpf_format agree (the C compiler's view: tests/integration/test_ebpf_format_c.py;
the real round trip: tests/integration/test_ebpf.py)."""

import ctypes
import io
from pathlib import Path

import numpy as np

from daskprobe.probes import ebpf_format
from daskprobe.probes.proxy_capture import (CLOSE, DROPS, FRAMINGS, GAP, LOST, MALFORMED, MESSAGE, OPEN, PEER, SKIP,
                                            CaptureWriter, read_capture)
from daskprobe.probes.pyspy import LINES, read_samples

DATA = Path(__file__).parent.parent / "data" / "formats"

# What the test in probes/proxy-core/src/record.rs wrote into proxy.bin, field by field.
PROXY_RECORDS = [
    (OPEN, dict(conn=7, opened_ns=0x0102_0304_0506_0708, label="worker-0", listen="127.0.0.1:8786",
                peer_addr="127.0.0.1:50001", upstream="127.0.0.1:40001", upstream_local="127.0.0.1:50002")),
    (PEER, dict(conn=7, peer_pid=4242)),
    (OPEN, dict(conn=0xfedc_ba98, opened_ns=9, label="wörker-é", listen="[::1]:1", peer_addr="", upstream="x",
                upstream_local="")),
    (PEER, dict(conn=0xfedc_ba98, peer_pid=-1)),
    (MESSAGE, dict(conn=7, direction=0, framing=1, truncated=0, t_first_ns=0x1122_3344_5566_7788,
                   t_last_ns=0x1122_3344_5566_9900, lens=[9, 0x0001_0203_0405, 1],
                   kept=[(0, b"\x81\xa2op\xa4ping"), (2, b"\x80")])),
    (MESSAGE, dict(conn=0xfedc_ba98, direction=1, framing=2, truncated=1, t_first_ns=0x2122_3344_5566_7788,
                   t_last_ns=2**64 - 1, lens=[5], kept=[])),
    (MALFORMED, dict(conn=0xfedc_ba98, direction=1, t_ns=0x3122_3344_5566_7788, offset=0x0a0b_0c0d_0e0f, reason="bad")),
    (CLOSE, dict(conn=7, direction=0, closed_ns=0x4122_3344_5566_7788, bytes=0x0001_0203_0405_0607)),
    (CLOSE, dict(conn=7, direction=1, closed_ns=0x4122_3344_5566_7789, bytes=3)),
    (CLOSE, dict(conn=0xfedc_ba98, direction=0, closed_ns=0x4122_3344_5566_7790, bytes=0)),
    (LOST, dict(t_ns=0x5122_3344_5566_7788, label="scheduler", reason="accept: Too many open files (os error 24)")),
    (SKIP, dict(conn=7, direction=1, t_ns=0x6122_3344_5566_7788, offset=0x0708_090a_0b0c, bytes=0x0102_0304_0506)),
    (GAP, dict(conn=0xfedc_ba98, direction=0, t_ns=0x7122_3344_5566_7788, offset=0x1718_191a_1b1c,
               bytes=0x1112_1314_1516)),
    (DROPS, dict(t_ns=0x8122_3344_5566_7788, packets=0x2122_2324_2526)),
]

# What the test in probes/sampler-core/src/lines.rs wrote into pyspy.tsv, line by line.
SAMPLER_LINES = [
    ("A", dict(t_ns=1_000_000_001, pid=4242, name="worker-0", reader="cpython311")),
    ("F", dict(frame_id=0, function="spin", filename="/app/flow.py", line=12)),
    ("F", dict(frame_id=1, function="<module>", filename="/app/flow.py", line=30)),
    ("S", dict(t_ns=1_000_000_002, pid=4242, tid=4243, active=1, owns_gil=0, thread_name="MainThread",
               frame_ids=[0, 1], ident=140_234_081_310_528, stale=0, tick=1, period_ns=12_345_678)),
    ("L", dict(t_ns=1_000_000_003, pid=4242, read_ns=2_500_001)),
    ("E", dict(t_ns=1_000_000_004, pid=4244, message="worker-1: no such process")),  # its tab cleaned to a space
]


def of(records, kind):
    return [fields for k, fields in records if k == kind]


def test_the_python_writer_writes_what_the_proxy_writes():
    buf = io.BytesIO()
    w = CaptureWriter(buf)
    for kind, fields in PROXY_RECORDS:
        w.record(kind, **fields)
    assert buf.getvalue() == (DATA / "proxy.bin").read_bytes()


def test_the_reader_reads_back_what_the_proxy_wrote():
    cap = read_capture(DATA / "proxy.bin")
    assert cap.torn_bytes == 0
    msgs = cap.messages.set_index("t_first_ns")
    for m in of(PROXY_RECORDS, MESSAGE):
        row = msgs.loc[m["t_first_ns"]]
        assert (row.conn, row.direction, row.framing, row.truncated, row.t_last_ns, row.nframes) == (
            m["conn"], m["direction"], FRAMINGS[m["framing"]], bool(m["truncated"]), m["t_last_ns"], len(m["lens"]))
        assert cap.frame_lens(row["at"]) == m["lens"] and cap.frames(row["at"]) == dict(m["kept"])
    conns = cap.connections.set_index("conn")
    for o in of(PROXY_RECORDS, OPEN):
        fields = {k: v for k, v in o.items() if k != "conn"}
        assert conns.loc[o["conn"], list(fields)].to_dict() == fields
    assert {p["conn"]: p["peer_pid"] for p in of(PROXY_RECORDS, PEER)} == conns.peer_pid.to_dict()
    for conn in conns.index:
        closes = [c for c in of(PROXY_RECORDS, CLOSE) if c["conn"] == conn]
        assert conns.closed_ns[conn] == max(c["closed_ns"] for c in closes)
        for c in closes:
            assert conns[("bytes_to_upstream", "bytes_from_upstream")[c["direction"]]][conn] == c["bytes"]
    assert cap.malformed.to_dict("records") == of(PROXY_RECORDS, MALFORMED)
    assert cap.lost.to_dict("records") == of(PROXY_RECORDS, LOST)
    assert cap.skipped.to_dict("records") == of(PROXY_RECORDS, SKIP)
    assert cap.gaps.to_dict("records") == of(PROXY_RECORDS, GAP)
    assert cap.drops.to_dict("records") == of(PROXY_RECORDS, DROPS)


def test_an_open_record_from_before_upstream_local_reads_it_as_none(tmp_path):
    buf = io.BytesIO()
    CaptureWriter(buf).record(OPEN, **{**of(PROXY_RECORDS, OPEN)[0], "upstream_local": ""})
    old = bytearray(buf.getvalue()[:-2])  # without the empty str's length
    old[:4] = (len(old) - 4).to_bytes(4, "little")
    (tmp_path / "proxy.bin").write_bytes(old)
    c = read_capture(tmp_path / "proxy.bin").connections
    assert c.upstream_local.tolist() == [None] and c.upstream.tolist() == ["127.0.0.1:40001"]


PARSE = {"int": int, "flag": {"0": 0, "1": 1}.__getitem__, "str": str,
         "ids": lambda s: [int(i) for i in s.split(",") if i]}


def parse(line: str) -> tuple[str, dict]:
    """One line by LINES alone: its kind, and its fields by name and type."""
    kind, *values = line.split("\t")
    fields = [f.split(":") for f in LINES[kind][0].split()]
    assert len(values) == len(fields), line
    return kind, {name: PARSE[t](v) for (name, t), v in zip(fields, values)}


def test_the_sampler_lines_are_what_the_definition_says():
    text = (DATA / "pyspy.tsv").read_text()
    assert [parse(line) for line in text.splitlines()] == SAMPLER_LINES


def test_read_samples_reads_back_what_the_sampler_wrote():
    samples, stacks, frames = read_samples(DATA / "pyspy.tsv")
    assert frames.to_dict("records") == of(SAMPLER_LINES, "F")
    (s,) = of(SAMPLER_LINES, "S")
    (row,) = samples.to_dict("records")
    assert stacks.set_index("stack_id").frame_ids[row.pop("stack_id")] == s["frame_ids"]
    assert row == {k: (bool(v) if k in ("active", "owns_gil", "stale", "tick") else v) for k, v in s.items() if k != "frame_ids"}


def test_older_sample_lines_read_with_defaults_and_a_cut_last_line_is_left_out(tmp_path):
    (s,) = of(SAMPLER_LINES, "S")
    full = "\t".join(["S", *(str(v) if k != "frame_ids" else "0,1" for k, v in s.items())])
    fields = full.split("\t")
    # as written before period_ns, tick, stale and ident: each, and a line cut short by a kill
    older = ["\t".join(fields[:n]) for n in (11, 10, 9, 8)]
    (tmp_path / "pyspy.tsv").write_text("\n".join(older) + "\n" + full[:-3])
    samples, _, _ = read_samples(tmp_path / "pyspy.tsv")
    assert samples.period_ns.isna().all() and samples.ident.tolist() == [s["ident"]] * 3 + [0]
    assert samples.tick.tolist() == [True, False, False, False] and samples.stale.tolist() == [False] * 4


def test_a_thread_s_samples_from_before_it_was_named_carry_its_first_name(tmp_path):
    line = "S\t{t}\t10\t{tid}\t1\t0\t{name}\t0\t{ident}\t0\t1\t10000000"
    rows = [(1, 11, "", 7), (2, 11, "", 7), (3, 11, "worker", 7), (4, 11, "renamed", 7),
            (5, 12, "", 8), (6, 11, "", 9)]  # another thread never named; another thread on tid 11 later
    (tmp_path / "pyspy.tsv").write_text("F\t0\tf\t/a.py\t1\n" + "".join(
        line.format(t=t, tid=tid, name=name, ident=ident) + "\n" for t, tid, name, ident in rows))
    samples, _, _ = read_samples(tmp_path / "pyspy.tsv")
    assert samples.thread_name.tolist() == ["worker", "worker", "worker", "renamed", "", ""]


def test_the_event_struct_ctypes_class_and_numpy_dtype_have_one_layout():
    dtype, Event = ebpf_format.numpy_dtype(), ebpf_format.Event
    assert dtype.itemsize == ctypes.sizeof(Event) == ebpf_format.SIZE
    for (name, c_type), (dname, (ntype, offset)) in zip(Event._fields_, dtype.fields.items(), strict=True):
        assert (name, np.dtype(c_type), getattr(Event, name).offset) == (dname, ntype, offset)
