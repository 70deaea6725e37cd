"""tracer/decode/forked.py: a piece of finalizing in a forked child."""

import os
import signal
import time

import pytest

from daskprobe.tracer.decode.forked import ChildFailed, Gate, Queue, beside


def test_the_childs_result_comes_back_and_both_sides_ran_at_once():
    def child():
        start = time.monotonic()  # CLOCK_MONOTONIC: one clock for both processes
        time.sleep(0.5)
        return {"pid": os.getpid(), "slept": [start, time.monotonic()]}
    with beside(child) as joined:
        start = time.monotonic()
        time.sleep(0.5)
        here = [start, time.monotonic()]
    got = joined()
    assert got["pid"] != os.getpid()
    # the two sleeps overlapped, however late a busy machine ran either (one after the other: they would not)
    there = got["slept"]
    assert there[0] < here[1] and here[0] < there[1], (here, there)


def test_join_in_the_body_waits_for_the_child():
    def child():
        time.sleep(0.3)
        return "done"
    with beside(child) as joined:
        assert joined() == "done"
        assert joined() == "done"  # once answered, asked again
    assert joined() == "done"


def test_an_error_in_the_child_is_raised_by_join_with_the_childs_traceback():
    def child():
        raise OSError(28, "No space left on device")
    with beside(child) as joined:
        pass
    with pytest.raises(ChildFailed, match="OSError: .*No space left") as e:
        joined()
    assert "in the child process" in "".join(e.value.__notes__) and "def child" not in str(e.value)


def test_a_body_that_is_interrupted_stops_the_child_and_leaves_no_process(tmp_path):
    def child():
        (tmp_path / "pid").write_text(str(os.getpid()))
        time.sleep(60)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with beside(child) as joined:
            while not (tmp_path / "pid").exists():
                time.sleep(0.01)
            raise KeyboardInterrupt
    assert time.monotonic() - start < 30
    with pytest.raises(ChildFailed):
        joined()  # SIGTERM ended it before it could answer
    assert not os.path.exists(f"/proc/{(tmp_path / 'pid').read_text()}")  # and it was reaped


def test_a_signal_as_the_child_starts_ends_the_child_not_runs_the_parents_code(tmp_path, monkeypatch):
    """The parent's SIGTERM (its body failed) may land before the child runs anything of its own (a busy
    machine): raised there, it unwound through the parent's frames, which then ran in the child (it
    waited for its sibling, ECHILD, and wrote run.json). Here SIGINT lands at the child's first instruction."""
    real_fork, parent, ran, caught = os.fork, os.getpid(), tmp_path / "ran-the-parents-code", None

    def fork():
        pid = real_fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return pid
    monkeypatch.setattr(os, "fork", fork)
    # Python's own SIGINT handler, whatever an earlier test in this process left
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with beside(lambda: "done") as joined:
            joined()
    except (KeyboardInterrupt, ChildFailed) as e:
        caught = e
    finally:
        if os.getpid() != parent:  # the child, here: say so and go
            ran.write_text("")
            os._exit(0)
        signal.signal(signal.SIGINT, handler)
    assert not ran.exists()
    assert isinstance(caught, ChildFailed) and "KeyboardInterrupt" in str(caught)


def test_without_fork_the_piece_runs_here_after_the_body(monkeypatch):
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(os, "fork", no_fork)
    ran = []
    with beside(lambda: ran.append("piece") or {"pid": os.getpid()}) as joined:
        ran.append("body")
    assert joined()["pid"] == os.getpid() and ran == ["body", "piece"]
    with beside(lambda: 1 / 0) as joined:
        pass
    with pytest.raises(ChildFailed, match="ZeroDivisionError"):
        joined()


def test_a_gate_holds_the_child_until_the_body_opens_it(tmp_path):
    gate, mark = Gate(), tmp_path / "opened"

    def child():
        gate.wait()
        return {"saw_mark": mark.exists(), "waited": gate.waited}
    with beside(child) as joined:
        time.sleep(0.3)
        mark.touch()  # before the gate opens: the child must see it
        gate.open()
    got = joined()
    assert got["saw_mark"] and got["waited"] >= 0.25


def test_a_gate_never_opened_is_opened_by_a_body_that_fails():
    gate = Gate()
    with pytest.raises(KeyError):
        try:
            with beside(lambda: gate.wait() or "through") as joined:
                raise KeyError("analysis failed")
        finally:
            gate.open()
    with pytest.raises(ChildFailed):  # the failed body stopped the child (SIGTERM), and it is gone
        joined()


def test_without_fork_a_gate_is_open_when_the_piece_runs(monkeypatch):
    monkeypatch.setattr(os, "fork", lambda: (_ for _ in ()).throw(OSError(12, "Cannot allocate memory")))
    gate = Gate()
    with beside(lambda: gate.wait() or "ran") as joined:
        gate.open()
    assert joined() == "ran"


def test_a_queue_gives_each_item_to_one_process_and_the_slow_one_takes_fewer():
    queue = Queue(40)
    def take(pause):
        got = []
        for item in queue:
            got.append(item)
            time.sleep(pause)
        return got
    with beside(lambda: take(0.05)) as theirs:
        mine = take(0.005)
    queue.close()
    assert sorted(mine + theirs()) == list(range(40))
    assert len(mine) > len(theirs())  # ten times faster per item: it took more of them
