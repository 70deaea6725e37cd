"""The client hook's mechanism in a real interpreter (probes/client_hook): loaded by PYTHONPATH, it runs
any other sitecustomize after it, imports nothing of Dask's at start-up, calls a feature once the module
it waits for has run, reports only on daskprobe's pipe, and a failing feature costs the command nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from daskprobe.probes.client_hook import HOOK_DIR, Channel
from daskprobe.probes.client_hook.daskprobe_hook import ENV_PIPE


def _python(code: str, env: dict | None = None, pass_fds=(), path: list[str] = ()) -> subprocess.CompletedProcess:
    env = dict(env or os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HOOK_DIR), *path])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, pass_fds=pass_fds,
                          capture_output=True, text=True, timeout=120)


def test_another_sitecustomize_still_runs_after_the_hook(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.stderr.write('THEIRS RAN\\n')\nMINE = 1\n")
    p = _python("""
        import sys, sitecustomize
        print(getattr(sitecustomize, "MINE", None), "daskprobe_hook" in sys.modules)
    """, path=[str(tmp_path)])
    assert p.returncode == 0 and "THEIRS RAN" in p.stderr, p.stderr
    assert p.stdout.split() == ["1", "True"]


def test_nothing_of_dask_is_imported_at_start_up():
    p = _python("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stderr


def test_a_feature_is_called_once_its_module_has_run_and_the_module_keeps_its_loader(tmp_path):
    (tmp_path / "watched.py").write_text("X = 41\n")
    p = _python("""
        import daskprobe_hook
        daskprobe_hook.on_import("watched", lambda m: setattr(m, "X", m.X + 1))
        import watched, importlib.machinery
        print(watched.X, type(watched.__loader__).__name__, type(watched.__spec__.loader).__name__)
        daskprobe_hook.on_import("watched", lambda m: print("at once", m.X))
    """, path=[str(tmp_path)])
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["42 SourceFileLoader SourceFileLoader", "at once 42"]


def test_a_failing_feature_is_said_and_the_command_goes_on():
    p = _python("""
        import daskprobe_hook
        daskprobe_hook.install(("daskprobe_hook_no_such_feature",))
        daskprobe_hook.on_import("json", lambda m: 1 / 0)
        import json
        print("ran", json.dumps(1))
    """)
    assert p.returncode == 0 and p.stdout.strip() == "ran 1"
    assert "client hook daskprobe_hook_no_such_feature failed (ModuleNotFoundError" in p.stderr
    assert "ZeroDivisionError" in p.stderr and "goes on without it" in p.stderr


def test_reports_go_to_daskprobes_pipe_and_nowhere_else(tmp_path):
    c = Channel()
    try:
        env = c.env(dict(os.environ))
        p = _python("import daskprobe_hook; print(daskprobe_hook.send('hello', n=1))", env, c.pass_fds)
        assert p.stdout.strip() == "True", p.stderr
        c.started()
        (report,) = c.read()
        assert report["kind"] == "hello" and report["n"] == 1 and report["pid"] > 0
        # a process where the fd number is another file (it did not inherit the pipe) writes nothing to it
        other = tmp_path / "other"
        with open(other, "wb") as f:
            fd = f.fileno()
            env[ENV_PIPE] = f"{fd}:{os.fstat(c.fileno()).st_ino}"
            p = _python("import daskprobe_hook; print(daskprobe_hook.send('hello'))", env, (fd,))
        assert p.stdout.strip() == "False" and other.read_bytes() == b"", p.stderr
    finally:
        c.close()
