"""experiments/tick_cost.py: the slowdown of each pair of windows, and what it needs from the kernel."""

import fcntl
import os

import pandas as pd
import pytest

from daskprobe.experiments import tick_cost


def test_each_pair_compares_the_median_iteration_inside_its_on_and_off_windows():
    windows = [("on", 0, 100), ("off", 100, 200), ("on", 200, 300), ("off", 300, 400)]
    # 10 ns iterations, 12 in the first "on" window, 11 in the second; one straddles the first window's end
    its = [(t, 12) for t in range(0, 84, 12)] + [(95, 12)] + [(t, 10) for t in range(100, 200, 10)]
    its += [(t, 11) for t in range(200, 289, 11)] + [(t, 10) for t in range(300, 400, 10)]
    got = tick_cost.slowdowns(pd.DataFrame(its, columns=["t0", "ns"]), windows)
    assert got == pytest.approx([0.2, 0.1])


@pytest.mark.skipif(os.geteuid() != 0, reason="system-wide perf events and BPF need root")
def test_the_empty_program_attaches_to_a_tick_event():
    fds, program = tick_cost.tick_events(100), tick_cost.empty_program()
    try:
        assert len(fds) == len(os.sched_getaffinity(0)) and program > 0
        for fd in fds:
            fcntl.ioctl(fd, tick_cost.PERF_EVENT_IOC_SET_BPF, program)
        info = open(f"/proc/self/fdinfo/{program}").read()
        assert "prog_type:\t7\n" in info and "verified_insns:\t2\n" in info  # BPF_PROG_TYPE_PERF_EVENT, r0 = 0; exit
    finally:
        for fd in fds + [program]:
            os.close(fd)
