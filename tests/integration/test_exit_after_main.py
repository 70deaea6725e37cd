"""tracer/capture/cluster.py's EXIT_AFTER_MAIN: a Dask CLI run as under -m, that exits at once after its main."""

import subprocess
import sys
import time

from daskprobe.tracer.capture.cluster import EXIT_AFTER_MAIN

CLI = """
import atexit, sys, threading, time
def last_words():
    open("atexit.txt", "w").write("ran")
atexit.register(last_words)
def slow():
    time.sleep(0.3)
    open("thread.txt", "w").write("joined")
threading.Thread(target=slow).start()  # not a daemon: the exit waits for it, as Python's would
class Teardown:
    def __del__(self, open=open):  # builtins may be gone by then
        open("teardown.txt", "w").write("torn down")
kept = Teardown()  # module teardown would delete it
print("args", sys.argv[1:], flush=True)
sys.exit({code})
"""


def run(tmp_path, code) -> subprocess.CompletedProcess:
    (tmp_path / "fake_cli.py").write_text(CLI.format(code=code))
    return subprocess.run([sys.executable, "-c", EXIT_AFTER_MAIN, "fake_cli", "--port", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def test_the_clis_arguments_exit_code_threads_and_atexit_handlers_are_kept(tmp_path):
    p = run(tmp_path, 3)
    assert p.returncode == 3 and "args ['--port', '1']" in p.stdout  # imported from the current directory
    assert (tmp_path / "atexit.txt").read_text() == "ran" and (tmp_path / "thread.txt").read_text() == "joined"
    assert not (tmp_path / "teardown.txt").exists()  # what it skips: tearing the modules down


def test_under_python_m_the_same_cli_tears_its_modules_down(tmp_path):
    run(tmp_path, 0)
    subprocess.run([sys.executable, "-m", "fake_cli"], cwd=tmp_path, capture_output=True, timeout=60)
    assert (tmp_path / "teardown.txt").exists()  # so the check above can fail


def test_an_exit_with_a_message_says_it_and_exits_1(tmp_path):
    p = run(tmp_path, "'bad option'")
    assert p.returncode == 1 and "bad option" in p.stderr
    assert run(tmp_path, "None").returncode == 0


def test_gated_it_imports_the_package_first_and_runs_the_module_after_a_line_on_stdin(tmp_path):
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("open('imported.txt', 'w').write('yes')\n")
    (pkg / "cli.py").write_text("import sys\nopen('ran.txt', 'w').write(' '.join(sys.argv[1:]))\n")
    p = subprocess.Popen([sys.executable, "-c", EXIT_AFTER_MAIN, "--gated", "fakepkg.cli", "--port", "1"],
                         cwd=tmp_path, stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "imported.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        assert (tmp_path / "imported.txt").exists() and not (tmp_path / "ran.txt").exists()
        p.stdin.write(b"\n")
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    finally:
        p.kill()
    assert (tmp_path / "ran.txt").read_text() == "--port 1"
