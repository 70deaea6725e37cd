"""Helpers shared by the integration tests: run the real CLI against real clusters."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter, defaultdict
import time
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from daskprobe.dashboards import browser
from daskprobe.probes.base import capture_lines
from daskprobe.probes.rundir import RunDir

DATA = Path(__file__).parent.parent / "data"
# A Python with distributed-ucxx, which pins its own Dask: setup.sh makes .venv-ucx as root (INSTALLED once
# whole); DASKPROBE_UCX_PYTHON names another. None: the ucx:// tests skip.
_UCX_VENV = Path(__file__).parents[2] / ".venv-ucx"
UCX_PYTHON = os.environ.get("DASKPROBE_UCX_PYTHON") or (
    str(_UCX_VENV / "bin" / "python") if (_UCX_VENV / "INSTALLED").exists() else None)
NO_UCX = "distributed-ucxx is not installed here: setup.sh installs it as root, or set DASKPROBE_UCX_PYTHON"

TE = pb.TrackEvent


def daskprobe(*args: str, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daskprobe.tracer.commands", *args],
                          capture_output=True, text=True, timeout=timeout, **kw)


def chromium(tmp: Path, *args: str) -> str:
    if not browser.available():
        pytest.skip("no chromium (./setup.sh installs Debian's as root)")
    return browser.run(tmp / "profile", *args)


def drawn(tmp: Path, page: Path) -> str:
    """The <body> tag of `page` after Chromium loaded it: READY_SCRIPT's data-figures and data-errors."""
    if not browser.available():
        pytest.skip("no chromium (./setup.sh installs Debian's as root)")
    return browser.body(page, tmp / "profile")


MADE: list[Path] = []  # searchable directories made this session (conftest removes them if it passed)


def searchable_dir(name: str) -> Path:
    """A new directory that the cluster's user can reach, and write in (flows leave markers there): a root
    daskprobe runs the cluster and the command as an unprivileged user, and pytest's own temporary
    directories are root's, made 0700 again by every pytest session that starts (another's beside this one
    too). Sticky, as /tmp: nobody renames what another made in it, so root may make run directories there."""
    d = Path(tempfile.mkdtemp(prefix=f"daskprobe-test-{re.sub(r'[^A-Za-z0-9_]+', '-', name)[:40]}-"))
    d.chmod(0o1777)
    MADE.append(d)
    return d


def write_flow(path: Path, code: str) -> Path:
    path.write_text(textwrap.dedent(code))
    return path


def run_flow(tmp: Path, code: str, *opts: str, expect: int = 0,
             python: str = sys.executable) -> tuple[RunDir, subprocess.CompletedProcess]:
    """`daskprobe run OPTS -- python flow.py` with `code` as flow.py. A run expected to succeed must
    have finalized whole: a stage that failed leaves the exit code alone (the capture is the user's),
    and a test reading the tables that were made would pass without the ones that were not."""
    flow = write_flow(tmp / "flow.py", code)
    out = tmp / "run"
    p = daskprobe("run", "--out", str(out), *opts, "--", python, str(flow))
    assert p.returncode == expect, p.stderr[-4000:]
    run = RunDir(out)
    if expect == 0:
        assert not run.meta().get("finalize_errors"), (run.meta()["finalize_errors"], p.stderr[-3000:])
    return run, p


# Inputs pinned half to each worker, so the final sum must fetch data from
# the other worker: a worker-to-worker get_data is certain.
PINNED_FLOW = """
import json, os, sys, threading
from distributed import Client, get_worker

def inc(x):
    # the worker's own record of which of its threads ran a task: ground truth for the thread tracks
    get_worker().__dict__.setdefault("ran_on", set()).add(threading.get_native_id())
    return x + 1

N = {n}
with Client() as c:
    c.wait_for_workers(2)
    ws = sorted(c.scheduler_info()["workers"])
    a = c.map(inc, range(N // 2), workers=[ws[0]])
    b = c.map(inc, range(N // 2, N), workers=[ws[1]])
    total = c.submit(sum, a + b)
    assert total.result() == sum(range(1, N + 1))
    print("result", total.result())
    own = c.run(lambda dask_worker: [[os.getpid(), tid] for tid in getattr(dask_worker, "ran_on", ())])
    print("RAN_ON", json.dumps(sum(own.values(), [])), file=sys.stderr)
"""


