"""How a run starts, fails, is killed and ends, as a user would see it."""

import json
import os
import signal
import subprocess
import sys
import time

from helpers import daskprobe, run_flow, write_flow
from daskprobe.probes.proxy_capture import read_capture
from daskprobe.probes.rundir import RunDir
from daskprobe.tracer.decode.messages import messages_table
from daskprobe.tracer.decode.tables import connections_table, processes_table


def gone(meta: dict, within: float = 15) -> None:
    """Every process of the run gone within `within` s: one killed last may still be exiting on a busy
    machine as daskprobe ends; one left after that is an orphan, named."""
    pids = [r["pid"] for r in meta["processes"] if r["pid"]]
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"orphans: {[(pid, _named(pid, meta)) for pid in pids if alive(pid)]}"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is as good as gone
        return f.read().split(")")[-1].split()[0] != "Z"


def test_exit_code_and_stderr_pass_through(tmp_path):
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n"
    run, p = run_flow(tmp_path, code, "--workers", "1", expect=3)
    assert p.stdout == "to stdout\n"
    lines = [x for x in p.stderr.splitlines() if " run as user " not in x]  # as whom (a root run) is said first
    said, passed = lines[:2]  # the start is said before the command runs
    assert said.startswith("daskprobe: starting") and passed == "to stderr"
    assert run.meta()["exit_code"] == 3


def test_config_reaches_every_process(tmp_path):
    code = """
    import dask
    from distributed import Client
    key = "distributed.scheduler.worker-saturation"
    with Client() as c:
        seen = [c.run_on_scheduler(lambda: dask.config.get(key))]
        seen += list(c.run(lambda: dask.config.get(key)).values())
    print(seen, dask.config.get(key))
    """
    run, p = run_flow(tmp_path, code, "--workers", "1", "--config", "distributed.scheduler.worker-saturation=inf")
    assert p.stdout.strip() == "['inf', 'inf'] inf"
    assert run.meta()["config"] == {"distributed.scheduler.worker-saturation": "inf"}


def test_probes_none_is_a_plain_cluster(tmp_path):
    code = "from distributed import Client\nc = Client()\nassert c.submit(sum, [1, 2]).result() == 3\n"
    run, _ = run_flow(tmp_path, code, "--workers", "1", "--probes", "none")
    assert not run.proxy_capture.exists()
    assert run.meta()["probes"] == []
    assert len(run.table("messages")) == 0


def test_nanny_traffic_goes_through_the_proxy(tmp_path):
    code = """
    from distributed import Client
    with Client() as c:
        assert c.submit(sum, [1, 2]).result() == 3
        print(*[w["nanny"] for w in c.scheduler_info()["workers"].values()])
        c.restart()  # the scheduler asks the nanny to restart its worker
    """
    run, p = run_flow(tmp_path, code, "--workers", "1", "--nanny")
    procs = run.table("processes").set_index("name")
    assert p.stdout.split()[0] == f"tcp://{procs.contact['nanny-0']}"
    c = run.table("connections")
    to_nanny = c[c.upstream_name == "nanny-0"]
    assert "scheduler" in set(to_nanny.peer), "the scheduler reached the nanny through its proxy"
    m = run.table("messages")
    assert (m[m.conn.isin(to_nanny.conn)].op == "kill").any()


def test_failed_start_says_why(tmp_path):
    out = tmp_path / "run"
    p = daskprobe("run", "--out", str(out), "--server-cmd",
                  f"{sys.executable} -c 'import sys; print(\"no such server\"); sys.exit(7)'",
                  "--", sys.executable, "-c", "pass")
    assert p.returncode != 0
    assert "scheduler exited with code 7" in p.stderr and "no such server" in p.stderr
    meta = RunDir(out).meta()
    assert meta["partial"] is False and meta["exit_code"] != 0


def captured(run: RunDir, op: str) -> int:
    """How many messages of `op` the run's recorder has written so far (decoded as the tables stage does)."""
    cap = read_capture(run.messages_capture)
    msgs, _ = messages_table(cap, connections_table(cap, processes_table(run.meta())))
    return int((msgs.op == op).sum())


def _named(pid: int, meta: dict) -> str:
    """A process of the run as run.json names it, and its command line: which one outlived daskprobe."""
    name = next((p["name"] for p in meta["processes"] if p["pid"] == pid), "?")
    try:
        return f"{name}: {open(f'/proc/{pid}/cmdline', 'rb').read().replace(bytes(1), b' ').decode()[:200]}"
    except OSError:
        return name


def test_sigkill_leaves_a_partial_readable_run_and_no_orphans(tmp_path):
    marker = tmp_path / "half-done"
    flow = write_flow(tmp_path / "flow.py", f"""
    import time
    from distributed import Client
    with Client() as c:
        assert sum(c.gather(c.map(lambda x: x + 1, range(20)))) == 210
        open({str(marker)!r}, "w").close()
        time.sleep(120)
    """)
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "run", "--out", str(out),
                          "--workers", "1", "--", sys.executable, str(flow)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.1)
    # the recorder writes every 100 ms or so, later on a busy machine: killed once the tasks are on disk
    run = RunDir(out)
    while captured(run, "compute-task") < 20:
        assert time.monotonic() < deadline and p.poll() is None, "the tasks' messages never reached the capture"
        time.sleep(0.1)
    p.kill()
    p.wait()
    meta = run.meta()
    assert meta["partial"] is True
    gone(meta)
    b = daskprobe("build", str(out))
    assert b.returncode == 0, b.stderr
    assert (run.table("messages").op == "compute-task").sum() == 20
    assert json.loads((out / "run.json").read_text())["partial"] is True


