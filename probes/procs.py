"""Child processes that cannot outlive daskprobe, and their orderly teardown."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

from .rundir import open_append
from .users import User

_PR_SET_PDEATHSIG = 1
_PR_SET_PTRACER = 0x59616D61
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = struct.Struct("16sH14x")  # struct ifreq: the interface's name, then its flags
_libc = ctypes.CDLL(None, use_errno=True)


def own_network() -> None:
    """Move this process (and what it starts from now on) into a network namespace of its own, with
    loopback up and no other interface: for a cluster whose listeners bind every interface and check no
    peer (UCX). Root only (CAP_SYS_ADMIN); call it before any other thread starts, as it moves the
    calling thread alone."""
    if _libc.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = _IFREQ.unpack(fcntl.ioctl(s, _SIOCGIFFLAGS, _IFREQ.pack(b"lo", 0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", flags | _IFF_UP))


def our_child(death: int = signal.SIGTERM) -> None:
    """In a child before it runs its program: die with daskprobe, by `death` (if daskprobe is
    SIGKILLed nothing can clean up: the kernel does it), and let daskprobe's
    descendants read its memory where Yama restricts ptrace to ancestors (the
    sampler is the child's sibling, not its ancestor; a no-op without Yama)."""
    _libc.prctl(_PR_SET_PDEATHSIG, death)
    _libc.prctl(_PR_SET_PTRACER, os.getppid(), 0, 0, 0)


def lower(pid: int, nice: int) -> None:
    """Run a helper, process `pid` alone in its session (0: this one, in spawn's child), `nice` below
    daskprobe against the cluster too. Where the kernel groups sessions (autogroup: built in, enabled,
    and the processes in the root cpu cgroup), a session competes with the cluster's sessions as a
    group weighted by the group's nice, 0 for each new session: a process's own nice orders it only
    among its group's threads. So the group gets `nice` as well."""
    with contextlib.suppress(OSError):  # gone already
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
    for _ in range(3):  # without CAP_SYS_ADMIN, one write a machine may make every 100 ms
        try:
            fd = os.open(f"/proc/{pid or 'self'}/autogroup", os.O_WRONLY)
            try:
                os.write(fd, str(nice).encode())
            finally:
                os.close(fd)
            return
        except BlockingIOError:
            time.sleep(0.11)
        except OSError:  # no autogroup in this kernel, or gone
            return


def pin(cpus: frozenset[int] | None) -> None:
    """In a child before it runs its program: these CPUs alone (None: any), for it and every thread and
    process it starts."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def spawn(cmd: list[str], log: Path, env: dict | None = None, nice: int = 0, group: bool = True,
          user: User | None = None, death: int = signal.SIGTERM, cpus: frozenset[int] | None = None,
          **kw) -> subprocess.Popen:
    """Start a cluster process in its own session (so a terminal's Ctrl-C reaches
    only the user's command), logging to `log`, dying by `death` if daskprobe dies, as `user` if given,
    on `cpus` alone if given. nice > 0 lowers its priority (for helpers that must not slow what they
    measure): its session's group's too (lower) unless `group` is false."""
    if user:
        kw |= user.popen()
        env = user.env(env if env is not None else dict(os.environ))
    out = open_append(log)
    kw.setdefault("stdout", out)
    kw.setdefault("stdin", subprocess.DEVNULL)

    def setup() -> None:
        our_child(death)
        pin(cpus)
        if nice and group:
            lower(0, nice)
        elif nice:
            os.nice(nice)

    return subprocess.Popen(cmd, stderr=out, env=env, start_new_session=True, preexec_fn=setup, **kw)


# Processes whose work is done but whose exit takes a while (the eBPF agent's kernel detaching
# its probes, a Dask process's atexit handlers and non-daemon threads after it logged its end),
# each with when it was told to stop: the run goes on meanwhile, and reaps them before it ends.
EXITING: dict[subprocess.Popen, float] = {}


def reap_exiting(grace: float = 5.0) -> list[subprocess.Popen]:
    """Wait for them until `grace` seconds after each was told to stop; SIGKILL any still there
    (say, a thread that is not a daemon keeps its interpreter up). Those killed."""
    killed = [p for p, told in EXITING.items() if not _ended(p, told + grace) and _kill(p)]
    EXITING.clear()
    return killed


def stop(procs: list[subprocess.Popen], grace: float = 5.0, done=None) -> list[subprocess.Popen]:
    """SIGTERM each process group, wait up to `grace` seconds, then SIGKILL; those killed. A process
    for which `done(p)` turns true has finished what matters before it exits: it is left to exit in
    the background (EXITING) instead of waited for."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        _signal_group(p, signal.SIGTERM)
    told = time.monotonic()
    return [p for p in live if not _ended(p, told + grace, done, told) and _kill(p)]


def _ended(p: subprocess.Popen, deadline: float, done=None, told: float = 0.0) -> bool:
    if done is None:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False
    while p.poll() is None:
        if done(p):
            EXITING[p] = told
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _kill(p: subprocess.Popen) -> bool:
    _signal_group(p, signal.SIGKILL)
    p.wait()
    return True


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def log_tail(log: Path, chars: int = 3000) -> str:
    """About the last `chars` characters (the last bytes, as read: a log can be long)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - chars))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no log)"
