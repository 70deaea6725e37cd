"""Dask's local schedulers (threads, processes, sync), recorded from inside the command's Python: the
client hook's feature (daskprobe_hook.py) and the one definition of its capture, LINES, which
probes/local_scheduler.py reads.

Dask runs a local scheduler's loop (dask.local.get_async) in the thread that called compute, and the
tasks in a pool (threads, processes, or that same thread). Its callbacks (dask.callbacks.Callback:
start, pretask, posttask, finish) run in the loop's thread, so they time a task from its dispatch to
its result's bookkeeping; where the task ran and when comes from dask.local.execute_task, wrapped
here: it runs in the pool, and says when its thread entered it, when the task's inputs were
unpacked, when the task's function returned and when it left.

Cheap and crash-safe: lines go to a buffer flushed by one write (O_APPEND) at each job's start and
end, every FLUSH_LINES lines or FLUSH_NS, and at exit; a process that runs tasks and no job of its
own (a pool process) writes its lines at once, since nothing tells it when it will be ended. Each
process appends to a file of its own in the directory daskprobe names in ENV_DIR. Only the outermost
compute of a thread is recorded (Dask gives global callbacks to the outermost scheduler only), and
only computes that do not pass callbacks= of their own. Standard library only; dask is touched once
the command has imported it.
"""

from __future__ import annotations

import os
import threading
import time

ENV_DIR = "DASKPROBE_LOCAL_CAPTURES"  # the directory daskprobe gives the command for these captures
PREFIX, SUFFIX = "local_scheduler.", ".tsv"  # each process's file: PREFIX + pid + SUFFIX
# The capture's one definition: each line is its kind's letter, then these fields, tab-separated.
# int: decimal; flag: 0 or 1; key: a task's key as str() gives it, tabs, newlines and \x1f made
# spaces; keys: such keys joined by \x1f (none: empty); ident: threading.get_ident().
LINES = {
    "H": ("t_ns:int pid:int ppid:int", "the hook began recording in this process"),
    "J": ("t_ns:int pid:int tid:int job:int tasks:int",
          "a local scheduler began a job (the start callback) in this thread; job: its number in this "
          "process, from 0; tasks: the graph's tasks"),
    "P": ("t_ns:int pid:int tid:int job:int key:key deps:keys",
          "the scheduler's loop dispatched a task (pretask), with its dependencies"),
    "X": ("pid:int tid:int ident:int key:key enter_ns:int loaded_ns:int computed_ns:int exit_ns:int failed:flag",
          "a pool's thread ran a task (execute_task): entered, had unpacked the task and its inputs, had "
          "the task's result (0 when it raised), left (its result packed)"),
    "T": ("t_ns:int pid:int tid:int job:int key:key worker:str",
          "the loop had taken the task's result in (posttask); worker: the id Dask gives where it ran (a "
          "thread's ident, a process's pid; empty for sync)"),
    "F": ("t_ns:int pid:int tid:int job:int errored:flag", "the job ended (the finish callback)"),
}
FLUSH_LINES = 512
FLUSH_NS = 100_000_000
_CLEAN = str.maketrans("\t\n\r\x1f", "    ")


class _Writer:
    def __init__(self, directory: str):
        self.directory, self.lines, self.fd, self.pid = directory, [], None, os.getpid()
        self.last_flush = time.monotonic_ns()
        self.lock = threading.Lock()
        self.jobs = 0          # jobs begun in this process
        self.running = 0       # jobs running in this process now
        self.local = threading.local()

    def add(self, line: str, urgent: bool = False) -> None:
        self.lines.append(line)  # list.append is atomic: pool threads add beside the loop
        if urgent or len(self.lines) >= FLUSH_LINES or time.monotonic_ns() - self.last_flush >= FLUSH_NS:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            lines, self.lines = self.lines, []
            self.last_flush = time.monotonic_ns()
            if not lines:
                return
            try:
                if self.fd is None:
                    name = os.path.join(self.directory, f"{PREFIX}{os.getpid()}{SUFFIX}")
                    self.fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                                      0o600)
                os.write(self.fd, "".join(lines).encode("utf-8", "replace"))
            except OSError:  # a full disk or a directory gone: the command goes on, the lines are lost
                pass

    def forked(self) -> None:
        """In a forked child: the parent's unwritten lines are the parent's, its file too."""
        self.lines, self.fd, self.pid, self.jobs, self.running = [], None, os.getpid(), 0, 0
        self.lock = threading.Lock()
        self.local = threading.local()


