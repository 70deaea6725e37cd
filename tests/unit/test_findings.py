"""Findings fire on the evidence that calls for them, and stay quiet without it."""

from daskprobe.analyzers.summary import analyze
from scenario import Scenario
from test_attribution import META, two_task_chain


def found(s: Scenario) -> dict:
    return {f["id"]: f for f in analyze(s.tables(), META).summary["findings"]}


def short_session(s: Scenario) -> Scenario:
    """A chain whose client connects just before submitting and leaves just after its result."""
    return two_task_chain(s, connect=9, leave=67)


def test_recomputed_keys_name_their_prefix_and_a_single_computation_names_none():
    s = Scenario()
    for t in (0, 100):
        s.graph(t, t + 1, ["y-0"])
        s.task("x-0", "worker-0", t + 2, t + 3, t + 4, t + 14, t + 15, t + 16)
        s.task("y-0", "worker-0", t + 17, t + 18, t + 19, t + 29, t + 30, t + 31, deps=["x-0"])
        s.told("y-0", t + 32, t + 33)
    f = found(s)["recomputed"]
    assert "2 keys" in f["title"] and "'x'" in f["evidence"] or "'y'" in f["evidence"]
    assert "recomputed" not in found(short_session(Scenario()))


def test_client_time_between_computations_is_a_finding_only_when_it_is_large():
    s = Scenario()
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 26)
    s.told("a-0", 27, 28)
    s.graph(1028, 1029, ["b-0"])
    s.task("b-0", "worker-1", 1030, 1031, 1032, 1042, 1043, 1044)
    s.told("b-0", 1045, 1046)
    assert next(iter(found(s))) == "client"
    assert "client" not in found(short_session(Scenario()))


def test_a_task_waiting_for_a_busy_thread_is_worker_saturation():
    s = Scenario()
    s.graph(0, 1, ["a-0", "b-0"])
    s.task("a-0", "worker-0", 2, 3, 4, 54, 55, 56)
    s.task("b-0", "worker-0", 2, 3, 54, 64, 65, 66)  # arrived at 3, its thread free only at 54
    s.told("a-0", 57, 58)
    s.told("b-0", 67, 68)
    assert "worker-saturation" in found(s)
    assert "worker-saturation" not in found(short_session(Scenario()))


def test_gil_contention_names_the_thread_that_held_the_gil():
    s = short_session(Scenario())
    s.state("scheduler", "gil", 36, 44)  # the scheduler's loop waits for the GIL between a-0 and b-1
    for t in (36.5, 38.5, 40.5, 42.5):
        s.sample("scheduler", t, "spin", "/home/me/plugin.py", tid=101, name="busy-plugin")
    f = found(s)["gil-contention"]
    assert "thread 'busy-plugin' of scheduler, in spin (plugin.py:1)" in f["evidence"], f
    assert "gil-contention" not in found(short_session(Scenario()))
