"""The packet tap against what was sent: Dask messages written by distributed's own comm over
loopback, and a connection that was open before the tap started, joined in the middle of a
message. Ground truth: the messages and bytes the sender wrote."""

import asyncio
import contextlib
import operator
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.comm import CommClosedError, connect, listen
from distributed.comm.tcp import _add_frames_header
from distributed.protocol import dumps, to_serialize

from helpers import PINNED_FLOW, run_flow, write_flow
from daskprobe.probes.proxy import start_tap, stop_proxy
from daskprobe.probes.rundir import RunDir
from daskprobe.probes.proxy_capture import read_capture, read_status
from daskprobe.probes.wire import decode_frame0, key_str

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a packet socket needs root (or CAP_NET_RAW)")

SIZES = [0, 10, 70_000, 3_000_000, 5, 200_000]


def ops(cap, direction: int) -> list[str]:
    """The op of each message of a direction, from its frame 0 as the tap kept it."""
    # messages that start in one segment share its time: a stable sort keeps them in stream order
    m = cap.messages[cap.messages.direction == direction].sort_values("t_first_ns", kind="stable")
    heads = [msgpack.unpackb(cap.frames(at)[0], raw=False, strict_map_key=False) for at in m["at"]]
    return [h.get("op") for h in heads if isinstance(h, dict) and "op" in h]


async def echo(comm):
    """Answers each message with an ack of its op."""
    try:
        while True:
            msg = await comm.read()
            await comm.write({"op": "ack-" + msg["op"]})
    except CommClosedError:
        pass


@contextlib.asynccontextmanager
async def tapped_echo(capture, tmp_path):
    """A connection to an echo server whose port the tap watches; and the tap."""
    listener = listen("tcp://127.0.0.1:0", echo)
    await listener.start()
    port = int(listener.listen_address.rsplit(":", 1)[1])
    tap = start_tap(capture, {port: "server"}, tmp_path / "tap.log")
    try:
        yield await connect(listener.contact_address), tap
    finally:
        stop_proxy(tap)
        listener.stop()


async def peer_found(capture, timeout: float = 30.0) -> None:
    """Until the tap has named the connection's peer: its lookup reads every process's fds in a thread of
    its own, which a busy machine may run after this short a connection would have closed (its pid then
    unknown, -1, as the tap says of a peer gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # a capture read while the tap writes it
            if (read_capture(capture).connections.peer_pid >= 0).any():
                return
        await asyncio.sleep(0.1)


def test_the_tap_reads_every_message_distributed_writes(tmp_path):
    msgs = [{"op": f"m{i}", "data": to_serialize(np.random.bytes(size)) if i % 2 else os.urandom(size)}
            for i, size in enumerate(SIZES * 4)]
    capture = tmp_path / "tap.bin"

    async def main():
        async with tapped_echo(capture, tmp_path) as (comm, _):
            for m in msgs:
                await comm.write(m)
                await comm.read()
            await peer_found(capture)
            await comm.close()
            await asyncio.sleep(0.3)  # the last segments reach the tap

    asyncio.run(main())
    cap = read_capture(capture)
    assert ops(cap, 0) == [m["op"] for m in msgs]
    assert ops(cap, 1) == ["ack-" + m["op"] for m in msgs]
    conn = cap.connections.iloc[0]
    assert len(cap.connections) == 1 and conn.label == "server" and conn.peer_pid == os.getpid()
    # every byte of the stream belongs to a message: the sum of their sizes is what was carried
    assert cap.messages[cap.messages.direction == 0].msg_bytes.sum() == conn.bytes_to_upstream
    assert cap.malformed.empty and cap.skipped.empty  # seen from its SYN: in step from the first byte


def five_messages_then(stop, capture: Path, tmp_path: Path, quiet: float) -> None:
    """Five messages through the tap, `quiet` seconds without any, then `stop(tap)`."""
    async def main():
        async with tapped_echo(capture, tmp_path) as (comm, tap):
            for i in range(5):
                await comm.write({"op": f"m{i}"})
                await comm.read()
            await asyncio.sleep(quiet)
            stop(tap)
            await comm.close()

    asyncio.run(main())


def test_what_the_tap_read_is_on_disk_while_no_packets_come(tmp_path):
    # it writes from its reading thread, which sleeps until packets come: what it read before a
    # quiet spell must be written all the same (a SIGKILL then loses nothing); 1 s: a block retired
    # (100 ms), then a write due (200 ms), and slack
    five_messages_then(lambda tap: (tap.kill(), tap.wait()), tmp_path / "tap.bin", tmp_path, 1.0)
    assert ops(read_capture(tmp_path / "tap.bin"), 0) == [f"m{i}" for i in range(5)]


def test_a_sigterm_ends_the_tap_with_what_it_read_written_and_said(tmp_path):
    # a stop that runs out of patience (a reader starved on a busy machine) sends SIGTERM: the tap
    # ends at once, and what it read is on disk with its status ended, not cut off while capturing;
    # 0.5 s: the messages' block retired (100 ms) and handed over
    capture, code = tmp_path / "tap.bin", []

    def term(tap):
        tap.send_signal(signal.SIGTERM)
        code.append(tap.wait(30))

    five_messages_then(term, capture, tmp_path, 0.5)
    assert code == [0] and ops(read_capture(capture), 0) == [f"m{i}" for i in range(5)]
    assert read_status(capture)["state"] == "ended", read_status(capture)


def dask_bytes(op: str, size: int) -> bytes:
    """One message as distributed's TCP comm puts it on the wire."""
    frames, _, _ = _add_frames_header(dumps({"op": op, "data": to_serialize(np.random.bytes(size))}))
    return b"".join(bytes(f) for f in frames)


