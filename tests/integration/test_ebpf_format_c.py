"""The eBPF event format (probes/ebpf_format.py) as the programs that use it see it: the C compiler
places struct event's fields where ctypes does, and the agent's Python imports it with what it has."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daskprobe.probes import ebpf_format

C_EVENT = """
#include <stdint.h>
typedef uint8_t u8; typedef uint32_t u32; typedef uint64_t u64; typedef int64_t s64;
%s
"""


def compiles(c: str, tmp_path: Path) -> subprocess.CompletedProcess:
    src = tmp_path / "event.c"
    src.write_text(C_EVENT % c)
    return subprocess.run(["gcc", "-fsyntax-only", str(src)], capture_output=True, text=True)


def test_the_c_compiler_places_the_events_fields_where_ctypes_does(tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("no gcc to compile the C declarations with")
    # its asserts: the C compiler places struct event's fields where ctypes does, at ctypes' sizes
    p = compiles(ebpf_format.C_DECLARATIONS, tmp_path)
    assert p.returncode == 0, p.stderr
    for field, changed in (("u32 kind;", "u64 kind;"), ("u64 t0;", "u32 t0;"),  # the rest moved; t0 narrower
                           ("u64 sp;", "u32 sp;")):  # struct ustack's fields after it moved
        assert compiles(ebpf_format.C_DECLARATIONS.replace(field, changed), tmp_path).returncode != 0, changed


def test_the_event_format_needs_no_more_than_the_agent_has():
    # the agent runs under Debian's python3: the standard library, bcc, and its own folder
    code = f"import sys; sys.path.insert(0, {str(Path(ebpf_format.__file__).parent)!r}); import ebpf_format; " \
           "assert 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-I", "-c", code], check=True)
