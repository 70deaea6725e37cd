"""daskprobe's Rust binaries are found where pip put them with the package: its RECORD names them,
whatever the scheme (a venv, --user, --prefix), not only this interpreter's bin/ or PATH."""

import importlib.metadata
from pathlib import Path

from daskprobe.probes import base

NAME = "daskprobe-fake"  # in no bin/ of this machine, nor on PATH


def _installed(tmp_path, record: str):
    """A daskprobe as a wheel install leaves it: site-packages/daskprobe-*.dist-info, the binary in a
    scripts directory outside site-packages."""
    info = tmp_path / "lib" / "site-packages" / "daskprobe-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: daskprobe\nVersion: 0.1.0\n")
    (info / "RECORD").write_text(record)
    scripts = tmp_path / "bin"
    scripts.mkdir()
    binary = scripts / NAME
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return importlib.metadata.PathDistribution(info), binary


def test_a_binary_is_found_where_the_installer_recorded_it(tmp_path, monkeypatch):
    dist, binary = _installed(tmp_path, f"../../bin/{NAME},sha256=x,9\ndaskprobe/__init__.py,,\n")
    monkeypatch.setattr(base, "_own_distribution", lambda: dist)
    found = base.native_binary(NAME)
    assert found and Path(found).resolve() == binary.resolve()


def test_the_environment_variable_comes_first(tmp_path, monkeypatch):
    dist, _ = _installed(tmp_path, f"../../bin/{NAME},,\n")
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setattr(base, "_own_distribution", lambda: dist)
    monkeypatch.setenv("DASKPROBE_FAKE", str(other))
    assert base.native_binary(NAME) == str(other)


def test_a_recorded_binary_gone_or_not_executable_is_not_taken(tmp_path, monkeypatch):
    dist, binary = _installed(tmp_path, f"../../bin/{NAME},,\n")
    monkeypatch.setattr(base, "_own_distribution", lambda: dist)
    binary.chmod(0o644)
    assert base.native_binary(NAME) is None
    binary.unlink()
    assert base.native_binary(NAME) is None
    assert NAME in base.missing_binary(NAME) and "pip install" in base.missing_binary(NAME)


def test_no_installed_distribution_is_no_binary():
    assert base.installed_file(None, NAME) is None
