"""The comm tap: a preload of the cluster's processes (loaded by file path, so any interpreter can use it)
that records the messages Dask's TCP comms (tcp:// and tls://, which subclasses it) read and write, in
the capture format of the proxy and the packet tap (probes/capture_records.py), where neither can read
them (TLS). Each message is taken as its frames, the plaintext the stream carries after Dask's framing
header: their lengths, and frame 0 and small msgpack sub-headers kept as the proxy keeps them (payload
frames counted only).

Only the accepting end of a connection records its messages, as the proxy fronts the listener: each
message is recorded once when every member loads this. A message it reads is timed from the first
read of its frames (its 8-byte size already in) to its last byte read; one it writes, from when its
frames go to the stream to when the write returned (Tornado has then sent what the socket took). The
connecting end records only that it opened the connection (an `open` labelled "connect"), from
which daskprobe names the peer's pid when it merges the processes' files (probes/comm_capture.py).

The event loop only appends a record to a deque; a thread writes them to DIR/comm-PID.bin every
FLUSH_S, and at exit. DIR/comm-PID.bin.status says whether every record was written."""

import atexit
import collections
import contextvars
import importlib.util
import itertools
import os
import sys
import threading
import time
from pathlib import Path

DIR = os.environ.get("DASKPROBE_COMM_TAP_DIR")
FLUSH_S = 0.2
ACCEPT, CONNECT = "accept", "connect"