def sink():
    """A server that reads and drops whatever its one connection sends: (it, its port, the sizes of
    its reads, the thread reading)."""
    server = socket.create_server(("127.0.0.1", 0))
    received = []

    def drain():
        conn, _ = server.accept()
        while chunk := conn.recv(1 << 20):
            received.append(len(chunk))

    reader = threading.Thread(target=drain)
    reader.start()
    return server, server.getsockname()[1], received, reader


def test_a_connection_joined_mid_message_resynchronizes(tmp_path):
    server, port, received, reader = sink()
    client = socket.create_connection(("127.0.0.1", port))
    before = [dask_bytes(f"before-{i}", 50_000) for i in range(5)]
    cut = dask_bytes("cut", 2_000_000)
    after = [dask_bytes(f"after-{i}", size) for i, size in enumerate(SIZES * 3)]
    head = b"".join(before) + cut[:300_000]
    client.sendall(head)
    while sum(received) < len(head):  # all of it past the wire before the tap starts
        time.sleep(0.01)
    tap = start_tap(tmp_path / "tap.bin", {port: "worker-0"}, tmp_path / "tap.log")
    try:
        client.sendall(cut[300_000:] + b"".join(after))
        client.close()
        reader.join(30)
        time.sleep(0.3)
    finally:
        stop_proxy(tap)
        server.close()
    cap = read_capture(tmp_path / "tap.bin")
    assert ops(cap, 0) == [f"after-{i}" for i in range(len(SIZES) * 3)]
    # it resynchronized exactly where the cut message ended: the bytes it saw of it went unread
    skip = cap.skipped.iloc[0]
    assert len(cap.skipped) == 1 and skip.bytes == skip.offset == len(cut) - 300_000
    assert cap.malformed.empty


def sent_through(client: socket.socket, data: bytes, received: list[int]) -> None:
    """Sends data to a sink() and waits until it read it: past the wire, its packets have reached
    the tap's ring, or been dropped."""
    sent = sum(received) + len(data)
    client.sendall(data)
    while sum(received) < sent:
        time.sleep(0.005)


def test_a_thousand_ports_are_watched_and_only_they(tmp_path):
    # a classic BPF filter holds at most 4,096 instructions: listing each port fails past about 500
    watched_server, port, received, reader = sink()
    other_server, other, other_received, other_reader = sink()
    ports = {p: f"worker-{p}" for p in range(1025, 65535, 64) if p not in (port, other)}
    ports = dict(list(ports.items())[:999]) | {port: "worker-0"}
    assert len(ports) == 1000 and min(ports) < other < max(ports)
    tap = start_tap(tmp_path / "tap.bin", ports, tmp_path / "tap.log")
    try:
        for srv_port, got in ((port, received), (other, other_received)):
            with socket.create_connection(("127.0.0.1", srv_port)) as client:
                for i in range(5):
                    sent_through(client, dask_bytes(f"m{i}", 100), got)
        reader.join(30)
        other_reader.join(30)
        time.sleep(0.3)
    finally:
        stop_proxy(tap)
        watched_server.close()
        other_server.close()
    cap = read_capture(tmp_path / "tap.bin")
    assert ops(cap, 0) == [f"m{i}" for i in range(5)]
    assert len(cap.connections) == 1 and cap.connections.label.iloc[0] == "worker-0"  # not the port between


