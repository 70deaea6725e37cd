"""The comm tap's files merged by root (probes/comm_capture.py): connections numbered anew, the peer's pid
from the connecting end's record, and nothing read that is not a regular file of the cluster's user."""

import os
import struct

from daskprobe.probes.capture_records import HEAD, MESSAGE, OPEN, STATUS_LEN, record
from daskprobe.probes.comm_capture import merge
from daskprobe.probes.proxy_capture import read_capture, read_status

SCHED, WORKER = "127.0.0.1:9001", "127.0.0.1:9002"


def _open(conn, label, listen, peer):
    return record(OPEN, conn=conn, opened_ns=10, label=label, listen=listen, peer_addr=peer, upstream=listen,
                  upstream_local="")


def _msg(conn, direction, t, frame0=b"\x81\xa2op\xa4ping"):
    return record(MESSAGE, conn=conn, direction=direction, framing=1, truncated=0, t_first_ns=t, t_last_ns=t + 5,
                  lens=[len(frame0), 1000], kept=[(0, frame0)])


def _file(d, pid, data, state="ended"):
    (d / f"comm-{pid}.bin").write_bytes(data)
    (d / f"comm-{pid}.bin.status").write_bytes(f"{state} 1 {len(data)} -".encode().ljust(STATUS_LEN - 1) + b"\n")


def test_merge_numbers_connections_and_names_peers(tmp_path):
    src = tmp_path / "comm"
    src.mkdir()
    # the scheduler (pid 100) accepted the worker's connection (and a client's); the worker (pid 200)
    # records that it connected, and a message it read on a connection it accepted itself
    _file(src, 100, _open(1, "accept", SCHED, "127.0.0.1:40000") + _msg(1, 0, 100) + _msg(1, 1, 200)
          + _open(2, "accept", SCHED, "127.0.0.1:40001") + _msg(2, 0, 300))
    _file(src, 200, _open(1, "connect", SCHED, "127.0.0.1:40000") + _open(2, "accept", WORKER, "127.0.0.1:40002")
          + _msg(2, 0, 400) + b"\x40\x00\x00\x00\x03torn")
    dest = tmp_path / "comm.bin"
    assert merge(src, dest, os.geteuid(), {100: "scheduler", 200: "worker-0"}) == []
    cap = read_capture(dest)
    c = cap.connections.set_index("conn")
    assert sorted(c.index) == [1, 2, 3] and cap.torn_bytes == 0
    assert list(c.label) == ["scheduler", "scheduler", "worker-0"]
    assert list(c.peer_pid) == [200, -1, -1]  # the worker; a client (no comm tap); one nobody claims
    m = cap.messages
    assert list(zip(m.conn, m.direction, m.t_first_ns)) == [(1, 0, 100), (1, 1, 200), (2, 0, 300), (3, 0, 400)]
    assert read_status(dest)["state"] == "ended"


def test_merge_reads_only_the_users_regular_files(tmp_path):
    src = tmp_path / "comm"
    src.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(_open(1, "accept", SCHED, "127.0.0.1:1") + _msg(1, 0, 1))
    (src / "comm-300.bin").symlink_to(secret)  # planted by the cluster's user: root must not follow it
    _file(src, 400, _open(1, "accept", SCHED, "127.0.0.1:2") + _msg(1, 0, 2))
    os.chown(src / "comm-400.bin", 65534, 65534)  # another user's
    _file(src, 500, _open(1, "accept", WORKER, "127.0.0.1:3") + _msg(1, 0, 3), state="capturing")  # killed
    dest = tmp_path / "comm.bin"
    said = merge(src, dest, os.geteuid(), {})
    assert any(s.startswith("comm-300.bin:") for s in said)
    assert any(s.startswith("comm-400.bin: not a regular file of the cluster's user") for s in said)
    assert any(s.startswith("comm-500.bin: its writer's status is 'capturing'") for s in said)
    cap = read_capture(dest)
    assert list(cap.messages.t_first_ns) == [3]  # the killed process's records up to its last write
    status = read_status(dest)
    assert status["state"] == "stopped" and "comm-500.bin" in status["reason"]


def test_the_comm_taps_fast_message_record_is_the_definitions():
    from daskprobe.probes.capture_records import message_record
    kept = [(0, b"\x81\xa2op\xa4ping"), (2, b"\x80")]
    assert message_record(3, 1, 1, 1, 5, 9, [9, 200, 1], kept) == record(
        MESSAGE, conn=3, direction=1, framing=1, truncated=1, t_first_ns=5, t_last_ns=9, lens=[9, 200, 1], kept=kept)


def test_merge_leaves_out_records_root_could_not_walk(tmp_path):
    """The files are the cluster's user's to write: a record that lies about its lengths is left out, not
    handed to the reader (which walks the proxy's records by them)."""
    src = tmp_path / "comm"
    src.mkdir()
    good = _msg(1, 0, 7)
    lying = bytearray(_msg(1, 0, 8))
    lying[5 + 4 + 3 + 16:5 + 4 + 3 + 16 + 4] = (10**6).to_bytes(4, "little")  # nframes far beyond the record
    short_open = HEAD.pack(13, OPEN) + struct.pack("<IQ", 2, 1)  # ends before its addresses
    _file(src, 100, _open(1, "accept", SCHED, "127.0.0.1:1") + good + bytes(lying) + short_open)
    dest = tmp_path / "comm.bin"
    merge(src, dest, os.geteuid(), {})
    cap = read_capture(dest)
    assert list(cap.messages.t_first_ns) == [7] and len(cap.connections) == 1