_w: _Writer | None = None


def _key(key) -> str:
    text = str(key)
    return text if text.isprintable() else text.translate(_CLEAN)  # no tab, newline or \x1f: as it is


def _here() -> str:
    """"PID\tTID" of the calling thread, made once per thread (each costs a system call)."""
    try:
        return _w.local.here
    except AttributeError:
        here = _w.local.here = f"{os.getpid()}\t{threading.get_native_id()}"
        return here


def _safe(fn):
    """A callback that fails records no more, said once: the compute goes on as without us."""

    def safe(*args):
        global _w
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - Dask would raise it into the user's compute
            if _w is not None:
                _w = None
                from daskprobe_hook import failed
                failed("local_scheduler", e)
    return safe


@_safe
def _start(dsk) -> None:
    stack = getattr(_w.local, "jobs", None)
    if stack is None:
        stack = _w.local.jobs = []
    job, _w.jobs = _w.jobs, _w.jobs + 1
    stack.append(job)
    _w.running += 1
    _w.add(f"J\t{time.monotonic_ns()}\t{_here()}\t{job}\t{len(dsk)}\n", urgent=True)


def _job() -> int:
    stack = getattr(_w.local, "jobs", None)
    return stack[-1] if stack else -1


@_safe
def _pretask(key, dsk, state) -> None:
    t = time.monotonic_ns()
    deps = "\x1f".join(_key(d) for d in state["dependencies"].get(key, ()))
    _w.add(f"P\t{t}\t{_here()}\t{_job()}\t{_key(key)}\t{deps}\n")


@_safe
def _posttask(key, result, dsk, state, worker_id) -> None:
    t = time.monotonic_ns()
    worker = "" if worker_id is None else str(worker_id).translate(_CLEAN)
    _w.add(f"T\t{t}\t{_here()}\t{_job()}\t{_key(key)}\t{worker}\n")


@_safe
def _finish(dsk, state, errored) -> None:
    t = time.monotonic_ns()
    stack = getattr(_w.local, "jobs", None)
    job = stack.pop() if stack else -1
    _w.running -= 1
    _w.add(f"F\t{t}\t{_here()}\t{job}\t{int(bool(errored))}\n", urgent=True)


def _wrap(execute_task):
    """dask.local.execute_task, timed: Dask passes it the loads and get_id it calls just after
    unpacking the task and just after the task's function returned."""

    def timed(key, task_info, dumps, loads, get_id, pack_exception):
        enter, marks = time.monotonic_ns(), [0, 0]

        def loads_(x):
            out = loads(x)
            marks[0] = time.monotonic_ns()
            return out

        def get_id_():
            marks[1] = time.monotonic_ns()
            return get_id()

        out = execute_task(key, task_info, dumps, loads_, get_id_, pack_exception)
        end = time.monotonic_ns()
        if _w is not None:
            _w.add(f"X\t{_here()}\t{threading.get_ident()}\t{_key(key)}\t{enter}\t{marks[0] or enter}\t{marks[1]}"
                   f"\t{end}\t{int(bool(out[2]))}\n", urgent=not _w.running)
        return out

    timed.__wrapped__ = execute_task
    return timed


def _dask_local(module) -> None:
    if not getattr(module.execute_task, "__wrapped__", None):
        module.execute_task = _wrap(module.execute_task)
        # a process that uses no dask writes none; a pool's process says so at once (daskprobe follows it then)
        _w.add(f"H\t{time.monotonic_ns()}\t{os.getpid()}\t{os.getppid()}\n", urgent=not _w.running)


def _dask_callbacks(module) -> None:
    module.Callback(start=_start, pretask=_pretask, posttask=_posttask, finish=_finish).register()


def install() -> None:
    """Record if daskprobe gave a directory; the hooks go in once the command imports dask's modules."""
    global _w
    directory = os.environ.get(ENV_DIR)
    if not directory or not os.path.isdir(directory):
        return
    _w = _Writer(directory)
    import atexit
    atexit.register(_w.flush)
    os.register_at_fork(after_in_child=_w.forked)
    from daskprobe_hook import on_import
    on_import("dask.callbacks", _dask_callbacks)
    on_import("dask.local", _dask_local)
