"""daskprobe as a user installs it: a wheel built from the checkout by the package's own build backend
(setuptools-rust builds the Rust binaries into it), installed into a fresh venv. The wheel holds the
binaries as scripts and the data files; from that venv `daskprobe` finds its binaries and records a run
of the user's script with the venv's own Python and Dask.

The wheel is built in the checkout (pip builds in-tree), so cargo finds probes/target built by setup.sh
and builds nothing again."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from daskprobe.probes.rundir import RunDir
from helpers import searchable_dir, write_flow

ROOT = Path(__file__).resolve().parents[2]
BINARIES = ("daskprobe-proxy", "daskprobe-tap", "daskprobe-sampler", "daskprobe-unwind")


@pytest.fixture(scope="module")
def wheel() -> Path:
    out = searchable_dir("wheel")
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                        "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    found = list(out.glob("daskprobe-*.whl"))
    assert len(found) == 1, p.stdout[-2000:]
    print(f"wheel built in {time.monotonic() - started:.0f} s: {found[0].stat().st_size / 2**20:.1f} MiB")
    return found[0]


@pytest.fixture(scope="module")
def venv(wheel) -> Path:
    """A fresh venv with the wheel installed. Its dependencies come from this interpreter's
    site-packages (a path in a .pth: no download), behind the venv's own: the wheel's daskprobe wins."""
    env = searchable_dir("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    site = Path(subprocess.run([env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps-from-the-test.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([env / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                    str(wheel)], check=True, timeout=600)
    return env


def _packages():
    """The checkout's packages, as directories relative to its root (the root itself is `daskprobe`)."""
    for d, subdirs, files in os.walk(ROOT):
        top = Path(d) == ROOT
        subdirs[:] = [s for s in subdirs if not s.startswith((".", "__")) and s != "target"
                      and not (top and s in ("tests", "build"))]
        if "__init__.py" in files:
            yield Path(d).relative_to(ROOT)


def test_the_wheel_holds_the_binaries_as_scripts_and_the_data_files(wheel):
    with zipfile.ZipFile(wheel) as z:
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    for name in BINARIES:
        script = f"daskprobe-0.1.0.data/scripts/{name}"
        assert script in modes, sorted(modes)[:20]
        assert modes[script] & stat.S_IXUSR, f"{script} is not executable"
    assert "daskprobe/analyzers/rules/dask.toml" in modes
    assert "daskprobe/experiments/diagnosis_flows/gil.py" in modes
    assert not [n for n in modes if n.startswith(("daskprobe/tests/", "daskprobe/probes/target/"))]
    missing = [str(d) for d in _packages() if (Path("daskprobe") / d / "__init__.py").as_posix() not in modes]
    assert not missing, f"packages of the checkout missing from the wheel: {missing}"


def test_the_installed_daskprobe_finds_its_binaries_beside_its_script(venv):
    """Found where pip recorded them (RECORD), and by the locator, from a directory of the user's."""
    code = ("import daskprobe; from daskprobe.probes.base import _own_distribution, installed_file, native_binary; "
            f"print(daskprobe.__file__); [print(installed_file(_own_distribution(), n), native_binary(n)) for n in {BINARIES!r}]")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASKPROBE_")}
    lines = subprocess.run([venv / "bin" / "python", "-c", code], capture_output=True, text=True, check=True,
                           cwd=searchable_dir("elsewhere"), env=dict(env, PATH="/usr/bin:/bin")).stdout.splitlines()
    assert lines[0].startswith(str(venv)), f"not the wheel's daskprobe: {lines[0]}"
    assert lines[1:] == [f"{venv / 'bin' / n} {venv / 'bin' / n}" for n in BINARIES]


def test_a_run_from_the_installed_venv_uses_its_python(venv):
    tmp = searchable_dir("installed-run")
    flow = write_flow(tmp / "flow.py", """
        import sys
        from distributed import Client
        with Client() as c:
            assert c.submit(sum, [1, 2, 3]).result() == 6
            print("cluster python", c.run_on_scheduler(lambda: __import__("sys").executable))
        """)
    out = tmp / "run"
    p = subprocess.run([venv / "bin" / "daskprobe", "run", "--probes", "proxy,pyspy", "--workers", "1", "--out", str(out),
                        "--", venv / "bin" / "python", str(flow)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert f"cluster python {venv / 'bin' / 'python'}" in p.stdout
    run = RunDir(out)
    meta = run.meta()
    assert meta["cluster"]["python"] == str(venv / "bin" / "python")
    assert not meta["skipped"], meta["skipped"]
    assert (run.table("messages").op == "compute-task").sum() >= 1
    assert len(run.table("samples")) > 0


def test_the_sdist_carries_the_rust_workspace(tmp_path):
    """A wheel built from the sdist (pip's route from an archive) builds the binaries from what it holds."""
    # egg_info anew: one left by an earlier build would list its files whatever MANIFEST.in says
    subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path),
                    "sdist", "-d", str(tmp_path)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    with tarfile.open(next(tmp_path.glob("daskprobe-*.tar.gz"))) as t:
        held = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    tracked = subprocess.run(["git", "ls-files", "probes/*.rs", "probes/**/Cargo.toml", "probes/Cargo.*"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert tracked and not [f for f in tracked if f not in held]
