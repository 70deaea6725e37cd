"""The comm tap: a preload of the cluster's processes (loaded by file path, so any interpreter can use it)
that records the messages Dask's comms read and write, in the capture format of the proxy and the packet
tap (probes/capture_records.py), where neither can read them: tcp:// and tls:// (TLS), ws:// and wss://
(websockets), ucx:// and ucxx:// (distributed-ucxx, where installed) and inproc:// (no bytes at all).
Each message is taken as its frames, the plaintext the comm carries: their lengths, and frame 0 and small
msgpack sub-headers kept as the proxy keeps them (payload frames counted only). How each backend's
messages are timed, its _tap_* function says.

Only the accepting end of a connection records its messages, as the proxy fronts the listener: each
message is recorded once when every member loads this. The connecting end records only that it opened
the connection (an `open` labelled "connect", with the accepting end's two addresses), from which
daskprobe names the peer's pid when it merges the processes' files (probes/comm_capture.py).

The event loop only appends a record to a deque; a thread writes them to DIR/comm-PID.bin every
FLUSH_S, and at exit. DIR/comm-PID.bin.status says whether every record was written."""

import atexit
import collections
import contextlib
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


class _Tap:
    """What the backends' hooks share: the connections' numbers, the message the current task is reading
    or writing (a context variable each: a comm is used by one task at a time), and the records."""

    def __init__(self, records, writer: _Writer):
        self.records, self.writer, self.ids = records, writer, itertools.count(1)
        self.reading = contextvars.ContextVar("daskprobe_comm_tap_read", default=None)
        self.writing = contextvars.ContextVar("daskprobe_comm_tap_write", default=None)
        self.accepted = []  # (comm class, its ends (listen, peer), what is told its number) per backend

    def opened(self, label: str, listen: str, peer: str) -> int:
        conn = next(self.ids)
        self.writer.pending.append(self.records.record(
            self.records.OPEN, conn=conn, opened_ns=time.monotonic_ns(), label=label, listen=_bare(listen),
            peer_addr=_bare(peer), upstream=_bare(listen), upstream_local=""))
        return conn

    def message(self, conn: int, direction: int, t_first: int, frames, t_last: int = 0) -> None:
        """Append the record of a message of these frames (bytes, most of them; else buffers)."""
        records = self.records
        t_last = t_last or time.monotonic_ns()
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
        self.writer.pending.append(records.message_record(conn, direction, 1, truncated, t_first or t_last, t_last,
                                                          lens, kept))

    def accepts(self, comm_class, ends, numbered=None) -> None:
        """Record the connections a listener accepts as comms of this class; ends(comm): (listen, peer);
        numbered(comm, conn), if given, told each one's number."""
        self.accepted.append((comm_class, ends, numbered))

    def connects(self, connector_class, ends) -> None:
        """Record that a connector of this class opened a connection (ends(comm): the (listen, peer) its
        accepting end records), from which the merge names the pid at the other end."""
        connect = connector_class.connect

        async def connect_tapped(self_, address, *args, **kwargs):
            comm = await connect(self_, address, *args, **kwargs)
            with contextlib.suppress(Exception):  # ends unknown (closed meanwhile): the peer stays unnamed
                self.opened(CONNECT, *ends(comm))
            return comm

        connector_class.connect = connect_tapped

    def reads_and_writes(self, comm_class) -> None:
        """Mark the current task's reads and writes on an accepted comm of this class (the backend's hooks
        take the frames); on any other comm, its own methods as they are."""
        read, write, reading, writing = comm_class.read, comm_class.write, self.reading, self.writing

        def read_tapped(comm, *args, **kwargs):
            conn = getattr(comm, "_daskprobe_conn", None)
            return read(comm, *args, **kwargs) if conn is None else read_recorded(comm, conn, args, kwargs)

        async def read_recorded(comm, conn, args, kwargs):
            token = reading.set([conn, 0, comm])
            try:
                return await read(comm, *args, **kwargs)
            finally:
                reading.reset(token)

        def write_tapped(comm, *args, **kwargs):
            conn = getattr(comm, "_daskprobe_conn", None)
            return write(comm, *args, **kwargs) if conn is None else write_recorded(comm, conn, args, kwargs)

        async def write_recorded(comm, conn, args, kwargs):
            state = [None, 0]
            token = writing.set(state)
            try:
                n = await write(comm, *args, **kwargs)
            finally:
                writing.reset(token)
            if state[0] is not None:
                self.message(conn, 1, state[1], state[0])
            return n

        comm_class.read, comm_class.write = read_tapped, write_tapped

    def frames_written(self, frames) -> None:
        """The frames of the message the current task writes, as they go to the comm."""
        state = self.writing.get()
        if state is not None:
            state[0], state[1] = frames, time.monotonic_ns()

    def to_frames(self, module) -> None:
        """`module` turns a message into frames with distributed's to_frames: see them come out."""
        to_frames = module.to_frames

        async def to_frames_tapped(*args, **kwargs):
            frames = await to_frames(*args, **kwargs)
            self.frames_written(frames)
            return frames

        module.to_frames = to_frames_tapped

    def from_frames(self, module, times=None) -> None:
        """`module` makes a message of the frames it read with distributed's from_frames: record them.
        times(state, frames): the message's first and last byte in (default: the first stamped by the
        backend's hooks in state[1], the last now)."""
        from_frames, reading = module.from_frames, self.reading

        # hands back the coroutine it wraps, awaited by the caller: no frame of its own to resume
        def from_frames_tapped(frames, *args, **kwargs):
            state = reading.get()
            if state is not None:
                first, last = times(state, frames) if times else (max(state[1], 0), 0)
                self.message(state[0], 0, first, frames, last)
                state[1] = 0
            return from_frames(frames, *args, **kwargs)

        module.from_frames = from_frames_tapped

    def listeners(self) -> None:
        from distributed.comm import core
        on_connection, accepted = core.Listener.on_connection, self.accepted

        async def on_connection_tapped(listener, comm, *args, **kwargs):
            for comm_class, ends, numbered in accepted:
                if isinstance(comm, comm_class):
                    comm._daskprobe_conn = self.opened(ACCEPT, *ends(comm))
                    if numbered:
                        numbered(comm, comm._daskprobe_conn)
                    break
            return await on_connection(listener, comm, *args, **kwargs)

        core.Listener.on_connection = on_connection_tapped


