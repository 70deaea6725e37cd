"""The run the read-only integration checks share."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from daskprobe.probes.rundir import RunDir
from helpers import MADE, PINNED_FLOW, run_flow, searchable_dir


@pytest.fixture
def tmp_path(request) -> Path:
    """A temporary directory the cluster's user can reach (helpers.searchable_dir); kept if the test failed."""
    d = searchable_dir(request.node.name)
    yield d
    if getattr(request.node, "daskprobe_passed", False):
        shutil.rmtree(d, ignore_errors=True)
        MADE.remove(d)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.when == "call":
        item.daskprobe_passed = report.passed


@pytest.fixture(scope="session", autouse=True)
def _remove_made(request):
    yield
    if not request.session.testsfailed:
        for d in MADE:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pinned_run() -> tuple[RunDir, subprocess.CompletedProcess, int]:
    """One real 2-worker run shared by the read-only checks."""
    n = 40
    run, p = run_flow(searchable_dir("pinned"), PINNED_FLOW.format(n=n), "--workers", "2")
    return run, p, n
