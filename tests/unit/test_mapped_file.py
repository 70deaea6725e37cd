"""The eBPF agent's reading of a mapped file (probes/mapped_file.py): by path, where the kernel has no
/proc/PID/map_files, no symlink is followed and only the device and inode the maps line has are
read; an ELF's tables are read only within their caps, never the whole file."""

import mmap
import os
import struct

import pytest

from daskprobe.probes import mapped_file
from daskprobe.probes.mapped_file import Mapping, NotRead, default_version, open_mapped


def mapping_of(path, pid: int = None) -> Mapping:
    """The maps line of `path` in this process (mapped here for it)."""
    return next(m for m in mapped_file.mappings(pid or os.getpid()) if m.path == str(path))


@pytest.fixture
def by_path(monkeypatch):
    """open_mapped as on a kernel without map_files: every map_files open finds nothing."""
    real = os.open

    def no_map_files(path, *a, **kw):
        if "/map_files/" in str(path):
            raise FileNotFoundError(path)
        return real(path, *a, **kw)
    monkeypatch.setattr(mapped_file.os, "open", no_map_files)


@pytest.mark.parametrize("through", ["map_files", "path"])
def test_the_file_mapped_is_read_and_no_other(tmp_path, request, through):
    if through == "path":
        request.getfixturevalue("by_path")
    lib = tmp_path / "libc.so.6"
    lib.write_bytes(b"\x7fELF" + bytes(4092))
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ):
        m = mapping_of(lib)
        fd = open_mapped(os.getpid(), m)
        assert os.pread(fd, 4, 0) == b"\x7fELF"
        os.close(fd)
        # the path now names a symlink to /dev/zero, and then another file: map_files still reads the
        # file mapped; by path, neither is read
        lib.rename(tmp_path / "moved")
        os.symlink("/dev/zero", lib)
        if through == "path":
            with pytest.raises(NotRead, match="symlink"):
                open_mapped(os.getpid(), m)
        else:
            fd = open_mapped(os.getpid(), m)
            assert os.pread(fd, 4, 0) == b"\x7fELF"
            os.close(fd)
        lib.unlink()
        lib.write_bytes(b"\x7fELF other")
        if through == "path":
            with pytest.raises(NotRead, match="another device or inode"):
                open_mapped(os.getpid(), m)
        lib.unlink()
        os.mkfifo(lib)
        if through == "path":  # opened as O_PATH: no wait for a writer
            with pytest.raises(NotRead, match="not a regular file"):
                open_mapped(os.getpid(), m)


def test_a_directory_on_the_way_that_became_a_symlink_is_not_followed(tmp_path, by_path):
    (tmp_path / "d").mkdir()
    lib = tmp_path / "d" / "lib.so"
    lib.write_bytes(bytes(4096))
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ):
        m = mapping_of(lib)
        (tmp_path / "d").rename(tmp_path / "e")
        os.symlink(tmp_path / "e", tmp_path / "d")
        with pytest.raises(NotRead, match="symlink"):
            open_mapped(os.getpid(), m._replace(path=str(lib)))


def test_a_file_over_the_cap_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(mapped_file, "MAX_FILE_BYTES", 8192)
    lib = tmp_path / "libc.so.6"
    with open(lib, "wb") as f:
        f.truncate(8193)
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ):
        with pytest.raises(NotRead, match="8193 bytes, over the 8192-byte cap"):
            open_mapped(os.getpid(), mapping_of(lib))


def elf_with_dynsym(size: int) -> bytes:
    """A 64-bit ELF header and two section headers: none, and a dynamic symbol table of `size` bytes."""
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", head, 0x28, 64)  # section headers right after
    struct.pack_into("<HH", head, 0x3A, 64, 2)
    dynsym = bytearray(64)
    struct.pack_into("<I", dynsym, 4, 11)  # SHT_DYNSYM
    struct.pack_into("<QQI", dynsym, 24, 192, size, 0)
    return bytes(head) + bytes(64) + bytes(dynsym)


def test_a_table_over_its_cap_or_past_the_end_is_not_read(tmp_path):
    path = tmp_path / "elf"
    path.write_bytes(elf_with_dynsym(mapped_file.MAX_TABLE_BYTES + 24))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(NotRead, match="dynamic symbol table is .* over the"):
            default_version(fd, "pthread_cond_timedwait")
        path.write_bytes(elf_with_dynsym(24 * 1000))
        with pytest.raises(NotRead, match="past the file's end"):
            default_version(fd, "pthread_cond_timedwait")
    finally:
        os.close(fd)
