"""One request to a Dask server, msgpack only: what root asks a cluster it attaches to. Dask's own
rpc unpickles `__Pickled__` and `__Serialized__` sub-frames of a reply, so any server (or anyone
who can reach it) could run code in the asker: this speaks Dask's TCP framing itself, decodes
frame 0 with msgpack and no object hook (probes/wire.py), reads no more than MAX_FRAME0 of it,
and drops every other frame unread. A pickled field stays the plain map `{"__Pickled__": i}`.

    u64 nosplit | u64 nframes | u64 len[i]... | frames     (native order, docs/formats.md)
"""

from __future__ import annotations

import socket
import ssl
import struct
import sys
import time

import msgpack

from ...probes.sockets import split_address
from ...probes.wire import Undecodable, decode_frame0

MAX_FRAMES = 4096  # Dask splits a message into one frame per serialized part: a reply we ask for has few
MAX_FRAME0 = 64 << 20  # the msgpack part (a scheduler with 10,000 workers: ~20 MiB of identity)
MAX_MESSAGE = 256 << 20  # all frames; the others are read past, never kept
_U64 = struct.Struct("<Q")


class NotDask(RuntimeError):
    """The peer's bytes are not Dask's framing (another protocol, or made up), or too big."""


def ask(address: str, op: str, timeout: float = 10.0, **kwargs):
    """The reply to one op (a msgpack object: dicts, tuples, str, bytes, numbers), within
    `timeout` s in all. OSError if it cannot be reached or does not answer in time; NotDask if what
    it says is not Dask's; RuntimeError if it answered with an error."""
    with Connection(address, timeout) as c:
        return c.ask(op, timeout, **kwargs)


class Connection:
    """A comm to a Dask server kept for several requests, answered in order as on Dask's own pooled
    comms. A recorder that asks every few seconds asks on one: the tap then finds the process behind it,
    daskprobe, while it lives (a connection per question closed before the tap could look, and its
    questions were taken for a client's)."""

    def __init__(self, address: str, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        self.socket = _connect(address, timeout)
        try:
            _write(self.socket, {"compression": None, "python": tuple(sys.version_info)[:3], "pickle-protocol": 5})
            hello = _read(self.socket, deadline, timeout)
            if not isinstance(hello, dict) or "compression" not in hello:
                raise NotDask("its handshake is not Dask's")
        except BaseException:
            self.socket.close()
            raise

    def ask(self, op: str, timeout: float = 10.0, **kwargs):
        _write(self.socket, {"op": op, "reply": True, **kwargs})
        reply = _read(self.socket, time.monotonic() + timeout, timeout)
        if isinstance(reply, dict) and reply.get("status") == "uncaught-error":
            said = reply.get("text")
            raise RuntimeError(f"it answered {op} with an error: {said[:300] if isinstance(said, str) else '(unreadable)'}")
        return reply

    def close(self) -> None:
        self.socket.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _connect(address: str, timeout: float) -> socket.socket:
    scheme = address.split("://", 1)[0] if "://" in address else "tcp"
    if scheme not in ("tcp", "tls"):
        raise NotDask(f"{scheme}:// is not a TCP comm")
    host, port = split_address(address)
    context = _tls_context() if scheme == "tls" else None  # before connecting: a config error says so first
    s = socket.create_connection((host, port), timeout=timeout)
    if context is None:
        return s
    try:
        return context.wrap_socket(s)  # Dask's client context checks the certificate, not the host name
    except BaseException:
        s.close()
        raise


def _tls_context() -> ssl.SSLContext:
    """The client context Dask would use, from its config (distributed.comm.tls.*); building it
    reads only local files, nothing from the cluster."""
    from distributed.security import Security
    context = Security().get_connection_args("client").get("ssl_context")
    if context is None:
        raise RuntimeError("tls:// needs Dask's TLS credentials: set distributed.comm.tls.ca-file and "
                           "distributed.comm.tls.client.cert/key (or DASK_DISTRIBUTED__COMM__TLS__*)")
    return context


def _write(s: socket.socket, msg) -> None:
    frame = msgpack.packb(msg, use_bin_type=True)
    prelude = _U64.pack(1) + _U64.pack(len(frame))
    s.sendall(_U64.pack(len(prelude) + len(frame)) + prelude + frame)


def _read(s: socket.socket, deadline: float, timeout: float):
    """One message: frame 0 decoded, the rest read past."""
    nosplit, nframes = _U64.unpack(_exactly(s, 8, deadline, timeout)), _U64.unpack(_exactly(s, 8, deadline, timeout))
    nosplit, nframes = nosplit[0], nframes[0]
    if not 1 <= nframes <= MAX_FRAMES:
        raise NotDask(f"a message of {nframes} frames")
    lengths = struct.unpack(f"<{nframes}Q", _exactly(s, 8 * nframes, deadline, timeout))
    total = 8 + 8 * nframes + sum(lengths)
    if lengths[0] > MAX_FRAME0 or total > MAX_MESSAGE or not 8 + 8 * nframes <= nosplit <= total:
        raise NotDask(f"a message of {total} bytes ({lengths[0]} in its frame 0), or framed as no Dask message is")
    frame0 = _exactly(s, lengths[0], deadline, timeout)
    for length in lengths[1:]:  # sub-frames: pickles, serialized data: read past, never looked at
        while length:
            length -= len(_exactly(s, min(length, 1 << 20), deadline, timeout))
    try:
        return decode_frame0(frame0)
    except Undecodable as e:
        raise NotDask(f"its frame 0 is not msgpack ({e})") from None


def _exactly(s: socket.socket, n: int, deadline: float, timeout: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {timeout:g} s")
        s.settimeout(left)
        try:
            got = s.recv(min(n - len(buf), 1 << 20))
        except socket.timeout:
            raise TimeoutError(f"no answer within {timeout:g} s") from None
        if not got:
            raise ConnectionError("it closed the connection")
        buf += got
    return bytes(buf)
