"""tracer/capture/rpc.py against made-up servers: what root reads of a Dask server's reply, and no more."""

import pickle
import socket
import struct
import threading
import time

import msgpack
import pytest

from daskprobe.tracer.capture import rpc


class Boom:
    def __reduce__(self):
        return (pytest.fail, ("the reply's pickle was loaded",))


def serve(reply: bytes, hello: bool = True, hold: float = 3) -> str:
    """A server that answers every connection with Dask's handshake (unless not `hello`), then `reply`,
    and closes it `hold` s later."""
    server = socket.create_server(("127.0.0.1", 0))

    def run():
        with server:
            conn, _ = server.accept()
            with conn:
                if hello:
                    conn.sendall(message({"compression": None, "python": (3, 11, 7), "pickle-protocol": 5}))
                conn.sendall(reply)
                time.sleep(hold)
    threading.Thread(target=run, daemon=True).start()
    return f"tcp://127.0.0.1:{server.getsockname()[1]}"


def message(msg, *extra: bytes, lengths=None) -> bytes:
    frames = [msgpack.packb(msg, use_bin_type=True), *extra]
    lengths = lengths or [len(f) for f in frames]
    prelude = struct.pack(f"<Q{len(lengths)}Q", len(lengths), *lengths)
    return struct.pack("<Q", len(prelude) + sum(map(len, frames))) + prelude + b"".join(frames)


def test_a_pickled_field_stays_an_opaque_map():
    sub = msgpack.packb({"pickled-obj": pickle.dumps(Boom()), "num-sub-frames": 0})
    got = rpc.ask(serve(message({"type": "Scheduler", "x": {"__Pickled__": 1}}, sub)), "identity", 5)
    assert got == {"type": "Scheduler", "x": {"__Pickled__": 1}}


@pytest.mark.parametrize("lengths", [[rpc.MAX_FRAME0 + 1], [10, rpc.MAX_MESSAGE], [1] * (rpc.MAX_FRAMES + 1)])
def test_a_message_past_its_caps_is_refused_before_it_is_read(lengths):
    with pytest.raises(rpc.NotDask):
        rpc.ask(serve(message({"op": 1}, lengths=lengths)), "identity", 5)


def test_another_protocol_is_not_dask_and_a_silent_server_times_out():
    with pytest.raises(rpc.NotDask):
        rpc.ask(serve(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n" * 4, hello=False), "identity", 5)
    # a deadline of 0.2 s against a server silent for a minute: ended by the deadline, not the server,
    # however long a busy machine keeps this thread off a CPU
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        rpc.ask(serve(b"", hello=False, hold=60), "identity", 0.2)
    assert time.monotonic() - start < 30
