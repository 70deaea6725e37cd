"""Which local process an attached cluster's member is, verified before root profiles it. The
scheduler's list of workers is not evidence: anyone who can reach a scheduler can register a
worker at any address (or run the scheduler), and root would then read the stacks of whatever
listens there (sshd, a database) into the run's captures. A member is a process of this host that

- alone holds a socket listening at the member's address (its IP, or a wildcard, and port): the
  kernel's socket table and /proc/PID/fd say who holds it, no cluster input;
- answers Dask's `identity` at that address, over tracer/capture/rpc.py (msgpack only), as what the
  scheduler says it is: the scheduler (the address the user gave, already asked), or a worker
  whose own scheduler is ours (same port, same host). A service that is not a Dask server cannot
  answer so; a Dask worker of another cluster names another scheduler. A process that does is a
  Dask worker of this cluster, or one its owner made up to pose as one: profiling it shows that
  owner nothing that is not theirs.
"""

from __future__ import annotations

import os
import re
import socket

from ...probes.sockets import LISTEN, inodes_of, split_address, tcp_sockets
from . import rpc

ADDRESS = re.compile(r"(tcp|tls)://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}")  # a member's, as we accept it
ASK_S = 5.0  # a worker answers identity from its event loop: a task holding the GIL delays it


def holders(address: str) -> set[int]:
    """The pids holding a socket that listens at this address (its IP or a wildcard, its port)."""
    host, port = split_address(address)
    ips = _ips(host) | {"0.0.0.0", "::"}
    wanted = {s.inode for s in tcp_sockets()
              if s.state == LISTEN and s.local.rsplit(":", 1)[1] == str(port)
              and s.local.rsplit(":", 1)[0].strip("[]") in ips}
    if not wanted:
        return set()
    return {int(pid) for pid in filter(str.isdigit, os.listdir("/proc")) if wanted & inodes_of(int(pid))}


def verify(address: str, role: str, scheduler: str) -> tuple[int | None, str | None]:
    """(the member's pid, None) once verified; else (None, why not)."""
    pids = holders(address)
    if not pids:
        return None, "no process of this host listens at its address (another user's, or not readable)"
    if len(pids) > 1:
        return None, f"{len(pids)} processes hold the socket listening at its address: which one is it?"
    if role != "scheduler":  # the scheduler answered identity at the user's address already
        why = _not_our_worker(address, scheduler)
        if why:
            return None, why
    return pids.pop(), None


def _not_our_worker(address: str, scheduler: str) -> str | None:
    try:
        said = rpc.ask(address, "identity", ASK_S)
    except (OSError, RuntimeError) as e:
        return f"it did not answer Dask's identity ({type(e).__name__}: {str(e)[:200]})"
    theirs = said.get("scheduler") if isinstance(said, dict) else None
    if not isinstance(theirs, str) or said.get("type") == "Scheduler":
        return "it does not answer as a Dask worker"
    if not _same_server(theirs, scheduler):
        return f"it is a Dask worker of another scheduler ({theirs[:200]})"
    return None


def _same_server(a: str, b: str) -> bool:
    """Two addresses of one listener: the same port, at hosts that resolve to a shared IP, or both
    this host's (a worker may name the scheduler by another of its addresses)."""
    try:
        (ha, pa), (hb, pb) = split_address(a), split_address(b)
    except ValueError:
        return False
    if pa != pb:
        return False
    ia, ib = _ips(ha), _ips(hb)
    return bool(ia & ib) or bool(ia and ib and all(map(on_this_host, ia | ib)))


def _ips(host: str) -> set[str]:
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError):
        return set()


def on_this_host(host: str) -> bool:
    """The address is one of this host's (in this network namespace): only a local address can be
    bound. A member elsewhere may listen on a port that a process here listens on too."""
    try:
        family = socket.getaddrinfo(host, 0, type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
        return True
    except (OSError, UnicodeError):
        return False