def test_help_lists_every_verb_and_each_verb_shows_its_own_examples():
    p = daskprobe("--help")
    assert p.returncode == 0
    for cmd in ("run", "build", "report", "doctor", "open", "compare", "bench"):
        assert cmd in p.stdout
        own = daskprobe(cmd, "--help")
        assert own.returncode == 0 and f"daskprobe {cmd}" in own.stdout.split("examples:")[-1]
    assert p.stdout.count("examples:") <= 1


def test_mistakes_are_named_before_anything_starts(tmp_path):
    out = tmp_path / "run"
    typo = daskprobe("run", "--wrokers", "2", "--out", str(out))
    assert typo.returncode == 2 and "did you mean --workers?" in typo.stderr
    verb = daskprobe("rnu")
    assert verb.returncode != 0 and "did you mean 'run'?" in verb.stderr
    no_dashes = daskprobe("run", "--out", str(out), "python", "-c", "print(1)")
    assert no_dashes.returncode == 2 and "goes after '--'" in no_dashes.stderr
    assert "daskprobe run -- python -c 'print(1)'" in no_dashes.stderr, "the hint must run as shown"
    # read by a pager or `head` that stopped reading: no error of ours
    head = subprocess.run(f"{sys.executable} -m daskprobe.tracer.commands explain | true", shell=True,
                          capture_output=True, text=True, timeout=60)
    assert head.returncode == 0 and "Traceback" not in head.stderr, head.stderr
    started = time.monotonic()
    missing = daskprobe("run", "--out", str(out), "--", sys.executable, str(tmp_path / "nothere.py"))
    assert missing.returncode != 0 and "nothere.py: no such file" in missing.stderr
    assert time.monotonic() - started < 30 and not out.exists(), "a cluster was started for a missing script"
    both = daskprobe("run", "--probes", "proxy,tap", "--out", str(out), "--", sys.executable, "-c", "pass")
    assert both.returncode != 0 and "choose one" in both.stderr and not out.exists()


def test_an_interpreter_without_distributed_is_warned_about(tmp_path):
    bare = tmp_path / "bare"  # a venv of our interpreter without site-packages: no distributed
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    out = tmp_path / "run"
    p = daskprobe("run", "--no-trace", "--probes", "proxy", "--out", str(out), "--", str(bare / "bin" / "python"),
                  "-c", "print('hello')")
    assert p.returncode == 0 and "hello" in p.stdout
    assert "has no distributed" in p.stderr, p.stderr
    assert (out / "run.json").exists() and not (out / "trace.pftrace").exists()
    # the same interpreter with another distributed installed (as pip records it): told the versions differ
    site = next((bare / "lib").glob("python3*/site-packages"))
    (site / "distributed-2020.1.0.dist-info").mkdir()
    (site / "distributed-2020.1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: distributed\nVersion: 2020.1.0\n")
    p = daskprobe("run", "--no-trace", "--probes", "proxy", "--out", str(tmp_path / "run2"), "--",
                  str(bare / "bin" / "python"), "-c", "print('hello')")
    assert p.returncode == 0 and "has distributed 2020.1.0, the cluster" in p.stderr, p.stderr


def _start_sleeping_run(tmp_path, **popen):
    marker = tmp_path / "started"
    flow = write_flow(tmp_path / "flow.py", f"""
    import time
    from distributed import Client
    with Client() as c:
        assert c.submit(sum, [1, 2]).result() == 3
        open({str(marker)!r}, "w").close()
        time.sleep(120)
    """)
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "run", "--out", str(out),
                          "--workers", "1", "--", sys.executable, str(flow)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert time.monotonic() < deadline and p.poll() is None, p.stderr and p.stderr.read()
        time.sleep(0.1)
    return p, RunDir(out)


def _assert_clean_teardown(p, run, code):
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    meta = run.meta()
    assert meta["partial"] is False and meta["exit_code"] == code
    gone(meta)
    assert (run.table("messages").op == "compute-task").sum() == 1
    assert run.trace.stat().st_size > 0
    assert err.strip().splitlines()[-1].endswith(str(run.path))


def test_ctrl_c_tears_down_and_finalizes(tmp_path):
    # A terminal's Ctrl-C signals the whole foreground process group.
    p, run = _start_sleeping_run(tmp_path, start_new_session=True)
    os.killpg(p.pid, signal.SIGINT)
    _assert_clean_teardown(p, run, 128 + signal.SIGINT)


def test_sigterm_tears_down_and_finalizes(tmp_path):
    p, run = _start_sleeping_run(tmp_path)
    p.terminate()
    _assert_clean_teardown(p, run, 128 + signal.SIGTERM)


def test_workers_that_do_not_stop_are_killed_named_and_leave_no_process(tmp_path):
    # a task still sleeping when the command exits keeps its worker from closing; a thread that is
    # not a daemon keeps the other's interpreter up after it logged its end
    code = """
import threading, time
from distributed import Client, fire_and_forget
def linger():
    threading.Thread(target=time.sleep, args=(60,)).start()
with Client() as c:
    c.run(linger, workers=[w for w, i in c.scheduler_info()["workers"].items() if i["name"] == "worker-1"])
    fire_and_forget(c.submit(time.sleep, 60, workers=["worker-0"]))
    time.sleep(1)
"""
    run, p = run_flow(tmp_path, code, "--workers", "2", "--probes", "proxy")
    meta = run.meta()
    assert sorted(meta["killed"]) == ["worker-0", "worker-1"], p.stderr[-3000:]
    assert "worker-0 did not stop within 5 s of SIGTERM" in p.stderr
    assert "worker-1 still running 5 s after SIGTERM" in p.stderr
    assert meta["finalized"] and not meta["finalize_errors"], p.stderr[-3000:]
    gone(meta)
