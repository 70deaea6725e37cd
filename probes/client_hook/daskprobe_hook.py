"""The client hook's mechanism: code that runs inside the user's command's Python.

`daskprobe run` puts this directory first on the command's PYTHONPATH; its sitecustomize.py (which
chains any other sitecustomize on the path) calls install(FEATURES). What runs here runs in the
user's interpreter, as the user, maybe without daskprobe's dependencies: the standard library only,
and a feature touches dask or distributed only once the user's code has imported them (on_import):
importing them here would cost every command their import time, used or not. Nothing here may cost
the command its result: a feature that fails is said once on stderr, reported to daskprobe, and the
command goes on without it.

Registration: sitecustomize.FEATURES names the feature modules, files beside this one called
daskprobe_hook_*.py (one prefix: nothing of the user's path is shadowed). Each has `install()`,
called at start-up, which must be cheap; it registers callbacks with on_import(NAME, fn), and `fn`
is called with the module NAME once its code has run (at once if it already has), before the
importer sees it.

To daskprobe: send(kind, **fields) writes one JSON object on one line, at most MAX_LINE bytes (a
pipe's atomic write, so lines of several processes never interleave), to the pipe daskprobe passed
in ENV_PIPE ("FD:INODE": a child that did not inherit the pipe may have another file at that fd
number; the inode tells them apart). The pipe does not block: a line the pipe has no room for is
dropped. daskprobe reads the lines as plain JSON with caps (Channel, in this package's __init__),
never pickle.
"""

from __future__ import annotations

import os
import sys

ENV_PIPE = "DASKPROBE_HOOK_PIPE"        # "FD:INODE" of the write end of daskprobe's pipe
ENV_SCHEDULER = "DASKPROBE_HOOK_SCHEDULER"  # the address of daskprobe's cluster (run), for features to use
MAX_LINE = 4096                          # bytes of one line, its newline included (PIPE_BUF on Linux)

_callbacks: dict[str, list] = {}
_pipe_fd: dict[int, int | None] = {}  # by pid: a forked child checks again


def on_import(name: str, fn) -> None:
    """Call fn(module) once the module `name` has been imported (its code run), or now if it has."""
    if name in sys.modules:
        _call(fn, sys.modules[name])
        return
    _callbacks.setdefault(name, []).append(fn)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def send(kind: str, **fields) -> bool:
    """Report to daskprobe: one JSON line; False if there is no pipe or it had no room."""
    fd = _pipe()
    if fd is None:
        return False
    import json
    import time
    line = json.dumps({"kind": kind, "pid": os.getpid(), "ns": time.monotonic_ns(), **fields},
                      default=repr, separators=(",", ":")).encode() + b"\n"
    if len(line) > MAX_LINE:
        line = json.dumps({"kind": kind, "pid": os.getpid(), "truncated": len(line)}).encode() + b"\n"
    try:
        return os.write(fd, line) == len(line)
    except OSError:  # full (non-blocking), or daskprobe gone
        return False


def say(msg: str) -> None:
    """A line on the command's stderr, as daskprobe's own words (its prefix)."""
    try:
        sys.stderr.write(f"daskprobe: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # closed or no stderr
        pass


def install(features: tuple[str, ...]) -> None:
    """Install each feature module; one that fails is said and reported, the others go on."""
    import importlib
    for name in features:
        try:
            importlib.import_module(name).install()
        except Exception as e:  # noqa: BLE001 - the user's command must run whatever a feature does
            failed(name, e)


def failed(what: str, e: BaseException) -> None:
    say(f"client hook {what} failed ({type(e).__name__}: {e}); your command goes on without it")
    send("hook-error", what=what, error=f"{type(e).__name__}: {e}"[:500])


def _call(fn, module) -> None:
    try:
        fn(module)
    except Exception as e:  # noqa: BLE001
        failed(getattr(fn, "__module__", None) or repr(fn), e)


def _pipe() -> int | None:
    pid = os.getpid()
    if pid not in _pipe_fd:
        _pipe_fd[pid] = _check_pipe(os.environ.get(ENV_PIPE, ""))
    return _pipe_fd[pid]


def _check_pipe(value: str) -> int | None:
    import stat
    fd, _, inode = value.partition(":")
    if not (fd.isdigit() and inode.isdigit()):
        return None
    try:
        st = os.fstat(int(fd))
    except OSError:
        return None
    return int(fd) if stat.S_ISFIFO(st.st_mode) and st.st_ino == int(inode) else None


class _Finder:
    """On sys.meta_path, first: for a module with callbacks, finds its spec through the finders after
    it, and wraps the loader so the callbacks run once the module's code has."""

    def __init__(self):
        self._finding: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name not in _callbacks or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = next((s for f in sys.meta_path if f is not self and hasattr(f, "find_spec")
                         and (s := f.find_spec(name, path, target)) is not None), None)
        finally:
            self._finding.discard(name)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None  # the import goes on as without us (a module with no exec_module: not watched)
        spec.loader = _Loader(spec.loader, name)
        return spec


class _Loader:
    """The module's own loader, but for the callbacks after its code: the module keeps its real
    loader in __loader__ and __spec__.loader (resource readers and the like look there)."""

    def __init__(self, loader, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create else None

    def exec_module(self, module) -> None:
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        module = sys.modules.get(self.name, module)
        for fn in _callbacks.pop(self.name, []):
            _call(fn, module)

    def __getattr__(self, attr):
        return getattr(self.loader, attr)
