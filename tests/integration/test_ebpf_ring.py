"""The agent's reading of a BPF ring buffer, on a ring laid out as the kernel lays it out
(kernel/bpf/ringbuf.c): a record still being written, and those after it, are left for
the next drain; a record that wraps around is read whole from the second mapping."""

import subprocess

import pytest

from daskprobe.probes import ebpf_format
from daskprobe.probes.ebpf import AGENT, SYSTEM_PYTHON

DRAINS = r"""
import io, mmap, struct, sys
sys.path.insert(0, sys.argv[1])
import ebpf_format
from ebpf_agent import RingReader

SIZE, BUSY = 4 * mmap.PAGESIZE, 1 << 31
r = RingReader.__new__(RingReader)
r.page, r.mask = mmap.PAGESIZE, SIZE - 1
r.consumer, r.data = bytearray(r.page), bytearray(r.page + 2 * SIZE)  # the data pages twice in a row

def produce(pos, t0, busy=False):
    rec = ebpf_format.record(ebpf_format.Event(kind=2, pid=1, t0=t0))
    if busy:
        rec = struct.pack("<I", ebpf_format.SIZE | BUSY) + rec[4:]
    for at in (r.page + (pos & r.mask), r.page + (pos & r.mask) + SIZE):  # as both mappings show it
        end = min(at + len(rec), len(r.data))
        r.data[at:end] = rec[:end - at]
    return pos + len(rec)

def drain():
    out = io.BytesIO()
    r.take(ebpf_format.RECORD_SIZE, out)
    raw = out.getvalue()
    return [ebpf_format.Event.from_buffer_copy(raw, i + 8).t0 for i in range(0, len(raw), ebpf_format.RECORD_SIZE)]

start = SIZE - 2 * ebpf_format.RECORD_SIZE  # the third record wraps around the ring's end
struct.pack_into("<Q", r.consumer, 0, start)
pos = start
for t0 in (1, 2):
    pos = produce(pos, t0)
busy_at = pos
pos = produce(pos, 3, busy=True)
pos = produce(pos, 4)
struct.pack_into("<Q", r.data, 0, pos)
first = drain()
produce(busy_at, 3)  # committed since
second = drain()
print(first, second, struct.unpack_from("<Q", r.consumer)[0] - start)
"""


def test_a_record_being_written_stops_the_drain_there_and_is_taken_next_time():
    if subprocess.run([SYSTEM_PYTHON, "-c", "import bcc"], capture_output=True).returncode != 0:
        pytest.skip(f"no bcc for {SYSTEM_PYTHON}: the agent cannot be imported")
    out = subprocess.run([SYSTEM_PYTHON, "-c", DRAINS, str(AGENT.parent)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[1,", "2]", "[3,", "4]", str(4 * ebpf_format.RECORD_SIZE)]
