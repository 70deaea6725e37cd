"""The unit layer's guard (conftest.py) refuses every way a test could start a process."""

import asyncio
import multiprocessing
import os
import subprocess
import sys

import pytest

from conftest import StartedAProcess


@pytest.mark.parametrize("start", [
    lambda: subprocess.run(["true"]),
    lambda: subprocess.Popen([sys.executable, "-c", "1"]),
    lambda: os.fork(),
    lambda: os.system("true"),
    lambda: os.posix_spawn("/bin/true", ["true"], {}),
    lambda: asyncio.run(asyncio.create_subprocess_exec("true")),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: multiprocessing.get_context("fork").Process(target=print).start(),
    lambda: multiprocessing.get_context("forkserver").Process(target=print).start(),
], ids=["run", "popen", "fork", "system", "posix_spawn", "asyncio", "mp-spawn", "mp-fork", "mp-forkserver"])
def test_a_unit_test_cannot_start_a_process(start):
    with pytest.raises(StartedAProcess):
        start()
