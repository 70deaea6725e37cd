"""What every probe offers the session: a check, a start, processes to watch, a stop."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from daskprobe.tracer.rundir import RunDir


class Probe:
    name = "?"

    def available(self) -> str | None:
        """None if this probe can run here, else why not (shown to the user, kept in run.json)."""
        return None

    def start(self, run: RunDir, ports: set[int] = frozenset()) -> None:
        """Begin capturing into run/captures; ports are the cluster's listening ports."""

    def partly_skipped(self) -> dict[str, str]:
        """Parts of this probe that could not run here, and why."""
        return {}

    def watch(self, proc: dict) -> None:
        """A process to observe from now on: a row of run.json's `processes`
        (pid, name, role, listen and contact addresses)."""

    def stop(self) -> None:
        pass


def native_binary(name: str) -> str | None:
    """A binary built by setup.sh into the venv's bin/, or on PATH."""
    env = os.environ.get(name.upper().replace("-", "_"))  # daskprobe-proxy: $DASKPROBE_PROXY
    for c in (env, str(Path(sys.prefix) / "bin" / name), shutil.which(name)):
        if c and os.access(c, os.X_OK):
            return c
    return None


def is_root() -> bool:
    return os.geteuid() == 0
