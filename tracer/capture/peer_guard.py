"""Preload of every process of a cluster daskprobe starts (loaded by file path, so any interpreter can
use it): its TCP listeners (tcp://, tls://, ws://) accept only connections opened by the users in
DASKPROBE_ALLOW_UIDS (the cluster's own, and root's proxy in front of it), and a ws:// listener listens
on its host only. Dask has no authentication of its own but TLS, and a
Dask server runs code for whoever connects: without this any local user could run code as the
cluster's user. Which user opened a loopback connection, the kernel says (sock_diag, as `ss`); a
connection it cannot place (another host's, or closed meanwhile) is refused."""

import contextvars
import os
import socket
import struct
import sys

ALLOWED = {int(u) for u in os.environ.get("DASKPROBE_ALLOW_UIDS", "").split(",") if u.strip().isdigit()}

_SOCK_DIAG_BY_FAMILY = 20
_NETLINK_SOCK_DIAG = 4
# struct inet_diag_msg after the 16-byte nlmsghdr: family, state, timer, retrans (4 bytes), the 48-byte
# sockid, then expires, rqueue, wqueue, uid, inode.
_UID_AT = 16 + 4 + 48 + 12


def _words(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")


def opener_uid(sock: socket.socket):
    """The uid of the process that opened the connection `sock` accepted, or None."""
    family = sock.family
    peer, ours = sock.getpeername()[:2], sock.getsockname()[:2]
    # inet_diag_req_v2: family, protocol, ext, pad, states; then the sockid as the opener sees it
    sockid = struct.pack("!HH", peer[1], ours[1]) + _words(family, peer[0]) + _words(family, ours[0]) \
        + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    request = struct.pack("=IHHII", 16 + len(body), _SOCK_DIAG_BY_FAMILY, 1, 1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.send(request)
        reply = nl.recv(512)
    if len(reply) < _UID_AT + 4 or struct.unpack_from("=H", reply, 4)[0] != _SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR: no such socket
    return struct.unpack_from("=I", reply, _UID_AT)[0]


def allowed(sock: socket.socket) -> bool:
    try:
        return opener_uid(sock) in ALLOWED
    except (OSError, ValueError, struct.error):
        return False


def _guard(listener_class) -> None:
    handle = listener_class._handle_stream
    if getattr(handle, "guarded", False):  # imported again (Dask loads a preload file once per server)
        return

    async def _handle_stream(self, stream, address):
        if not allowed(stream.socket):
            print(f"daskprobe: refused a connection from {address}: not opened by the cluster's user",
                  file=sys.stderr)
            stream.close()
            return
        return await handle(self, stream, address)

    _handle_stream.guarded = True
    listener_class._handle_stream = _handle_stream


def _guard_ws(ws) -> None:
    """ws:// is an HTTP server's websockets: an upgrade asked on a connection another user opened is
    refused before Dask hears of it. And distributed's WSListener.start gives Tornado no address, so it
    listens on every interface whatever host it was given: bound to that host here."""
    get, start = ws.WSHandler.get, ws.WSListener.start
    if getattr(get, "guarded", False):
        return
    host = contextvars.ContextVar("daskprobe_ws_host", default="")

    async def get_guarded(handler, *args, **kwargs):
        if not allowed(handler.request.connection.stream.socket):
            print(f"daskprobe: refused a connection from {handler.request.remote_ip}: not opened by the "
                  "cluster's user", file=sys.stderr)
            handler.set_status(403)
            return handler.finish()
        return await get(handler, *args, **kwargs)

    class BoundServer(ws.HTTPServer):
        def listen(self, port, address=None, **kwargs):
            return super().listen(port, host.get() if address is None else address, **kwargs)

    async def start_bound(listener):
        token = host.set(listener.ip or "")
        try:
            return await start(listener)
        finally:
            host.reset(token)

    get_guarded.guarded = True
    ws.WSHandler.get, ws.WSListener.start, ws.HTTPServer = get_guarded, start_bound, BoundServer


if ALLOWED:
    from distributed.comm import tcp, ws

    _guard(tcp.BaseTCPListener)
    _guard_ws(ws)


def dask_setup(server):
    """Nothing to do once the server exists: the listeners were guarded when this file was imported."""
