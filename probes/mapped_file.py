"""The files a traced process maps, as root reads them (the eBPF agent: GIL and libc symbols).
Stdlib only: the agent imports it as a sibling, under Debian's python3.

A path in /proc/PID/maps is the cluster's: by the time root opens it, it may be a symlink (to
/dev/zero, to a root-only file), a FIFO (an open that never returns) or a huge sparse file. So a
mapped file is opened as the mapping itself, through /proc/PID/map_files/START-END (the very file
the process maps, whatever its path names now); where the kernel has no map_files, by its path
under the process's root with no symlink followed, and only if it is the device and inode the maps
line has. Either way first as O_PATH (no FIFO waits, no device's open runs), then for reading only
if it is a regular file of at most MAX_FILE_BYTES. Nothing reads a whole file: the ELF's headers
and the tables wanted, each at most MAX_TABLE_BYTES.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
from typing import NamedTuple

MAX_FILE_BYTES = 1 << 30  # the largest shared libraries (a browser's, 150 MB) fit several times
MAX_TABLE_BYTES = 64 << 20  # an ELF table read whole (libc's dynamic symbols: 60 KB)
# start end perms offset dev inode path, of a file or the vDSO
MAPPING = re.compile(r"([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) ([0-9a-f]+:[0-9a-f]+) (\d+) +(/[^\n]*|\[vdso\])")


class Mapping(NamedTuple):
    start: str  # hex, as maps and map_files name it
    end: str
    perms: str
    offset: str
    dev: str  # MAJOR:MINOR, hex
    inode: str
    path: str


class NotRead(Exception):
    """Why a mapped file was not read."""


def mappings(pid: int) -> list[Mapping]:
    """The process's file mappings and its vDSO, as /proc/PID/maps has them."""
    with open(f"/proc/{pid}/maps") as f:
        return [Mapping(*m.groups()) for m in map(MAPPING.match, f) if m]


def first(pid: int, pattern: str) -> Mapping | None:
    """The first mapping whose path matches `pattern`."""
    return next((m for m in mappings(pid) if re.search(pattern, m.path)), None)


def _device(dev: str) -> int:
    major, minor = dev.split(":")
    return os.makedev(int(major, 16), int(minor, 16))


def _under_root(pid: int, path: str) -> int:
    """`path` in the process's root, each component opened with O_NOFOLLOW from the one before
    (maps paths are canonical: a "." or ".." is refused), the last as O_PATH."""
    parts = path.split("/")[1:]
    if not path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise NotRead("not a canonical path")
    fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC | (0 if last else os.O_DIRECTORY)
            try:
                fd, before = os.open(part, flags, dir_fd=fd), fd
            except OSError as e:
                if e.errno in (errno.ENOTDIR, errno.ELOOP):  # what O_NOFOLLOW makes of a symlink
                    raise NotRead("a symlink (or a file where a directory was) in its path") from None
                raise
            os.close(before)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_mapped(pid: int, m: Mapping) -> int:
    """A descriptor, for reading, of the file the mapping maps; NotRead if a check fails, OSError if
    the process is gone."""
    try:
        fd = os.open(f"/proc/{pid}/map_files/{m.start}-{m.end}", os.O_PATH | os.O_CLOEXEC)
        by_path = False
    except FileNotFoundError:
        if not os.path.isdir(f"/proc/{pid}"):
            raise
        fd, by_path = _under_root(pid, m.path.removesuffix(" (deleted)")), True  # no map_files in this kernel
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            raise NotRead("a symlink")
        if not stat.S_ISREG(st.st_mode):
            raise NotRead("not a regular file")
        if by_path and (st.st_dev, st.st_ino) != (_device(m.dev), int(m.inode)):
            raise NotRead("not the file the process maps (another device or inode)")
        if st.st_size > MAX_FILE_BYTES:
            raise NotRead(f"{st.st_size} bytes, over the {MAX_FILE_BYTES}-byte cap")
        # reopened through our own descriptor: the file just checked, whatever its path names now
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(fd)


def fd_path(fd: int) -> str:
    """A path to an open file for what takes a path (bcc): it names that file and no other."""
    return f"/proc/self/fd/{fd}"


def _read(fd: int, offset: int, size: int, what: str) -> bytes:
    if size > MAX_TABLE_BYTES:
        raise NotRead(f"its {what} is {size} bytes, over the {MAX_TABLE_BYTES}-byte cap")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise NotRead(f"its {what} ends past the file's end")
    return data


def default_version(fd: int, name: str) -> int | None:
    """The address of `name`'s default version (name@@VERSION) in an ELF file's dynamic symbols.
    glibc keeps old versions of some functions (pthread_cond_timedwait@GLIBC_2.2.5) beside the one
    programs link to, and without debug symbols bcc names both alike. Reads the ELF header, the
    section headers and the dynamic symbols, their names and versions: nothing else."""
    head = os.pread(fd, 64, 0)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:  # 64-bit little-endian only
        return None
    shoff, (shentsize, shnum) = struct.unpack_from("<Q", head, 0x28)[0], struct.unpack_from("<HH", head, 0x3A)
    if shentsize < 64:
        return None
    table = _read(fd, shoff, shentsize * shnum, "section header table")
    # (type, offset, size, link) of each section
    sections = [struct.unpack_from("<4xI16xQQI", table, i * shentsize) for i in range(shnum)]
    dynsym = next((sec for sec in sections if sec[0] == 11), None)  # SHT_DYNSYM
    versym = next((sec for sec in sections if sec[0] == 0x6FFFFFFF), None)  # SHT_GNU_versym
    if dynsym is None or dynsym[3] >= shnum:
        return None
    symbols = _read(fd, dynsym[1], dynsym[2], "dynamic symbol table")
    strtab = sections[dynsym[3]]
    names = _read(fd, strtab[1], strtab[2], "dynamic string table")
    versions = _read(fd, versym[1], versym[2], "symbol version table") if versym else b""
    wanted = name.encode() + b"\0"
    for i in range(len(symbols) // 24):
        st_name, st_value = struct.unpack_from("<I4xQ", symbols, 24 * i)
        hidden = 2 * i + 2 <= len(versions) and struct.unpack_from("<H", versions, 2 * i)[0] & 0x8000
        if st_value and not hidden and names[st_name:st_name + len(wanted)] == wanted:
            return st_value
    return None
