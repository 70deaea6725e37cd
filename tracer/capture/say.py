"""What daskprobe says and records as it goes: its lines on stderr, and run.json updates that a full
disk does not stop. Every stage uses these, so they import nothing of the stages."""

from __future__ import annotations

import os
import sys

from ...probes.rundir import RunDir


def say(msg: str) -> None:
    # Our own words go to stderr: the command's stdout passes through untouched. A
    # closed stderr (`daskprobe run ... | head`) must not stop the run's finalizing.
    try:
        sys.stderr.write(f"daskprobe: {msg}\n")  # one write: a stage in a child process says things too
        sys.stderr.flush()
    except OSError:
        pass


def record(run: RunDir, **fields) -> None:
    """Update run.json; on a full disk, say so (naming the disk) and go on: the user's
    command and exit code matter more than our bookkeeping."""
    try:
        run.update_meta(**fields)
    except OSError as e:
        say(f"could not update {run / 'run.json'}: {e.strerror} ({disk_of(run.path)})")


def disk_of(path) -> str:
    """The filesystem holding path, and its free space, for messages about a full disk."""
    path = os.path.realpath(path)
    mount = path
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    st = os.statvfs(path)
    return f"the filesystem at {mount} has {st.f_bavail * st.f_frsize / 2**20:.0f} MiB free"
