"""A unit test starts no process: it runs in milliseconds on a busy machine and fails only for its own
code. Starting one (subprocess, multiprocessing, os.fork, os.posix_spawn, os.system) raises here;
a test that needs a process belongs in tests/integration."""

import _posixsubprocess
import os
import subprocess

import pytest


class StartedAProcess(AssertionError):
    pass


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise StartedAProcess(f"a unit test started a process ({what}): move it to tests/integration")
    return refuse


# subprocess and asyncio's subprocesses go through Popen; it and multiprocessing's spawn and forkserver
# through fork_exec (or posix_spawn); its fork context through os.fork
STARTS = [(subprocess.Popen, "__init__"), (_posixsubprocess, "fork_exec"), *((os, name) for name in (
    "fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv", "spawnve", "spawnvp", "spawnvpe")
    if hasattr(os, name))]


@pytest.fixture(autouse=True)
def no_process(monkeypatch):
    for owner, name in STARTS:
        monkeypatch.setattr(owner, name, _refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