def _bare(address: str) -> str:
    return address.partition("://")[2] or address


def _socket_ends(sock, accepted: bool) -> tuple[str, str]:
    """(listen, peer) of a connection's socket: at the accepting end its own address and the peer's; at
    the connecting end the other way round."""
    from distributed.comm.addressing import unparse_host_port
    ours, theirs = (unparse_host_port(*a[:2]) for a in (sock.getsockname(), sock.getpeername()))
    return (ours, theirs) if accepted else (theirs, ours)


def _tap_tcp(tap: _Tap) -> None:
    """tcp:// and tls://: a message read is timed from its 8-byte size in to its last byte read; one
    written, from its frames going to the stream to the write's return (Tornado has then sent what the
    socket took)."""
    from distributed.comm import tcp
    tap.accepts(tcp.TCP, lambda comm: (comm.local_address, comm.peer_address))
    tap.connects(tcp.BaseTCPConnector, lambda comm: (comm.peer_address, comm.local_address))
    tap.reads_and_writes(tcp.TCP)
    read_bytes_rw, add_header, reading = tcp.read_bytes_rw, tcp._add_frames_header, tap.reading

    # hands back the coroutine it wraps: no frame of its own to resume
    def read_bytes_rw_tapped(stream, n):
        state = reading.get()
        if state is not None and not state[1]:
            state[1] = time.monotonic_ns()  # the message's 8-byte size has just come in
        return read_bytes_rw(stream, n)

    def add_header_tapped(frames):
        tap.frames_written(frames)
        return add_header(frames)

    tcp.read_bytes_rw, tcp._add_frames_header = read_bytes_rw_tapped, add_header_tapped
    tap.from_frames(tcp)


def _tap_ws(tap: _Tap) -> None:
    """ws:// and wss:// (Tornado's websockets, a websocket message per frame after one holding their
    count): a message read is timed from the arrival of its count to that of its last frame (stamped as
    Tornado hands each on); one written, from its frames going to the websocket to the writes' return."""
    from distributed.comm import ws
    open_, on_message = ws.WSHandler.open, ws.WSHandler.on_message

    # Stamped from the first: a client's first message may come in before the listener hears of the comm.
    def open_tapped(handler, *args, **kwargs):
        handler._daskprobe_arrivals = collections.deque()
        return open_(handler, *args, **kwargs)

    def on_message_tapped(handler, msg):
        arrivals = getattr(handler, "_daskprobe_arrivals", None)
        if arrivals is not None:
            arrivals.append(time.monotonic_ns())
        return on_message(handler, msg)

    def arrived(state, frames) -> tuple[int, int]:
        arrivals, now = getattr(state[2].handler, "_daskprobe_arrivals", None), time.monotonic_ns()
        if arrivals is None or len(arrivals) < len(frames) + 1:
            return now, now
        first = arrivals.popleft()
        for _ in range(len(frames) - 1):
            arrivals.popleft()
        return first, arrivals.popleft() if frames else first

    ws.WSHandler.open, ws.WSHandler.on_message = open_tapped, on_message_tapped
    tap.accepts(ws.WSHandlerComm, lambda comm: _socket_ends(comm.handler.ws_connection.stream.socket, True))
    tap.connects(ws.WSConnector, lambda comm: _socket_ends(comm.sock.stream.socket, False))
    tap.reads_and_writes(ws.WSHandlerComm)
    tap.from_frames(ws, arrived)
    tap.to_frames(ws)


