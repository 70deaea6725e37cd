"""Offsets of kernel struct members, from the running kernel's BTF (/sys/kernel/btf/vmlinux).

bcc compiles against whatever kernel headers are installed, which need not be the
running kernel's (Debian's newest stand in where a kernel ships none), so a struct
the BPF program reads by hand is placed from the kernel's own type information.
Stdlib only: the eBPF agent imports it as a sibling. Format: the kernel's
Documentation/bpf/btf.rst.
"""

import struct

VMLINUX = "/sys/kernel/btf/vmlinux"
STRUCT, UNION = 4, 5
# bytes that follow each kind's 12-byte header, by kind, from its vlen
TAIL = {1: lambda n: 4, 3: lambda n: 12, 4: lambda n: 12 * n, 5: lambda n: 12 * n, 6: lambda n: 8 * n,
        13: lambda n: 8 * n, 14: lambda n: 4, 15: lambda n: 12 * n, 17: lambda n: 4, 19: lambda n: 12 * n}


class Btf:
    def __init__(self, path: str = VMLINUX):
        with open(path, "rb") as f:
            self.data = data = f.read()
        magic, _, _, hdr_len, type_off, type_len, str_off, _ = struct.unpack_from("<HBBIIIII", data)
        if magic != 0xEB9F:
            raise ValueError(f"{path}: not BTF")
        self.strings = hdr_len + str_off
        self.at = [None]  # type id -> where its record starts; id 0 is void
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        while pos < end:
            info = struct.unpack_from("<I", data, pos + 4)[0]
            self.at.append(pos)
            pos += 12 + TAIL.get((info >> 24) & 0x1F, lambda n: 0)(info & 0xFFFF)
        if pos != end:
            raise ValueError(f"{path}: a type of a kind not known here")

    def name(self, off: int) -> str:
        start = self.strings + off
        return self.data[start:self.data.index(b"\0", start)].decode()

    def members(self, type_id: int):
        """(name, type id, byte offset) of a struct's or union's members."""
        pos = self.at[type_id]
        info = struct.unpack_from("<I", self.data, pos + 4)[0]
        for i in range(info & 0xFFFF):
            name_off, member_type, off = struct.unpack_from("<III", self.data, pos + 12 + 12 * i)
            yield self.name(name_off), member_type, (off & 0xFFFFFF if info >> 31 else off) // 8

    def offset(self, struct_name: str, member: str) -> int:
        """The byte offset of `member` in `struct struct_name`, looked for in its anonymous
        structs and unions too."""
        for type_id, pos in enumerate(self.at[1:], 1):
            name_off, info = struct.unpack_from("<II", self.data, pos)
            if (info >> 24) & 0x1F == STRUCT and info & 0xFFFF and self.name(name_off) == struct_name:
                found = self._find(type_id, member)
                if found is not None:
                    return found
        raise KeyError(f"struct {struct_name} has no member {member} in this kernel's BTF")

    def _find(self, type_id: int, member: str) -> int | None:
        for name, member_type, off in self.members(type_id):
            if name == member:
                return off
            kind = (struct.unpack_from("<I", self.data, self.at[member_type] + 4)[0] >> 24) & 0x1F
            if not name and kind in (STRUCT, UNION):
                inner = self._find(member_type, member)
                if inner is not None:
                    return off + inner
        return None
