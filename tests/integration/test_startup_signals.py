"""A SIGTERM at a moment of start-up: the run ends with what it captured, says it was interrupted
before the command ran, and finalizes whole (an import cut halfway once left numpy half-made and
every stage failed, with run.json saying finalized)."""

import sys
import textwrap

import pytest

from daskprobe.probes.rundir import RunDir

# daskprobe itself, with a hook that sends it SIGTERM the moment it first imports TARGET
CLI_TERMED_IN_AN_IMPORT = textwrap.dedent("""
    import importlib.abc, os, signal, sys
    target, argv = sys.argv[1], sys.argv[2:]
    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target_=None):
            if name == target:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGTERM)
            return None
    sys.meta_path.insert(0, Hook())
    sys.argv = ["daskprobe", *argv]
    from daskprobe.tracer.commands import entry
    entry()
""")


@pytest.mark.parametrize("target", ["numpy.linalg", "msgpack", "pyarrow.lib"])  # the stages', warmed up at start
def test_a_sigterm_inside_a_start_up_import_ends_cleanly(tmp_path, target):
    import subprocess
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-c", CLI_TERMED_IN_AN_IMPORT, target, "run", "--workers", "1", "--out",
                        str(out), "--", sys.executable, "-c", "print('the command ran')"],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 128 + 15, p.stderr[-3000:]
    assert "the command ran" not in p.stdout
    assert "interrupted by SIGTERM during start-up" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
    meta = RunDir(out).meta()
    assert "start-up" in meta["interrupted"]
    assert meta["finalize_errors"] == {} and meta["finalized"] is True, meta["finalize_errors"]
    assert RunDir(out).has_table("processes") and (out / "summary.json").exists()