def _tap_ucx(tap: _Tap) -> None:
    """ucx:// and ucxx:// where distributed-ucxx is installed: a message read is timed from its header in
    (the count of its frames) to its last frame in; one written, from its frames going to the endpoint to
    the sends' return. Its two ends are paired by the tags the endpoints exchanged (UCX has no socket
    addresses to pair them by)."""
    try:
        from distributed_ucxx import ucxx
    except ImportError:
        return
    host_array, reading = ucxx.host_array, tap.reading

    def host_array_tapped(n):
        state = reading.get()
        # A read's first buffer (the frame count) is made before it waits, its second once the count came in
        if state is not None and state[1] <= 0:
            state[1] = time.monotonic_ns() if state[1] else -1
        return host_array(n)

    def tags(comm, accepted: bool) -> tuple[str, str]:
        t = comm._ep._tags
        # as an address whose port is 0: the readers of a connection's ends parse host:port
        return (comm.local_address if accepted else comm.peer_address,
                f"ucx-tag-{t['msg_send'] if accepted else t['msg_recv']:x}:0")

    tap.accepts(ucxx.UCXX, lambda comm: tags(comm, True))
    tap.connects(ucxx.UCXXConnector, lambda comm: tags(comm, False))
    tap.reads_and_writes(ucxx.UCXX)
    ucxx.host_array = host_array_tapped
    tap.from_frames(ucxx)
    tap.to_frames(ucxx)


def _tap_inproc(tap: _Tap) -> None:
    """inproc:// (a LocalCluster(processes=False) and its client, one process: messages are objects put on
    queues, never bytes). Both directions are timed from the sender's write to the receiver's read: the hop
    between event loops. The record holds the message as Dask would frame it: frame 0 its msgpack (what
    the decoder reads) with each payload a placeholder, and each payload's size as dask.sizeof estimates
    it (nothing is serialized: the sizes are not bytes sent)."""
    import msgpack
    from dask.sizeof import sizeof
    from distributed.comm import inproc
    write, deserialize = inproc.InProc.write, inproc._nested_deserialize
    reading = contextvars.ContextVar("daskprobe_comm_tap_inproc", default=None)

    def sent(q) -> collections.deque:
        """When each message on the queue was written, oldest first (one writer per queue)."""
        return q.__dict__.get("_daskprobe_sent") or q.__dict__.setdefault("_daskprobe_sent", collections.deque())

    async def write_tapped(comm, msg, *args, **kwargs):
        # stamped first: the reader, on another thread, may take the message before write returns
        times = sent(comm._write_q) if comm._write_q is not None else None
        if times is not None:
            times.append(time.monotonic_ns())
        try:
            return await write(comm, msg, *args, **kwargs)
        except BaseException:
            if times:
                times.pop()
            raise

    # Every read pops its message's stamp, so stamps and messages stay in step; it is recorded if its queue
    # is tagged by then (a connecting end may wait on its queue before the accepting end heard of it).
    def read_tapped(comm, *args, **kwargs):
        return read(comm, *args, **kwargs) if comm._read_q is None else read_stamped(comm, args, kwargs)

    async def read_stamped(comm, args, kwargs):
        token = reading.set(comm._read_q)
        try:
            return await read(comm, *args, **kwargs)
        finally:
            reading.reset(token)

    def deserialize_tapped(msg, *args, **kwargs):
        q = reading.get()
        if q is not None:
            now, times = time.monotonic_ns(), sent(q)
            t_first, tag = times.popleft() if times else now, getattr(q, "_daskprobe", None)
            if tag is not None:
                head, sizes = _inproc_frames(msg, msgpack, sizeof)
                tap.writer.pending.append(tap.records.message_record(
                    *tag, 1, int(len(head) > tap.records.KEEP_CAP), t_first, now, [len(head), *sizes],
                    [(0, head[:tap.records.KEEP_CAP])] if head else []))
        return deserialize(msg, *args, **kwargs)

    def numbered(comm, conn: int) -> None:  # its queues say which connection and way their messages go
        comm._read_q._daskprobe, comm._write_q._daskprobe = (conn, 0), (conn, 1)

    read = inproc.InProc.read
    inproc.InProc.write, inproc.InProc.read, inproc._nested_deserialize = write_tapped, read_tapped, \
        deserialize_tapped
    tap.accepts(inproc.InProc, lambda comm: (comm.local_address, comm.peer_address), numbered)
    tap.connects(inproc.InProcConnector, lambda comm: (comm.peer_address, comm.local_address))


def _inproc_frames(msg, msgpack, sizeof) -> tuple[bytes, list[int]]:
    """A message object as Dask frames it: frame 0 (msgpack, its payloads placeholders as Dask's
    {"__Serialized__": i}, sets as Dask's {"__Set__": ...}) and each payload's estimated size."""
    sizes = []

    def default(obj):
        if isinstance(obj, (set, frozenset)):
            return {"__Set__": True, "as-list": list(obj)}
        sizes.append(sizeof(getattr(obj, "data", obj)))
        return {"__Serialized__": len(sizes) - 1}

    try:
        return msgpack.packb(msg, default=default, use_bin_type=True), sizes
    except Exception:  # noqa: BLE001 - what msgpack cannot walk (a cycle, a huge int): counted, not decoded
        return b"", sizes


def _install(records, writer: _Writer) -> None:
    tap = _Tap(records, writer)
    for backend in (_tap_tcp, _tap_ws, _tap_ucx, _tap_inproc):
        backend(tap)
    tap.listeners()


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
