"""Stopping processes: one that stops on SIGTERM is waited for; one that does not is killed and
named; a helper left exiting is reaped within its grace from when it was told to stop. A helper
spawned at a lower priority yields the CPU to processes of other sessions too."""

import os
import sys
import time
from pathlib import Path

from daskprobe.probes import procfs, procs

CHILD = """
import signal, sys, time
def on_term(*_):
    time.sleep({linger})  # its exit takes a while
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term if {stops} else signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def child(tmp_path, linger: float, stops: bool = True):
    log = tmp_path / f"child-{len(list(tmp_path.iterdir()))}.log"
    p = procs.spawn([sys.executable, "-c", CHILD.format(linger=linger, stops=stops)], log)
    while "ready" not in procs.log_tail(log):
        assert p.poll() is None
        time.sleep(0.01)
    return p


def test_a_process_that_stops_is_waited_for_and_one_that_does_not_is_killed_and_named(tmp_path):
    quick, stubborn = child(tmp_path, linger=0.5), child(tmp_path, linger=0, stops=False)
    assert procs.stop([quick, stubborn], grace=2) == [stubborn]
    assert quick.returncode == 0 and stubborn.returncode == -9


def test_an_exiting_helper_is_reaped_within_its_grace_from_when_it_was_told(tmp_path):
    slow, stuck = child(tmp_path, linger=1), child(tmp_path, linger=60)
    told = time.monotonic()
    for p in (slow, stuck):
        procs._signal_group(p, 15)
        procs.EXITING[p] = told
    time.sleep(4)
    reaping = time.monotonic()
    assert procs.reap_exiting(grace=6) == [stuck]
    assert slow.returncode == 0 and stuck.returncode == -9 and not procs.EXITING
    # from the SIGTERM: about 2 s left of the grace (from the reaping it would be 6); the rest is slack
    # for a busy machine
    assert time.monotonic() - reaping < 4.5, "the grace counts from the SIGTERM, not from the reaping"


def test_log_tail_reads_the_end_of_a_long_log(tmp_path):
    log = tmp_path / "long.log"
    log.write_text("x" * 100_000 + "End scheduler\n")
    assert procs.log_tail(log, 100).endswith("End scheduler\n") and len(procs.log_tail(log, 100)) == 100
    assert procs.log_tail(tmp_path / "none.log") == "(no log)"


SPIN = """
import os
os.sched_setaffinity(0, {{{cpu}}})
print("ready", flush=True)
while True:
    pass
"""


def test_a_lowered_helper_yields_to_a_process_of_another_session(tmp_path):
    """Where the kernel groups sessions (autogroup), a helper alone in its session weighs against the
    cluster's sessions as a group: a nice of its own alone would leave it an equal share. The kernel's
    own CPU accounting of two spinners on one CPU says which share it gets."""
    cpu = min(os.sched_getaffinity(0))
    spinners = []
    try:
        for nice in (19, 0):
            log = tmp_path / f"spin-{nice}.log"
            spinners.append(procs.spawn([sys.executable, "-c", SPIN.format(cpu=cpu)], log, nice=nice))
            deadline = time.monotonic() + 30
            while "ready" not in procs.log_tail(log):
                assert spinners[-1].poll() is None and time.monotonic() < deadline, procs.log_tail(log)
                time.sleep(0.01)
        helper, cluster = spinners
        assert os.getpriority(os.PRIO_PROCESS, helper.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 19)
        group = Path(f"/proc/{helper.pid}/autogroup")
        if group.exists():  # "/autogroup-N nice 19"
            assert group.read_text().split()[-1] == "19"
        before = [procfs.cpu_s(p.pid) for p in spinners]
        time.sleep(2)
        took = [procfs.cpu_s(p.pid) - b for p, b in zip(spinners, before)]
        assert took[0] < 0.15 * sum(took), f"the helper at nice 19 took {took[0]:.2f} of {sum(took):.2f} CPU-s"
    finally:
        procs.stop(spinners, grace=1)
