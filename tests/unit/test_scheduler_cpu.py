"""--scheduler-cpu: the CPUs the scheduler and the rest get, and what is refused before anything starts."""

import os

import pytest

from daskprobe.tracer.capture.cluster import ClusterSpec


def test_the_scheduler_gets_its_cpu_and_the_rest_the_others(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    spec = ClusterSpec(workers=3, scheduler_cpu=2)
    assert spec.cpus("scheduler") == {2} and spec.cpus("worker") == spec.cpus("client") == {0, 1, 3}
    assert spec.threads == 1  # the workers' three CPUs over three workers, the scheduler's apart
    assert ClusterSpec(workers=3).cpus("worker") is None


@pytest.mark.parametrize("allowed, cpu", [({0, 1}, 5), ({3}, 3)])
def test_a_cpu_not_ours_or_none_left_for_the_rest_is_refused(monkeypatch, allowed, cpu):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: allowed)
    with pytest.raises(ValueError, match=f"--scheduler-cpu {cpu}: the CPUs daskprobe may use are"):
        ClusterSpec(workers=2, scheduler_cpu=cpu)
