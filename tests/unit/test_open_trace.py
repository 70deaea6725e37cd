"""`daskprobe open`'s server: a peer that drips its request cannot hold a connection, the trace is
sent in chunks (never read whole into memory), and only our own Host is served."""

import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from daskprobe.dashboards.open_trace import make_handler


@pytest.fixture
def serving(tmp_path):
    def start(trace, request_s=2.0):
        server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(trace, [], request_s))
        # polled every 50 ms: shutdown() waits for the next poll (0.5 s by default, at each test's end)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/trace.pftrace", server.server_address[1]
    servers = []
    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _closed(s: socket.socket) -> bool:
    try:
        s.sendall(b"X")
        s.setblocking(False)
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset or broken pipe: closed too
        return True
    finally:
        s.setblocking(True)


def test_a_peer_dripping_its_request_is_cut_off_and_others_are_served_meanwhile(tmp_path, serving):
    trace = tmp_path / "trace.pftrace"
    trace.write_bytes(b"trace")
    url, port = serving(trace, request_s=0.5)
    drip = socket.create_connection(("127.0.0.1", port))
    drip.sendall(b"GET /trace.pftrace HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-A: " % port)
    began = time.monotonic()
    while not _closed(drip):  # a byte each time (every 0.1 s or so): every read gets one within its timeout
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.read() == b"trace", "served while the dripping peer is connected"
        assert time.monotonic() - began < 30, "the dripping peer still holds its connection after 30 s"
        time.sleep(0.1)
    assert time.monotonic() - began >= 0.4, "cut before its deadline"
    drip.close()


def test_the_trace_is_sent_in_chunks_not_read_whole(tmp_path, serving):
    trace = tmp_path / "trace.pftrace"
    with open(trace, "wb") as f:  # sparse: 64 MiB on disk costs nothing
        f.truncate(64 << 20)
    url, _ = serving(trace, request_s=30.0)
    tracemalloc.start()
    try:
        got = 0
        with urllib.request.urlopen(url, timeout=60) as r:
            assert int(r.headers["Content-Length"]) == 64 << 20
            while chunk := r.read(1 << 20):
                got += len(chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == 64 << 20
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB allocated at once to serve a 64 MiB trace"


def test_only_our_own_host_is_served(tmp_path, serving):
    trace = tmp_path / "trace.pftrace"
    trace.write_bytes(b"trace")
    url, port = serving(trace)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url, headers={"Host": f"evil.example:{port}"}), timeout=30)
    assert e.value.code == 403
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Host": f"localhost:{port}"}), timeout=30) as r:
        assert r.read() == b"trace"
