"""The sampler's answers on stdout, as daskprobe reads them: the last read's answer, and a stopped
capture's line said just before it, however the pipe delivers them. The sampler here is a stand-in
that answers as the real one does after a failed flush (main.rs); started by Sampler.start."""

import os
import sys
import time

import pytest

from daskprobe.probes import sampler as sampler_module
from daskprobe.probes.rundir import RunDir
from daskprobe.probes.sampler import Sampler

READY = "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n"
# both lines in one write, then it runs on until its stdin ends
FULL_DISK = READY + ("sys.stdout.write('capture stopped: writing --out: No space left on device (os error 28)\\nread\\n')\n"
                     "sys.stdout.flush()\nsys.stdin.read()\n")
SILENT = READY + "sys.stdin.read()\n"


def _started(tmp_path, monkeypatch, code: str) -> Sampler:
    stand_in = tmp_path / "daskprobe-sampler"
    stand_in.write_text(f"#!{sys.executable}\n{code}")
    os.chmod(stand_in, 0o755)
    monkeypatch.setattr(sampler_module, "native_binary", lambda name: str(stand_in))
    monkeypatch.setattr(sampler_module, "is_root", lambda: True)  # the stand-in reads no stacks
    run = RunDir(tmp_path / "run")
    (run / "captures").mkdir(parents=True)
    (run / "logs").mkdir()
    s = Sampler(["pyspy"])
    s.start(run)
    return s


def test_the_answer_after_another_line_is_read_at_once_and_the_line_kept(tmp_path, monkeypatch):
    s = _started(tmp_path, monkeypatch, FULL_DISK)
    start = time.monotonic()
    s.last_read(30.0)
    took = time.monotonic() - start
    s.stop()
    assert took < 15.0, took  # not the timeout's wait: "read" had come with the line before it
    assert s.error == "writing --out: No space left on device (os error 28)"


def test_no_answer_is_said_not_waited_for_forever(tmp_path, monkeypatch):
    s = _started(tmp_path, monkeypatch, SILENT)
    try:
        with pytest.raises(TimeoutError, match="no answer within 0.3 s"):
            s.last_read(0.3)
    finally:
        s.stop()
