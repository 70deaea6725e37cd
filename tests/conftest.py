"""Every test: a key of run.json or summary.json that its definition lacks, or whose value is of
another type, is raised (probes/json_schema.py), in the test's process and in the daskprobe
processes it starts (they inherit the environment). A user's run says it and goes on.

The unit layer runs first (seconds, no process), then the integration layer (real clusters, minutes),
which does not run once a unit test failed: a broken function is said before a cluster is started."""

import os

import pytest

os.environ["DASKPROBE_STRICT"] = "1"

UNIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit") + os.sep


def _unit(item) -> bool:
    return str(item.path).startswith(UNIT)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not _unit(item))  # stable: each layer in its own order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    if _unit(item) and nextitem is not None and not _unit(nextitem) and item.session.testsfailed:
        item.session.shouldstop = (f"{item.session.testsfailed} unit test(s) failed: the integration layer was not "
                                   "run (alone: pytest tests/integration)")
