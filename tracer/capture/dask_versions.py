"""The Dask releases daskprobe supports, from OLDEST to NEWEST. OLDEST is also pyproject.toml's lower
bound (pip installs nothing older; tests/unit/test_dask_versions.py holds the two equal). NEWEST is the
last release CI ran: setup.sh installs it, .ci/oldest-dask runs the tests on OLDEST. A newer release
is not refused by pip (a user's Dask is theirs to upgrade); `run` says it was not checked.

Run as a script (setup.sh and CI, before daskprobe is installed): `python tracer/capture/dask_versions.py
oldest|newest` prints the pins pip takes for that end of the range. It imports nothing of daskprobe."""

from __future__ import annotations

import re
import sys

OLDEST, NEWEST = "2025.11.0", "2026.8.0"
PACKAGES = ("dask", "distributed")  # released together, with the same version


def release(version: str) -> tuple[int, ...]:
    """The numbers a version starts with: 2026.8.0 -> (2026, 8, 0); 2026.8.1.dev3+g12ab -> (2026, 8, 1)."""
    numbers = []
    for part in re.split(r"[.+-]", version):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def outside(package: str, version: str | None) -> str | None:
    """Why `version` of `package` is outside the supported range, in a sentence; None inside it (or
    unknown: the caller says when a package is missing)."""
    if not version or not release(version):
        return None
    span = f"({OLDEST} to {NEWEST})"
    if release(version) < release(OLDEST):
        return (f"{package} {version} is older than daskprobe supports {span}: what Dask changed since may "
                f"be missed or misread; pip install '{package}>={OLDEST}'")
    if release(version) > release(NEWEST):
        return (f"{package} {version} is newer than daskprobe was checked with {span}: if a number looks "
                f"wrong, compare with {package}=={NEWEST}")
    return None


def warnings(versions: dict) -> list[str]:
    """What `ask_versions` found that is outside the range, one sentence per package."""
    return [why for p in PACKAGES if (why := outside(p, versions.get(p)))]


def installed() -> dict:
    """This interpreter's dask and distributed versions (None for one that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    found = {}
    for p in PACKAGES:
        try:
            found[p] = version(p)
        except PackageNotFoundError:
            found[p] = None
    return found


def pins(end: str) -> list[str]:
    """pip's requirements for one end of the range ("oldest" or "newest")."""
    version = {"oldest": OLDEST, "newest": NEWEST}[end]
    return [f"{p}=={version}" for p in PACKAGES]


if __name__ == "__main__":
    print(" ".join(pins(sys.argv[1])))
