"""`daskprobe open`: serve a run's trace.pftrace on loopback for the Perfetto UI.

The hosted UI (ui.perfetto.dev) may fetch a local trace only from
http://127.0.0.1:9001 (its content-security policy allowlists that origin),
and only with a CORS header naming the UI: so this port, not a random one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import webbrowser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

UI = "https://ui.perfetto.dev"
PERFETTO_PORT = 9001


def link(port: int) -> str:
    return f"{UI}/#!/?url=http://127.0.0.1:{port}/trace.pftrace"


CHUNK = 1 << 20  # bytes sent at a time: the trace is never read whole into memory


def make_handler(trace: Path, served: list, request_s: float = 10.0):
    """request_s: seconds a connection has to send its whole request. Each read and write also times
    out after it: a peer that says nothing, or reads nothing, cannot hold its thread."""
    class Handler(BaseHTTPRequestHandler):
        timeout = request_s

        def setup(self):
            super().setup()
            # a peer that sends a byte now and then satisfies every read's timeout: its whole request
            # has a deadline, past which its connection is shut (the read waiting on it returns empty)
            self._late, self._deadline = False, threading.Timer(request_s, self._cut)
            self._deadline.daemon = True
            self._deadline.start()

        def _cut(self):
            self._late = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def parse_request(self) -> bool:
            whole = super().parse_request()  # reads the headers
            self._deadline.cancel()  # the request is read; the answer's writes have the timeout
            return whole and not self._late

        def finish(self):
            self._deadline.cancel()
            super().finish()

        def _headers(self, code: int, length: int = 0) -> None:
            self.send_response(code)
            self.send_header("Access-Control-Allow-Origin", UI)
            self.send_header("Access-Control-Allow-Methods", "GET, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "*")
            self.send_header("Cache-Control", "no-cache")
            if code == 200:
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(length))
            self.end_headers()

        def _foreign(self) -> bool:
            """A Host other than our own loopback address: a page that rebinds its DNS
            name to 127.0.0.1 must not read the trace."""
            port = self.server.server_address[1]
            if self.headers.get("Host") in (f"127.0.0.1:{port}", f"localhost:{port}"):
                return False
            self._headers(403)
            return True

        def do_OPTIONS(self):  # CORS preflight
            if not self._foreign():
                self._headers(204)

        def do_GET(self):
            if self._foreign():
                return
            if self.path.split("?")[0] != "/trace.pftrace":
                self._headers(404)
                return
            with open(trace, "rb") as f:  # the file as opened: a build that replaces it meanwhile changes nothing
                size = os.fstat(f.fileno()).st_size
                self._headers(200, size)
                while size > 0 and (chunk := f.read(min(CHUNK, size))):
                    self.wfile.write(chunk)
                    size -= len(chunk)
            served.append(self.path)

        def log_message(self, *args):
            pass

    return Handler


def serve(trace: Path, port: int = PERFETTO_PORT, once: bool = False) -> int:
    served: list = []
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(trace, served))
    except OSError as e:
        print(f"daskprobe: cannot listen on 127.0.0.1:{port} ({e.strerror}); the Perfetto UI fetches local "
              f"traces only from port {PERFETTO_PORT}: stop what holds it, or open {trace} in the UI by hand",
              flush=True)
        return 1
    server.timeout = 0.5  # handle_request returns this often: requests are served in threads, so
    # --once learns that the trace was fetched only after the request that fetched it has returned
    url = link(server.server_address[1])
    print(f"serving {trace} for the Perfetto UI; open:\n{url}", flush=True)
    if os.environ.get("DISPLAY") or os.environ.get("BROWSER"):
        webbrowser.open(url)
    try:
        while not (once and served):
            server.handle_request()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
