"""Helpers shared by the tests: run the real CLI against real clusters."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from daskprobe.dashboards import browser
from daskprobe.probes.base import capture_lines
from daskprobe.probes.rundir import RunDir

DATA = Path(__file__).parent / "data"


def daskprobe(*args: str, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daskprobe.tracer.cli", *args],
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


def write_flow(path: Path, code: str) -> Path:
    path.write_text(textwrap.dedent(code))
    return path


def run_flow(tmp: Path, code: str, *opts: str, expect: int = 0) -> tuple[RunDir, subprocess.CompletedProcess]:
    """`daskprobe run OPTS -- python flow.py` with `code` as flow.py."""
    flow = write_flow(tmp / "flow.py", code)
    out = tmp / "run"
    p = daskprobe("run", "--out", str(out), *opts, "--", sys.executable, str(flow))
    assert p.returncode == expect, p.stderr[-4000:]
    return RunDir(out), p


# Inputs pinned half to each worker, so the final sum must fetch data from
# the other worker: a worker-to-worker get_data is certain.
PINNED_FLOW = """
from distributed import Client

def inc(x):
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
"""


@pytest.fixture(scope="session")
def pinned_run(tmp_path_factory) -> tuple[RunDir, subprocess.CompletedProcess, int]:
    """One real 2-worker run shared by the read-only checks."""
    n = 40
    run, p = run_flow(tmp_path_factory.mktemp("pinned"), PINNED_FLOW.format(n=n), "--workers", "2")
    return run, p, n


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
