"""One piece of finalizing in a forked child while this process does another: once
the cluster is gone its cores are free, and a fork shares the tables already read."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator


class ChildFailed(Exception):
    """fn raised in the child (its message: the exception's), or the child died."""


@contextlib.contextmanager
def beside(fn: Callable[[], object]) -> Iterator[Callable[[], object]]:
    """Run fn() in a forked child while the with-body runs here. Yields join(): fn's result
    (JSON-able), or ChildFailed; called in the body, it waits for the child. Leaving the body
    waits for the child; leaving it by an exception (a signal) first sends the child SIGTERM."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    # The child starts with SIGINT and SIGTERM held, until it is inside _child: one that landed sooner
    # (the parent's, its body failed) would unwind it through the parent's frames, running them there.
    mask, pid = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}), None
    try:
        pid = os.fork()
    except OSError:  # no fork now (memory, a process limit): fn runs here, when joined
        pass
    finally:
        if pid != 0:  # the parent, with or without a child: its signals as they were
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if pid is None:
        os.close(r)
        os.close(w)
        yield lambda: _in_place(fn)
        return
    if pid == 0:
        _child(fn, r, w, mask)
    os.close(w)
    reader, outcome = os.fdopen(r), {}

    def wait():
        if not outcome:
            report = reader.read()  # a signal may interrupt it: asked again (leaving the body), it reads on
            reader.close()
            os.waitpid(pid, 0)
            with contextlib.suppress(ValueError):  # cut short: as if nothing came
                outcome.update(json.loads(report))
            if not outcome:
                outcome["error"] = "its process ended without a word"

    def join():
        wait()
        if "error" in outcome:
            e = ChildFailed(outcome["error"])
            e.add_note(outcome.get("traceback", ""))  # printed with the parent's, after what it says
            raise e
        return outcome["result"]
    try:
        yield join
    except BaseException:
        if not outcome:
            os.kill(pid, signal.SIGTERM)
        raise
    finally:
        wait()


def _in_place(fn):
    try:
        return fn()
    except Exception as e:
        raise ChildFailed(f"{type(e).__name__}: {e}") from e


def _child(fn, r: int, w: int, mask: set) -> None:
    """Run fn, write its result or error to the pipe, end without the parent's exit handlers. `mask`:
    the parent's signal mask, taken back here, where a signal is caught."""
    outcome = {"error": "interrupted"}
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(r)
        outcome = {"result": fn()}
    except BaseException as e:  # a signal's Interrupted too: the parent decides what it means
        outcome = {"error": f"{type(e).__name__}: {e}" if str(e) else type(e).__name__,
                   "traceback": "in the child process:\n" + traceback.format_exc()}
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # nothing unwinds past here
        with contextlib.suppress(BaseException):
            os.write(w, json.dumps(outcome, default=str).encode())
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)


class Gate:
    """A one-way go from this process to a child forked after it was made: open() here, wait()
    there (a pipe's end of file: a parent that dies opens it too). Where the piece runs in this
    process instead (no fork), it runs after the body, so wait() finds the gate open."""

    def __init__(self):
        self.r, self.w = os.pipe()
        self.opened, self.waited = False, 0.0

    def open(self) -> None:
        if not self.opened:
            self.opened = True
            os.close(self.r)
            os.close(self.w)

    def wait(self) -> None:
        """In the child: block until the parent opens the gate; `waited` says how long."""
        if self.opened:
            return
        start = time.perf_counter()
        os.close(self.w)  # the child's copy: else the parent closing its own is never seen
        os.read(self.r, 1)
        os.close(self.r)
        self.opened, self.waited = True, time.perf_counter() - start


class Queue:
    """Items (0-255) that this process and a child forked after it was made take in turn, each the
    next one left: neither waits while the other has a long one. A pipe holds them; a read of one
    byte takes one, and the end of the pipe says none is left."""

    def __init__(self, n: int):
        self.r, w = os.pipe()
        os.write(w, bytes(range(n)))
        os.close(w)

    def __iter__(self) -> Iterator[int]:
        while item := os.read(self.r, 1):
            yield item[0]

    def close(self) -> None:
        os.close(self.r)