def _load_records():
    path = os.environ.get("DASKPROBE_CAPTURE_RECORDS") or str(Path(__file__).with_name("capture_records.py"))
    spec = importlib.util.spec_from_file_location("daskprobe_capture_records", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Writer:
    """Records appended by any thread, written by one."""

    def __init__(self, path: str, status_len: int):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.fd = os.open(path, flags | os.O_APPEND, 0o600)
        self.status = os.open(path + ".status", flags, 0o600)
        self.status_len, self.written, self.failed = status_len, 0, None
        self.pending = collections.deque()
        self.lock = threading.Lock()
        self._status("capturing")
        threading.Thread(target=self._run, name="daskprobe-comm-tap", daemon=True).start()
        atexit.register(self.close)
        # a nanny's worker is a multiprocessing child, which ends by os._exit once its finalizers ran: no atexit
        import multiprocessing.util
        multiprocessing.util.Finalize(None, self.close, exitpriority=0)

    def _status(self, state: str, reason: str = "-") -> None:
        line = f"{state} {time.monotonic_ns()} {self.written} {reason}".encode()[:self.status_len - 1]
        os.pwrite(self.status, line.ljust(self.status_len - 1) + b"\n", 0)

    def _run(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            self.flush()

    def flush(self) -> None:
        with self.lock:
            chunk = []
            while self.pending:
                chunk.append(self.pending.popleft())
            if not chunk or self.failed:
                return
            data = b"".join(chunk)
            try:
                while data:
                    n = os.write(self.fd, data)
                    self.written, data = self.written + n, data[n:]
            except OSError as e:
                self.failed = e.strerror or str(e)
                self._status("stopped", self.failed.replace(" ", "_"))

    def close(self) -> None:
        self.flush()
        if not self.failed:
            self._status("ended")


def _install(records, writer: _Writer) -> None:
    from distributed.comm import core, tcp

    ids = itertools.count(1)
    reading = contextvars.ContextVar("daskprobe_comm_tap_read", default=None)
    writing = contextvars.ContextVar("daskprobe_comm_tap_write", default=None)

    def bare(address: str) -> str:
        return address.partition("://")[2] or address

    def opened(label: str, listen: str, peer: str) -> int:
        conn = next(ids)
        writer.pending.append(records.record(records.OPEN, conn=conn, opened_ns=time.monotonic_ns(), label=label,
                                             listen=bare(listen), peer_addr=bare(peer), upstream=bare(listen),
                                             upstream_local=""))
        return conn

    def message(conn: int, direction: int, t_first: int, frames) -> None:
        """Append the record of a message of these frames (bytes, most of them; else buffers)."""
        t_last = time.monotonic_ns()
        lens = [len(f) if type(f) is bytes else memoryview(f).nbytes for f in frames]
        kept, room, truncated = [], records.KEEP_CAP, 0
        for i, (f, n) in enumerate(zip(frames, lens)):
            if not n or (i and n > records.SUBHEADER_MAX):
                continue
            if type(f) is not bytes:
                f = memoryview(f)
                if not f.c_contiguous:
                    continue
                f = f.cast("B") if f.format != "B" or f.ndim != 1 else f
            if i == 0 or records.is_msgpack_map(f[0]):
                kept.append((i, bytes(f[:room])))
                room, truncated = room - len(kept[-1][1]), truncated | (len(kept[-1][1]) < n)
        writer.pending.append(records.message_record(conn, direction, 1, truncated, t_first or t_last, t_last,
                                                     lens, kept))

    on_connection = core.Listener.on_connection

    async def on_connection_tapped(self, comm, *args, **kwargs):
        if isinstance(comm, tcp.TCP):
            comm._daskprobe_conn = opened(ACCEPT, comm.local_address, comm.peer_address)
        return await on_connection(self, comm, *args, **kwargs)

    connect = tcp.BaseTCPConnector.connect

    async def connect_tapped(self, address, *args, **kwargs):
        comm = await connect(self, address, *args, **kwargs)
        opened(CONNECT, comm.peer_address, comm.local_address)
        return comm

    read, write = tcp.TCP.read, tcp.TCP.write

    def read_tapped(self, deserializers=None):
        conn = getattr(self, "_daskprobe_conn", None)
        return read(self, deserializers) if conn is None else read_recorded(self, conn, deserializers)

    async def read_recorded(self, conn, deserializers):
        token = reading.set([conn, 0])
        try:
            return await read(self, deserializers)
        finally:
            reading.reset(token)

    def write_tapped(self, msg, serializers=None, on_error="message"):
        conn = getattr(self, "_daskprobe_conn", None)
        return write(self, msg, serializers, on_error) if conn is None else \
            write_recorded(self, conn, msg, serializers, on_error)

    async def write_recorded(self, conn, msg, serializers, on_error):
        state = [None, 0]
        token = writing.set(state)
        try:
            n = await write(self, msg, serializers, on_error)
        finally:
            writing.reset(token)
        if state[0] is not None:
            message(conn, 1, state[1], state[0])
        return n

    read_bytes_rw, from_frames, add_header = tcp.read_bytes_rw, tcp.from_frames, tcp._add_frames_header

    # These two hand back the coroutine they wrap, awaited by the caller: no frame of their own to resume.
    def read_bytes_rw_tapped(stream, n):
        state = reading.get()
        if state is not None and not state[1]:
            state[1] = time.monotonic_ns()  # the message's 8-byte size has just come in
        return read_bytes_rw(stream, n)

    def from_frames_tapped(frames, *args, **kwargs):
        state = reading.get()
        if state is not None:
            message(state[0], 0, state[1], frames)
            state[1] = 0
        return from_frames(frames, *args, **kwargs)

    def add_header_tapped(frames):
        state = writing.get()
        if state is not None:
            state[0], state[1] = frames, time.monotonic_ns()
        return add_header(frames)

    core.Listener.on_connection = on_connection_tapped
    tcp.BaseTCPConnector.connect = connect_tapped
    tcp.TCP.read, tcp.TCP.write = read_tapped, write_tapped
    tcp.read_bytes_rw, tcp.from_frames, tcp._add_frames_header = read_bytes_rw_tapped, from_frames_tapped, \
        add_header_tapped


def _start() -> None:
    from distributed.comm import tcp
    if DIR and not getattr(tcp.TCP.read, "daskprobe_tapped", False):  # Dask may load a preload once per server
        records = _load_records()
        try:
            writer = _Writer(os.path.join(DIR, f"comm-{os.getpid()}.bin"), records.STATUS_LEN)
        except OSError as e:
            print(f"daskprobe: comm tap off: {e}", file=sys.stderr)
            return
        _install(records, writer)
        tcp.TCP.read.daskprobe_tapped = True


_start()


def dask_setup(server):
    """Nothing to do once the server exists: the comms were tapped when this file was imported."""