class probe_session:
    """Run one probe outside `daskprobe run`: a bare run directory, start, stop."""

    def __init__(self, tmp: Path, probe, ports=frozenset()):
        if why := probe.available():
            pytest.skip(why)
        self.run = RunDir(tmp / "run")
        for sub in ("captures", "logs"):
            (self.run / sub).mkdir(parents=True, exist_ok=True)
        self.probe, self.ports = probe, ports

    def __enter__(self):
        self.probe.start(self.run, self.ports)
        self.probe.ready()
        return self

    def watch(self, pid: int, name: str = "target", role: str = "client", attached: str = "watching"):
        """Watch pid, and return once the eBPF agent says it attached (`attached` in its status line):
        on a busy machine that can take seconds, and a cause started before it would go unseen."""
        self.probe.watch({"pid": pid, "name": name, "role": role, "listen": None, "contact": None})
        status = self.run / "captures" / "ebpf_status.tsv"
        deadline = time.monotonic() + 60
        while not any(line.startswith(f"A\t{pid}\t") and attached in line for line in capture_lines(status)):
            assert time.monotonic() < deadline, f"pid {pid} not attached ({attached}) after 60 s"
            time.sleep(0.05)

    def __exit__(self, *exc):
        self.probe.stop()


def load(path) -> list:
    t = pb.Trace()
    t.ParseFromString(path.read_bytes())
    return list(t.packet)


def check_trace(packets: list) -> dict:
    """Raise AssertionError on anything the Perfetto UI would choke on; return counts."""
    defined, names, stacks, last_ts, threads = set(), set(), defaultdict(list), {}, set()
    interned = defaultdict(set)
    flows_out, flows_in = Counter(), Counter()
    samples = 0
    assert packets[0].sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    for p in packets:
        d = p.interned_data
        names.update(n.iid for n in d.event_names)
        for field in ("function_names", "mapping_paths", "mappings", "frames", "callstacks"):
            interned[field].update(x.iid for x in getattr(d, field))
        assert all(f.function_name_id in interned["function_names"] and f.mapping_id in interned["mappings"]
                   for f in d.frames)
        assert all(set(c.frame_ids) <= interned["frames"] for c in d.callstacks)
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in defined, f"track {d.uuid} defined twice"
            assert not d.parent_uuid or d.parent_uuid in defined, "parent defined before child"
            defined.add(d.uuid)
            if d.HasField("thread"):
                threads.add((d.thread.pid, d.thread.tid))
            continue
        seq = p.trusted_packet_sequence_id
        assert p.timestamp >= last_ts.get(seq, 0), "timestamps non-decreasing per sequence"
        last_ts[seq] = p.timestamp
        if p.HasField("perf_sample"):
            s = p.perf_sample
            assert s.callstack_iid in interned["callstacks"], "callstack interned before use"
            assert (s.pid, s.tid) in threads, "a sample's thread has a track"
            samples += 1
            continue
        e = p.track_event
        assert e.track_uuid in defined, f"track {e.track_uuid} used before it is defined"
        if e.name_iid:
            assert e.name_iid in names, "interned name used before it is defined"
        if e.type == TE.TYPE_SLICE_BEGIN:
            stacks[e.track_uuid].append(p.timestamp)
        elif e.type == TE.TYPE_SLICE_END:
            assert stacks[e.track_uuid], f"end without begin on track {e.track_uuid}"
            assert stacks[e.track_uuid].pop() <= p.timestamp
        flows_out.update(e.flow_ids)
        flows_in.update(e.terminating_flow_ids)
    assert not any(stacks.values()), "every begin has its end"
    assert set(flows_out) == set(flows_in), "both ends of every flow present"
    assert max(flows_in.values(), default=1) == 1, "a flow ends once"
    chained = sum(n > 1 for n in flows_out.values())  # compute-task -> compute -> task-finished
    return {"tracks": len(defined), "flows": len(flows_out), "chained_flows": chained, "samples": samples}
