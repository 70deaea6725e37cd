"""The proxy alone, between real sockets: bytes unchanged, framing recorded,
bad peers survived, and nothing captured ever unpickled."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import msgpack
import pytest

from helpers import daskprobe
from daskprobe.probes.procfs import cpu_s
from daskprobe.probes.proxy import Route, proxy_binary, start_proxy, stop_proxy
from daskprobe.probes.proxy_capture import read_capture
from daskprobe.tracer.capture.cluster import free_port


class Echo:
    """A TCP server that hashes what it receives and sends it straight back."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.hashes: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn):
        h = hashlib.sha256()
        with conn:
            while data := conn.recv(1 << 20):
                h.update(data)
                conn.sendall(data)
        self.hashes.append(h.hexdigest())


def limited(tmp_path: Path, limits: str) -> Path:
    """A stand-in for the proxy binary that runs it under `prlimit LIMITS`.
    SIGXFSZ is ignored so that a file-size limit shows as a failed write
    (EFBIG, after a short write), as a full disk does, instead of killing it."""
    wrapper = tmp_path / "limited-proxy"
    wrapper.write_text(f"#!/bin/sh\ntrap '' XFSZ\nexec prlimit {limits} {proxy_binary()} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture
def proxied(request, tmp_path, monkeypatch):
    """An echo server behind the proxy; parametrized indirectly, the proxy runs under those prlimit limits."""
    if limits := getattr(request, "param", None):
        monkeypatch.setenv("DASKPROBE_PROXY", str(limited(tmp_path, limits)))
    echo = Echo()
    listen = f"127.0.0.1:{free_port()}"
    capture = tmp_path / "proxy.bin"
    proc = start_proxy(capture, [Route(listen, f"127.0.0.1:{echo.port}", "worker-0")], tmp_path / "proxy.log")
    yield echo, int(listen.split(":")[1]), capture, proc
    stop_proxy(proc)


def frame_message(frames: list[bytes]) -> bytes:
    """Dask's current framing: u64 nosplit | u64 nframes | u64 lens | frames."""
    n = len(frames)
    prelude = struct.pack(f"<Q{n}Q", n, *map(len, frames))
    return struct.pack("<Q", len(prelude) + len(frames[0])) + prelude + b"".join(frames)


def send_chunked(port: int, payload: bytes, rng: random.Random) -> str:
    """Send payload in random-sized writes; return the hash of what comes back."""
    got = hashlib.sha256()
    received = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        def reader():
            nonlocal received
            while received < len(payload):
                data = s.recv(1 << 20)
                if not data:
                    break
                got.update(data)
                received += len(data)
        t = threading.Thread(target=reader)
        t.start()
        pos = 0
        while pos < len(payload):
            n = rng.choice([1, 7, 100, 4096, 65536, 3 << 20])
            s.sendall(payload[pos:pos + n])
            pos += n
        t.join(60)
        s.shutdown(socket.SHUT_WR)
    assert received == len(payload)
    return got.hexdigest()


def reset(port: int) -> None:
    """Connect, then close with SO_LINGER 0: the proxy gets a reset, not an end of stream."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)  # a full backlog costs SYN retries of 1 s, then 3 s
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def still_serves(port: int, seed: int) -> None:
    """A message with a 100 kB payload comes back through the proxy unchanged."""
    payload = frame_message([msgpack.packb({"op": "still-there"}), random.Random(seed).randbytes(100_000)])
    assert send_chunked(port, payload, random.Random(seed)) == hashlib.sha256(payload).hexdigest()


def accounted(capture: Path) -> int:
    """Connections the capture knows of: opened, or lost before they could be."""
    cap = read_capture(capture)
    return len(cap.connections) + len(cap.lost)


def listen_drops() -> int:
    """Connections the kernel dropped from full accept queues, machine-wide (TcpExt ListenDrops)."""
    head, values = [ln.split() for ln in Path("/proc/net/netstat").read_text().splitlines()[:2]]
    return int(dict(zip(head, values))["ListenDrops"])


def wait_for(predicate, timeout=60.0):
    """Wait for what the proxy does in its own time (its writer drains every 100 ms): generously, as a
    busy machine may run it late; only never is a failure."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_bytes_forwarded_unchanged_and_framing_recorded(proxied):
    echo, port, capture, _ = proxied
    rng = random.Random(1)
    big = rng.randbytes(1 << 20) * 65 + b"tail"  # a frame above 64 MiB
    msgs = [frame_message([msgpack.packb({"op": "compute-task", "key": f"k{i}"}), rng.randbytes(i * 1000)])
            for i in range(20)]
    msgs.append(frame_message([msgpack.packb({"op": "big"}), msgpack.packb({"serializer": "pickle"}), big]))
    payload = b"".join(msgs)
    sent = hashlib.sha256(payload).hexdigest()
    assert send_chunked(port, payload, rng) == sent
    wait_for(lambda: echo.hashes)
    assert echo.hashes == [sent]
    wait_for(lambda: len(read_capture(capture).messages) == 2 * len(msgs))
    cap = read_capture(capture)
    assert cap.malformed.empty
    to_upstream = cap.messages[cap.messages.direction == 0]
    assert to_upstream.msg_bytes.sum() == len(payload)
    header = msgpack.packb({"serializer": "pickle"})
    assert cap.frame_lens(to_upstream["at"].iloc[-1]) == [len(msgpack.packb({"op": "big"})), len(header), len(big)]
    kept = [cap.frames(at) for at in to_upstream["at"]]
    assert msgpack.unpackb(kept[3][0]) == {"op": "compute-task", "key": "k3"}
    assert set(kept[-1]) == {0, 1}, "frame 0 and the msgpack sub-header kept, the payload only sized"


def test_malformed_stream_is_forwarded_and_logged(proxied):
    echo, port, capture, proc = proxied
    rng = random.Random(2)
    payload = frame_message([msgpack.packb({"op": "ok"})]) + b"\xff" * 5000 + rng.randbytes(10000)
    assert send_chunked(port, payload, rng) == hashlib.sha256(payload).hexdigest()
    wait_for(lambda: len(read_capture(capture).malformed) == 2)  # the echo returns the garbage too
    assert proc.poll() is None, "the proxy survives"
    again = frame_message([msgpack.packb({"op": "after"})])
    assert send_chunked(port, again, rng) == hashlib.sha256(again).hexdigest()


class Trap:
    """Unpickling this creates a file: proof that something unpickled it."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def built(tmp_path: Path, capture: Path) -> Path:
    """A run directory holding only this capture, after `daskprobe build`."""
    run = tmp_path / "run"
    (run / "captures").mkdir(parents=True)
    (run / "captures" / "proxy.bin").write_bytes(capture.read_bytes())
    (run / "run.json").write_text(json.dumps({"clock_anchor": {"monotonic_ns": 0, "wall_ns": 0},
                                              "processes": []}))
    p = daskprobe("build", str(run))
    assert p.returncode == 0, p.stderr
    return run


def test_captured_pickles_are_never_unpickled(proxied, tmp_path):
    echo, port, capture, proc = proxied
    trap = tmp_path / "unpickled"
    bomb = pickle.dumps(Trap(trap))
    frame0 = msgpack.packb({"op": "task-finished", "key": "x", "type": bomb, "run_id": 0,
                            "run_spec": {"__Pickled__": 1}, "startstops": []}, use_bin_type=True)
    payload = frame_message([frame0, msgpack.packb({"serializer": "pickle"}), bomb])
    assert send_chunked(port, payload, random.Random(3)) == hashlib.sha256(payload).hexdigest()
    wait_for(lambda: len(read_capture(capture).messages) == 2)
    stop_proxy(proc)
    run = built(tmp_path, capture)
    assert not trap.exists()
    import pandas as pd
    m = pd.read_parquet(run / "tables" / "messages.parquet")
    assert list(m[m.direction == 0].op) == ["task-finished"] and not trap.exists()


def all_stopped(pid: int) -> bool:
    tasks = Path(f"/proc/{pid}/task")
    return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks.iterdir())


def test_peers_that_reset_are_counted_lost_and_the_route_serves_on(proxied, tmp_path):
    echo, port, capture, proc = proxied
    # Stopped, the proxy accepts nothing: all 50 reset while waiting to be
    # accepted, as on a busy machine. Running, it would accept some first and
    # serve them as ordinary (empty) connections.
    os.kill(proc.pid, signal.SIGSTOP)
    wait_for(lambda: all_stopped(proc.pid))  # a stop is delivered asynchronously, thread by thread
    for _ in range(50):
        reset(port)
    os.kill(proc.pid, signal.SIGCONT)
    still_serves(port, 4)
    wait_for(lambda: accounted(capture) == 51)
    cap = read_capture(capture)
    assert len(cap.lost) == 50 and cap.lost.reason.str.startswith("peer gone").all()
    assert cap.lost.t_ns.gt(0).all()
    assert proc.poll() is None
    stop_proxy(proc)
    run = built(tmp_path, capture)
    assert json.loads((run / "run.json").read_text())["capture"]["lost_connections"] == 50


@pytest.mark.parametrize("proxied", ["--nofile=64"], indirect=True)
def test_route_serves_on_after_running_out_of_fds(proxied, tmp_path):
    echo, port, capture, proc = proxied
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]  # ~4 proxy fds each
    time.sleep(0.5)
    before = cpu_s(proc.pid)
    time.sleep(1)
    assert cpu_s(proc.pid) - before < 0.2, "the proxy spins while out of fds"
    for s in held:
        s.close()
    # the proxy frees their fds as each pump sees its end; a connection before that could find none left
    wait_for(lambda: len(os.listdir(f"/proc/{proc.pid}/fd")) < 32)
    still_serves(port, 5)
    wait_for(lambda: accounted(capture) == 41)
    assert "Too many open files" in (tmp_path / "proxy.log").read_text()


def test_route_serves_on_after_ten_thousand_resets(proxied):
    echo, port, capture, proc = proxied
    cpu, start, dropped = cpu_s(proc.pid), time.monotonic(), listen_drops()
    for _ in range(10_000):
        reset(port)
    busy, wall = cpu_s(proc.pid) - cpu, time.monotonic() - start
    time.sleep(0.5)
    before = cpu_s(proc.pid)
    time.sleep(1)
    idle = cpu_s(proc.pid) - before
    still_serves(port, 6)
    # A connection the kernel dropped from a full accept queue was reset before any accept could
    # see it: the kernel counts it (ListenDrops), and only it may be missing.
    dropped = listen_drops() - dropped
    wait_for(lambda: 10_001 - dropped <= accounted(capture) <= 10_001, timeout=60)
    print(f"10,000 resets: {wall:.1f} s, proxy CPU {busy:.2f} s, then {idle:.2f} s in 1 s idle")
    assert busy < 5.0, "over 0.5 ms of proxy CPU per connection"
    assert idle < 0.1, "the proxy spins after the resets"


@pytest.mark.parametrize("proxied", ["--fsize=20000"], indirect=True)
def test_capture_write_error_stops_capturing_not_forwarding(proxied, tmp_path):
    echo, port, capture, proc = proxied
    log = tmp_path / "proxy.log"
    still_serves(port, 7)
    wait_for(lambda: len(read_capture(capture).messages) == 2)  # on disk before the limit
    fill = b"".join(frame_message([msgpack.packb({"op": "fill", "i": i})]) for i in range(2000))
    for seed in (8, 9):  # the second: after the capture has stopped
        assert send_chunked(port, fill, random.Random(seed)) == hashlib.sha256(fill).hexdigest()
        wait_for(lambda: "capture stopped" in log.read_text())
    assert log.read_text().count("capture stopped") == 1
    cap = read_capture(capture)
    assert cap.torn_bytes == 0 and len(cap.messages) >= 2 and capture.stat().st_size <= 20000
    assert proc.poll() is None


def test_connections_still_open_when_the_proxy_stops_are_recorded_closed_with_their_bytes(proxied):
    echo, port, capture, proc = proxied
    payload = frame_message([msgpack.packb({"op": "heartbeat"}), b"x" * 100_000])
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(payload)
    got = 0
    while got < len(payload):  # echoed back: both directions forwarded it all
        got += len(s.recv(1 << 20))
    # and recorded it: a pump thread counts what it forwarded just after the write that the peer may
    # already have read
    wait_for(lambda: len(read_capture(capture).messages) == 2)
    assert stop_proxy(proc) == [] and proc.returncode == 0, "it stopped by itself, when its stdin ended"
    s.close()
    c = read_capture(capture).connections.iloc[0]
    assert c.bytes_to_upstream == c.bytes_from_upstream == len(payload) and c.closed_ns > c.opened_ns
