"""Stopping processes: one that has finished what matters is left to exit in the background and
reaped later; one that does not stop is killed."""

import sys
import time

from daskprobe.probes import procs

CHILD = """
import signal, sys, time
def on_term(*_):
    print("End worker", flush=True)  # its work is over; its exit takes a while yet
    time.sleep({linger})
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term if {ends} else signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def child(tmp_path, linger: float, ends: bool = True):
    log = tmp_path / "child.log"
    p = procs.spawn([sys.executable, "-c", CHILD.format(linger=linger, ends=ends)], log)
    while "ready" not in procs.log_tail(log):
        assert p.poll() is None
        time.sleep(0.01)
    return p, lambda q: "End worker" in procs.log_tail(log)


def test_a_process_that_has_ended_its_work_is_not_waited_for_but_reaped(tmp_path):
    p, done = child(tmp_path, linger=3)
    procs.stop([p], grace=30, done=done)
    assert p.poll() is None and p in procs.EXITING, "still exiting, not waited for"
    procs.reap_exiting(grace=30)
    assert p.returncode == 0 and not procs.EXITING, "it exited by itself, and was reaped"


def test_one_that_outlives_the_reaping_grace_is_killed(tmp_path):
    p, done = child(tmp_path, linger=60)
    procs.stop([p], grace=30, done=done)
    procs.reap_exiting(grace=0.3)
    assert p.returncode == -9


def test_one_that_ignores_sigterm_and_never_ends_is_killed(tmp_path):
    p, done = child(tmp_path, linger=0, ends=False)
    procs.stop([p], grace=0.3, done=done)
    assert p.returncode == -9 and p not in procs.EXITING


def test_without_done_stop_waits_for_the_exit(tmp_path):
    p, _ = child(tmp_path, linger=0.5)
    procs.stop([p], grace=30)
    assert p.returncode == 0


def test_log_tail_reads_the_end_of_a_long_log(tmp_path):
    log = tmp_path / "long.log"
    log.write_text("x" * 100_000 + "End scheduler\n")
    assert procs.log_tail(log, 100).endswith("End scheduler\n") and len(procs.log_tail(log, 100)) == 100
    assert procs.log_tail(tmp_path / "none.log") == "(no log)"
