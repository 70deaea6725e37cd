"""The comm tap's files (probes/comm_tap.py: one per cluster process, in a directory of the cluster's
user) merged into one capture of the proxy's format (captures/comm.bin), read by root as data only:
each file opened under a directory opened without following links, a regular file of that user's, at
most MAX_BYTES read; records are walked by their length, nothing in them is run or unpickled.

Connections are numbered anew over all files. An accepting end's `open` is kept, labelled with the
member whose pid wrote the file; a connecting end's (label "connect") names the pid at the other end
of the accepted connection with the same two addresses (a `peer` record), and is dropped."""

from __future__ import annotations

import os
import re
import stat
import struct
import time
from pathlib import Path

from .capture_records import HEAD, MESSAGE, OPEN, PEER, STATUS_LEN, WITH_CONN, record
from .proxy_capture import _FIXED, _decode

MAX_BYTES = 1 << 30  # per file
MAX_FILES = 4096
NAME = re.compile(r"comm-(\d+)\.bin")
_CONN = struct.Struct("<I")
_MESSAGE = _FIXED[MESSAGE][1]  # conn, direction, framing, truncated, t_first_ns, ...


def merge(src: Path, dest: Path, uid: int | None, names: dict[int, str], since_ns: int = 0,
          live: bool = False) -> list[str]:
    """Merge the comm tap's files in `src` (a directory of the cluster's user, `uid`; None: the
    directory's owner) into `dest`, with `dest`.status; `names`: member name by pid; messages whose
    first byte came before `since_ns` left out (an attached recording's start). `live`: the writers
    still run (an attached cluster goes on), so 'capturing' is their status, not a loss. What was
    refused, cut or lost ("NAME: why")."""
    said, files = [], []
    try:
        dir_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        return [f"{src}: {e.strerror}"]
    try:
        uid = os.fstat(dir_fd).st_uid if uid is None else uid
        found = sorted(n for n in os.listdir(dir_fd) if NAME.fullmatch(n))
        said += [f"{len(found) - MAX_FILES} more files: not read"] if len(found) > MAX_FILES else []
        for name in found[:MAX_FILES]:
            data, why = _read(dir_fd, name, uid, MAX_BYTES)
            status, _ = _read(dir_fd, name + ".status", uid, STATUS_LEN)
            state = status.decode("utf-8", "replace").split(" ")[0] if status else "missing"
            if why:
                said.append(f"{name}: {why}")
            if state != "ended" and not (live and state == "capturing"):
                said.append(f"{name}: its writer's status is {state!r} (records after its last write may be lost)")
            files.append((int(NAME.fullmatch(name)[1]), data))
    finally:
        os.close(dir_fd)
    _write(dest, _merged(files, names, since_ns), said)
    return said


def _read(dir_fd: int, name: str, uid: int, cap: int) -> tuple[bytes, str | None]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        return b"", e.strerror
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return b"", "not a regular file of the cluster's user: not read"
        with open(fd, "rb", closefd=False) as f:
            data = f.read(cap)
        return data, f"cut at {cap} bytes" if st.st_size > cap else None
    finally:
        os.close(fd)


def _records(data: bytes):
    """(kind, start, end of body) of each whole record; a torn last one is left out."""
    pos = 0
    while pos + HEAD.size <= len(data):
        length, kind = HEAD.unpack_from(data, pos)
        end = pos + 4 + length
        if length < 1 or end > len(data):
            return
        yield kind, pos + HEAD.size, end
        pos = end


def _merged(files: list[tuple[int, bytes]], names: dict[int, str], since_ns: int) -> list[bytes]:
    opens, rest, connects, numbers = [], [], {}, {}
    for pid, data in files:
        for kind, body, end in _records(data):
            try:
                _take(pid, data, kind, body, end, since_ns, opens, rest, connects, numbers)
            except (struct.error, UnicodeError):  # written short: the cluster's user may write anything there
                continue
    out = []
    for conn, pid, r in opens:
        out.append(record(OPEN, **(r | {"conn": conn, "label": names.get(pid, f"pid {pid}"),
                                        "upstream_local": r["upstream_local"] or ""})))
        out.append(record(PEER, conn=conn, peer_pid=connects.get((r["listen"], r["peer_addr"]), -1)))
    return out + rest


def _take(pid, data, kind, body, end, since_ns, opens, rest, connects, numbers) -> None:
    """One record of pid's file into the merge: an accepting end's open numbered anew, a connecting
    end's remembered, a record of a known connection renumbered (a message before since_ns left out)."""
    if kind not in WITH_CONN or end - body < 4:
        return
    key = (pid, _CONN.unpack_from(data, body)[0])
    if kind == OPEN:
        r = _decode(OPEN, data, body, end)
        if None in (r["label"], r["listen"], r["peer_addr"], r["upstream"]):
            return
        if r["label"] == "connect":
            connects[(r["listen"], r["peer_addr"])] = pid
        else:
            numbers[key] = len(numbers) + 1
            opens.append((numbers[key], pid, r))
    elif kind == MESSAGE and (not _whole_message(data, body, end) or _MESSAGE.unpack_from(data, body)[4] < since_ns):
        return
    elif key in numbers:
        rest.append(data[body - HEAD.size:body] + _CONN.pack(numbers[key]) + data[body + 4:end])


def _whole_message(data: bytes, body: int, end: int) -> bool:
    """A message record whose frame lengths and kept frames fill it exactly: what the reader can walk."""
    n = _MESSAGE.unpack_from(data, body)[-1]
    pos = body + _MESSAGE.size + 8 * n
    if pos + 4 > end:
        return False
    (k,) = _CONN.unpack_from(data, pos)
    pos += 4
    for _ in range(k):
        if pos + 8 > end:
            return False
        pos += 8 + _CONN.unpack_from(data, pos + 4)[0]
    return pos == end


def _write(dest: Path, records: list[bytes], said: list[str]) -> None:
    from .rundir import open_new
    with open_new(dest) as f:
        f.write(b"".join(records))
    state, reason = ("stopped", "; ".join(said)) if said else ("ended", "-")
    line = f"{state} {time.monotonic_ns()} {dest.stat().st_size} {reason}".encode()[:STATUS_LEN - 1]
    with open_new(Path(f"{dest}.status")) as f:
        f.write(line.ljust(STATUS_LEN - 1) + b"\n")