def test_packets_the_kernel_dropped_are_counted_and_the_stream_reads_on(tmp_path):
    # The tap stopped (SIGSTOP: off a CPU under load) while 256 MiB go by: its 64 MiB ring fills and
    # the kernel drops the rest of the burst. The sender's TCP never resends them (its peer got them).
    server, port, received, reader = sink()
    tap = start_tap(tmp_path / "tap.bin", {port: "worker-0"}, tmp_path / "tap.log")
    client = socket.create_connection(("127.0.0.1", port))
    send = lambda data: sent_through(client, data, received)  # noqa: E731
    try:
        for i in range(5):
            send(dask_bytes(f"before-{i}", 1000))
        time.sleep(0.3)  # read before the stall
        os.kill(tap.pid, signal.SIGSTOP)
        try:
            big = dask_bytes("big", 4 << 20)
            for _ in range(64):
                send(big)
        finally:
            os.kill(tap.pid, signal.SIGCONT)
        time.sleep(1.0)  # it reads the ring it held
        for i in range(20):
            send(dask_bytes(f"after-{i}", 1000))
            time.sleep(0.01)
        client.close()
        reader.join(30)
        time.sleep(0.3)
    finally:
        stop_proxy(tap)
        server.close()
    cap = read_capture(tmp_path / "tap.bin")
    got = ops(cap, 0)
    # every message after the loss is read, in order; the big ones the gap cut are lost, and said so
    assert got[:5] == [f"before-{i}" for i in range(5)] and got[-20:] == [f"after-{i}" for i in range(20)], got
    assert 0 < got.count("big") < 64
    assert cap.drops.packets.sum() > 0, "the kernel's drops are counted"
    status = read_status(tmp_path / "tap.bin")  # its writer's status, padded as the reader expects
    assert status["state"] == "ended" and status["bytes"] == (tmp_path / "tap.bin").stat().st_size
    assert len(cap.gaps) >= 1 and cap.gaps.bytes.sum() > 0, "and the gap they left"
    lost = cap.skipped[(cap.skipped.conn == cap.gaps.conn.iloc[0]) & (cap.skipped.direction == 0)]
    assert lost.bytes.sum() >= cap.gaps.bytes.sum() and cap.malformed.empty


STALLED_FLOW = """
import os, time
import numpy as np
from distributed import Client
with Client() as c:
    c.submit(sum, [1, 2]).result()
    open({marker!r}, "w").close()
    while not os.path.exists({go!r}):  # the tap is stopped now
        time.sleep(0.05)
    for i in range(8):  # 256 MB from a worker: more than the tap's 64 MiB ring holds
        assert c.submit(np.ones, 4_000_000, key=f"big-{{i}}").result().sum() == 4_000_000
    open({moved!r}, "w").close()
    while not os.path.exists({resumed!r}):  # the tap runs again: what comes now has room
        time.sleep(0.05)
    for i in range(5):
        assert c.submit(sum, [i, 1], key=f"after-{{i}}").result() == i + 1
        time.sleep(0.2)
"""


def test_a_run_whose_tap_lost_packets_says_so_and_reads_on(tmp_path):
    # the tap stalled under traffic (SIGSTOP for the bulk of the transfer): the kernel drops what its ring
    # cannot hold; run.json, the terminal and the report say what was lost, and the jobs after are whole
    shared = Path(tempfile.mkdtemp(prefix="daskprobe-tap-"))  # where the cluster's user may write the markers
    shared.chmod(0o777)
    marker, go, moved, resumed = (shared / name for name in ("started", "go", "moved", "resumed"))
    flow = write_flow(tmp_path / "flow.py", STALLED_FLOW.format(marker=str(marker), go=str(go), moved=str(moved),
                                                                resumed=str(resumed)))
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "1", "--probes", "tap,proc",
                          "--out", str(out), "--", sys.executable, str(flow)], stderr=subprocess.PIPE, text=True)
    tap = None
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert p.poll() is None and time.monotonic() < deadline, "the flow did not start"
            time.sleep(0.05)
        run = RunDir(out)
        tap = next(r["pid"] for r in run.meta()["processes"] if r["name"] == "tap")
        os.kill(tap, signal.SIGSTOP)
        go.touch()
        while not moved.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if tap:
            os.kill(tap, signal.SIGCONT)
        time.sleep(1)  # it reads what its ring held
        resumed.touch()
        _, err = p.communicate(timeout=300)
        shutil.rmtree(shared)
    assert p.returncode == 0, err[-3000:]
    lost = run.meta()["lost"]["tap"]
    assert lost["packets_dropped"] > 0 and lost["gaps"] > 0 and lost["bytes_never_seen"] > 0, lost
    said = " ".join(err.split())  # the terminal wraps lines
    assert f"the tap lost {lost['gaps']} stretch(es)" in said, err[-3000:]
    assert f"the tap lost {lost['gaps']} stretch(es)" in (run / "report.html").read_text()
    jobs = run.table("jobs")
    told = run.table("messages").query("op == 'key-in-memory'").key
    assert {f"after-{i}" for i in range(5)} <= set(told), "every job after the loss is read"
    assert jobs.complete.iloc[-5:].all(), jobs


