"""The Dask versions daskprobe supports: one range, which pip's lower bound and run's warning share."""

import tomllib
from pathlib import Path

from daskprobe.tracer.capture import dask_versions
from daskprobe.tracer.capture.dask_versions import NEWEST, OLDEST, outside, release

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_pips_lower_bound_is_the_oldest_supported_and_there_is_no_upper_pin():
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    for package in dask_versions.PACKAGES:
        assert [d for d in deps if d.split(">")[0].split("=")[0].strip() == package] == [f"{package}>={OLDEST}"]


def test_the_range_is_a_range():
    assert release(OLDEST) < release(NEWEST)


def test_a_release_is_its_leading_numbers():
    assert release("2026.8.0") == (2026, 8, 0)
    assert release("2026.8.1.dev3+g12ab") == (2026, 8, 1)
    assert release("2026.10.0") > release("2026.9.1")  # numbers, not text
    assert release("unknown") == ()


def test_inside_the_range_nothing_is_said():
    for v in (OLDEST, NEWEST, f"{NEWEST}.dev1+gabc", None, "", "unknown"):
        assert outside("distributed", v) is None


def test_older_and_newer_say_the_range_and_what_to_install():
    older = outside("distributed", "2024.1.0")
    assert "older" in older and OLDEST in older and NEWEST in older and f"distributed>={OLDEST}" in older
    newer = outside("dask", "2099.1.0")
    assert "newer" in newer and f"dask=={NEWEST}" in newer


def test_warnings_name_each_package_outside():
    found = dask_versions.warnings({"dask": "2099.1.0", "distributed": NEWEST, "python": "3.11.7"})
    assert len(found) == 1 and found[0].startswith("dask 2099.1.0 ")


def test_pins_for_setup_and_ci():
    assert dask_versions.pins("oldest") == [f"dask=={OLDEST}", f"distributed=={OLDEST}"]
