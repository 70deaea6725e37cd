"""The proxy alone, between real sockets: bytes unchanged, framing recorded,
bad peers survived, and nothing captured ever unpickled."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import socket
import struct
import threading
import time
from pathlib import Path

import msgpack
import pytest

from conftest import daskprobe
from daskprobe.probes.proxy import Route, start_proxy
from daskprobe.probes.proxy_capture import read_capture
from daskprobe.tracer.cluster import free_port
from daskprobe.probes.procs import stop


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


@pytest.fixture
def proxied(tmp_path):
    echo = Echo()
    listen = f"127.0.0.1:{free_port()}"
    capture = tmp_path / "proxy.bin"
    proc = start_proxy(capture, [Route(listen, f"127.0.0.1:{echo.port}", "worker-0")], tmp_path / "proxy.log")
    yield echo, int(listen.split(":")[1]), capture, proc
    stop([proc])


def frame_message(frames: list[bytes]) -> bytes:
    """Dask's current framing: u64 nosplit | u64 nframes | u64 lens | frames."""
    n = len(frames)
    prelude = struct.pack(f"<Q{n}Q", n, *map(len, frames))
    return struct.pack("<Q", len(prelude) + len(frames[0])) + prelude + b"".join(frames)


def send_chunked(port: int, payload: bytes, rng: random.Random) -> str:
    """Send payload in random-sized writes; return the hash of what comes back."""
    got = hashlib.sha256()
    received = 0
    with socket.create_connection(("127.0.0.1", port)) as s:
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


def wait_for(predicate, timeout=10.0):
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


def test_captured_pickles_are_never_unpickled(proxied, tmp_path):
    echo, port, capture, proc = proxied
    trap = tmp_path / "unpickled"
    bomb = pickle.dumps(Trap(trap))
    frame0 = msgpack.packb({"op": "task-finished", "key": "x", "type": bomb, "run_id": 0,
                            "run_spec": {"__Pickled__": 1}, "startstops": []}, use_bin_type=True)
    payload = frame_message([frame0, msgpack.packb({"serializer": "pickle"}), bomb])
    assert send_chunked(port, payload, random.Random(3)) == hashlib.sha256(payload).hexdigest()
    wait_for(lambda: len(read_capture(capture).messages) == 2)
    stop([proc])
    run = tmp_path / "run"
    (run / "captures").mkdir(parents=True)
    (run / "captures" / "proxy.bin").write_bytes(capture.read_bytes())
    (run / "run.json").write_text(json.dumps({"clock_anchor": {"monotonic_ns": 0, "wall_ns": 0},
                                              "processes": []}))
    p = daskprobe("build", str(run))
    assert p.returncode == 0, p.stderr
    assert not trap.exists()
    import pandas as pd
    m = pd.read_parquet(run / "tables" / "messages.parquet")
    assert list(m[m.direction == 0].op) == ["task-finished"] and not trap.exists()
