"""The run the read-only integration checks share."""

from __future__ import annotations

import subprocess

import pytest

from daskprobe.probes.rundir import RunDir
from helpers import PINNED_FLOW, run_flow


@pytest.fixture(scope="session")
def pinned_run(tmp_path_factory) -> tuple[RunDir, subprocess.CompletedProcess, int]:
    """One real 2-worker run shared by the read-only checks."""
    n = 40
    run, p = run_flow(tmp_path_factory.mktemp("pinned"), PINNED_FLOW.format(n=n), "--workers", "2")
    return run, p, n
