"""experiments/tick_cost.py: the slowdown of each pair of windows, and what it needs from the kernel."""

import fcntl
import os

import pandas as pd
import pytest

from daskprobe.experiments import tick_cost


def test_each_pair_compares_the_median_iteration_inside_its_windows_whatever_their_order():
    windows = [("on", 0, 100), ("off", 100, 200), ("off", 200, 300), ("on", 300, 400)]
    # iterations of 12 ns in the first "on" window, 10 in the "off" ones, 11 in the second "on";
    # eight of 50 ns that start in the first window and end after it must not count (they would be
    # most of its iterations)
    its = [(t, 12) for t in range(0, 60, 12)] + [(t, 10) for t in range(100, 200, 10)]
    its += [(t, 10) for t in range(200, 290, 10)] + [(t, 11) for t in range(300, 389, 11)]
    its += [(t, 50) for t in range(60, 100, 5)]
    got = tick_cost.slowdowns(pd.DataFrame(its, columns=["t0", "ns"]), windows)
    assert got == pytest.approx([0.2, 0.1])


@pytest.mark.skipif(os.geteuid() != 0, reason="system-wide perf events and BPF need root")
def test_the_empty_program_attaches_to_a_tick_event_on_every_cpu_asked():
    cpus = sorted(os.sched_getaffinity(0))
    fds, program = tick_cost.tick_events(100, cpus), tick_cost.empty_program()
    try:
        assert len(fds) == len(cpus)
        for fd in fds:
            fcntl.ioctl(fd, tick_cost.PERF_EVENT_IOC_SET_BPF, program)
        assert "prog_type:\t7\n" in open(f"/proc/self/fdinfo/{program}").read()  # BPF_PROG_TYPE_PERF_EVENT
    finally:
        for fd in fds + [program]:
            os.close(fd)
