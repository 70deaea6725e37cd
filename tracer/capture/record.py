"""`with daskprobe.record(client, out=DIR):` records the cluster a Client is connected to while
the block runs, as distributed's `performance_report` does for its own report. It runs
`daskprobe attach` on the client's scheduler, so DIR is the same run directory, finalized when
the block ends (without root: samples and Dask's task stream, no messages)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from ...probes.rundir import new_default

READY = "daskprobe: recording "  # what attach says once every probe records


@contextlib.contextmanager
def record(client, out: str | os.PathLike | None = None, probes: str | None = None, trace: bool = True):
    """Yields the run directory's path. Its own words go to this process's stderr; it fails before
    the block runs if the recording cannot start (a scheduler it cannot read)."""
    path = Path(out).absolute() if out else new_default("record")  # made here: attach takes it, empty and ours
    cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "attach", client.scheduler.address, "--out", str(path)]
    cmd += ["--probes", probes] * bool(probes) + ["--no-trace"] * (not trace)
    # its own session: a Ctrl-C in a notebook interrupts the block, and the recording still finalizes
    attach = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    said = []
    for line in attach.stderr:
        sys.stderr.write(line)
        said.append(line)
        if line.startswith(READY):
            break
    else:
        attach.wait()
        raise RuntimeError(f"daskprobe attach ended before recording (exit {attach.returncode}): {''.join(said[-3:])}")
    relay = threading.Thread(target=lambda: sys.stderr.writelines(attach.stderr), daemon=True)
    relay.start()
    try:
        yield path
    finally:
        attach.send_signal(signal.SIGINT)  # attach's way to end a recording: it stops the probes and finalizes
        attach.wait()
        relay.join(5)
