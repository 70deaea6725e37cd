"""The run the read-only integration checks share."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from daskprobe.probes.rundir import RunDir
from helpers import PINNED_FLOW, run_flow, searchable


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    return searchable(tmp_path)


@pytest.fixture(scope="session")
def pinned_run(tmp_path_factory) -> tuple[RunDir, subprocess.CompletedProcess, int]:
    """One real 2-worker run shared by the read-only checks."""
    n = 40
    run, p = run_flow(searchable(tmp_path_factory.mktemp("pinned")), PINNED_FLOW.format(n=n), "--workers", "2")
    return run, p, n