def keys_by_op(cap) -> dict[str, set[str]]:
    """op -> the keys of every op carrying one, batches expanded."""
    out = {}
    for at in cap.messages["at"]:
        frames = cap.frames(at)
        msg = decode_frame0(frames[0]) if 0 in frames else None
        for op in msg if isinstance(msg, (list, tuple)) else [msg]:
            if isinstance(op, dict) and "key" in op:
                out.setdefault(op.get("op"), set()).add(key_str(op["key"]))
    return out


def test_a_running_cluster_tapped_midway_shows_every_task_after(tmp_path):
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.gather(client.map(operator.add, range(200), range(200), key=[f"before-{i}" for i in range(200)]))
        ports = {int(addr.rsplit(":", 1)[1]): "worker" for addr in cluster.scheduler_info["workers"]}
        ports[int(cluster.scheduler_address.rsplit(":", 1)[1])] = "scheduler"
        tap = start_tap(tmp_path / "tap.bin", ports, tmp_path / "tap.log")
        try:
            after = [f"after-{i}" for i in range(300)]
            client.gather(client.map(operator.add, range(300), range(300), key=after))
            time.sleep(0.3)
        finally:
            t0, killed = time.monotonic(), stop_proxy(tap)
    cap = read_capture(tmp_path / "tap.bin")
    keys = keys_by_op(cap)
    # every task run after the tap started: sent to a worker, and reported done by it
    why = (f"{len(cap.messages)} messages; stopped in {time.monotonic() - t0:.1f} s, killed: {bool(killed)}; "
           f"status {read_status(tmp_path / 'tap.bin')}; log: {(tmp_path / 'tap.log').read_text()[-2000:]}")
    sent, done = keys.get("compute-task", set()), keys.get("task-finished", set())
    assert set(after) <= sent and set(after) <= done, f"{len(set(after) - sent)} not sent, {len(set(after) - done)} " \
        f"not done of {len(after)}; {why}"
    assert not any(k.startswith("before-") for k in sent | done)
    # the connections open before it started were joined mid-stream: each direction that spoke says so
    spoke = cap.messages.groupby(["conn", "direction"]).size().index
    joined = set(zip(cap.skipped.conn, cap.skipped.direction))
    assert joined and joined <= set(spoke) and cap.malformed.empty


def test_run_with_the_tap_instead_of_the_proxy(tmp_path):
    """The same workload and checks as test_run's under the proxy: the tables do not depend on
    which recorder saw the messages."""
    n = 40
    run, _ = run_flow(tmp_path, PINNED_FLOW.format(n=n), "--workers", "2", "--probes", "tap,proc")
    assert run.tap_capture.exists() and not run.proxy_capture.exists()
    m = run.table("messages")
    to_worker, to_sched = m[(m.src_role == "scheduler") & (m.dst_role == "worker")], m[m.dst_role == "scheduler"]
    assert (to_worker.op == "compute-task").sum() == n + 1
    assert ((to_sched.src_role == "worker") & (to_sched.op == "task-finished")).sum() == n + 1
    told = m[(m.src_role == "scheduler") & (m.dst_role == "client") & (m.op == "key-in-memory")]
    assert told.key.nunique() == n + 1
    assert ((m.src_role == "worker") & (m.dst_role == "worker") & (m.op == "get_data")).any()
    procs = run.table("processes").set_index("name")
    assert procs.role["tap"] == "probe" and "proxy" not in procs.index
    assert len(run.table("attempts")) == n + 1 and (run.path / "report.html").exists()


def test_a_connection_closed_before_its_syn_was_read_is_named_its_opener(tmp_path):
    # The ring hands packets over a block at a time, up to RETIRE_MS (100 ms) after they came: a
    # scheduler's RPC to a worker that lasted less (CI, a fast machine) was closed by then, its
    # opener unknown and the scheduler taken for the client. Each of these lives 50 ms: read from
    # the ring alone, all eight would be named 1 time in 256.
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    capture = tmp_path / "tap.bin"
    tap = start_tap(capture, {port: "server"}, tmp_path / "tap.log")
    try:
        for _ in range(8):
            with socket.create_connection(("127.0.0.1", port)):
                server.accept()[0].close()
                time.sleep(0.05)
            time.sleep(0.2)  # the next one in a block of its own
    finally:
        stop_proxy(tap)
        server.close()
    conns = read_capture(capture).connections
    assert len(conns) == 8
    assert (conns.peer_pid == os.getpid()).all(), conns.peer_pid.tolist()
