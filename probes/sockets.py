"""This host's TCP sockets, from the kernel's tables (/proc/net/tcp and tcp6, of this network
namespace), and the processes that hold them. Reading them makes no connection, so nothing of
it shows up in a server's logs or in a capture. And the one reading of an address."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import NamedTuple

LISTEN = "0A"


def split_address(address: str) -> tuple[str, int]:
    """A Dask address ('tcp://host:port', or 'host:port'; an IPv6 host in brackets) -> (its host,
    without brackets; its port)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    return host.strip("[]"), int(port)


def host_of(address: str) -> str:
    return address.split("://", 1)[-1].rpartition(":")[0].strip("[]")


def listen_of(address: str) -> str:
    """'host:port' as the taps and the socket tables write it (an IPv6 host in brackets)."""
    return address.split("://", 1)[-1]


class Socket(NamedTuple):
    local: str   # 'ip:port', an IPv6 address in brackets
    state: str   # the kernel's, in hex: 0A listening, 01 established
    inode: int


def _address(hex_addr: str) -> str:
    ip, port = hex_addr.split(":")
    raw = bytes.fromhex(ip)
    # each 32-bit word is in the host's (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(raw)
    if addr.version == 6 and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return f"{addr}:{int(port, 16)}" if addr.version == 4 else f"[{addr}]:{int(port, 16)}"


def tcp_sockets() -> list[Socket]:
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        out += [Socket(_address(cols[1]), cols[3], int(cols[9])) for cols in map(str.split, lines)]
    return out


def listening(port: int) -> set[int]:
    """The inodes of the sockets listening on a port (any address)."""
    return {s.inode for s in tcp_sockets() if s.state == LISTEN and s.local.rsplit(":", 1)[1] == str(port)}


def inodes_of(pid: int) -> set[int]:
    """The inodes of the sockets a process holds (none once it is gone)."""
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


def owned_by(pids: list[int]) -> dict[str, int]:
    """The local address ('ip:port') of every TCP socket these processes hold, and whose it is:
    what tells apart several processes' connections from one host."""
    owner = {inode: pid for pid in pids for inode in inodes_of(pid)}
    return {s.local: owner[s.inode] for s in tcp_sockets() if s.inode in owner and s.state != LISTEN}
