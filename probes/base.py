"""What every probe offers the session: a check, a start, processes to watch, a stop."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import signal
import sysconfig
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from .rundir import RunDir

if TYPE_CHECKING:  # imported by the readers: starting a run needs no pandas
    import pandas as pd


CLUSTER_ROLES = frozenset({"scheduler", "worker", "nanny", "client", "proxy"})
# Samplers stamp their own times (the sampler at each read, BPF in the kernel),
# so a low priority delays only their bookkeeping, never a timestamp; on a
# busy 2-core machine it keeps them from taking CPU from the cluster. Each
# helper is a session of its own: its session's group gets the nice too
# (procs.lower), else its nice would weigh only against its own threads.
HELPER_NICE = 10
# The Python sampler wakes at a CPU tick that found a cluster thread running whose stack BPF could not
# copy (tickprog.rs), to read it then, and every 200 ms: at the lowest priority it waits its turn on a CPU
# the cluster uses (a read that comes late and finds the thread asleep is left out, probes.md). Its
# session's group keeps nice 0: at 19 there (weight 15), starved beside spinning workers, it missed a
# remote worker's 0.24 s of spinning altogether (test_hosts, one CI rehearsal of three).
SAMPLER_NICE = 19
# s; the cluster is idle then, and a read of every process takes milliseconds
LAST_READ_TIMEOUT = 3.0


class Probe:
    name = "?"
    roles = CLUSTER_ROLES  # processes this probe watches, by role
    proc = None            # its own helper process, if it has one
    error = None           # why it stopped capturing before the end, if it did (a full disk, say)

    def available(self) -> str | None:
        """None if this probe can run here, else why not (shown to the user, kept in run.json)."""
        return None

    def start(self, run: RunDir, ports: set[int] = frozenset()) -> None:
        """Begin capturing into run/captures; ports are the cluster's listening ports."""

    def ready(self) -> None:
        """Return once capturing works; raise if it cannot. start() returns before, so that a slow
        start (the eBPF agent compiles its programs) overlaps the cluster's."""

    def partly_skipped(self) -> dict[str, str]:
        """Parts of this probe that could not run here, and why."""
        return {}

    def watch(self, proc: dict) -> None:
        """A process to observe from now on: a row of run.json's `processes`
        (pid, name, role, listen and contact addresses)."""

    def last_read(self, timeout: float) -> None:
        """Read what it reads on a timer once more, now, within `timeout` seconds: the command has
        ended, the cluster not yet (attached: the recording ends, the cluster goes on)."""

    def write_open(self, timeout: float) -> None:
        """Write what it holds unfinished as if it ended now, within `timeout` seconds: an agent's
        captures are read while it runs, and any read may be its host's last (its last member gone,
        nothing left to ask the agent through)."""

    def stop(self, grace: float = 5.0) -> None:
        """Stop capturing; a helper process gets `grace` seconds to exit on its own."""

    def died(self) -> str | None:
        """Why its helper process ended while it should have been capturing, if it did."""
        return ended_early(self.proc)

    def process_row(self) -> dict | None:
        """Its helper process as a `processes` row (role "probe"), so its cost is measured too."""
        if self.proc is None:
            return None
        return {"name": f"probe:{self.name}", "role": "probe", "pid": self.proc.pid,
                "listen": None, "contact": None, "command": list(map(str, self.proc.args))}


def native_binary(name: str) -> str | None:
    """One of daskprobe's Rust binaries (daskprobe-proxy, ...): named by $DASKPROBE_PROXY and so on, else
    where pip installed it with daskprobe (any scheme: a venv, --user, --prefix), else this interpreter's
    scripts directory (a checkout's .venv/bin, where setup.sh installs them too), else on PATH."""
    env = os.environ.get(name.upper().replace("-", "_"))  # daskprobe-proxy: $DASKPROBE_PROXY
    scripts = Path(sysconfig.get_path("scripts")) / name
    for c in (env, installed_file(_own_distribution(), name), str(scripts), shutil.which(name)):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def missing_binary(name: str) -> str:
    """What to do when native_binary found nothing."""
    return (f"{name} is not installed: pip install daskprobe builds it (it needs cargo), "
            "or ./setup.sh in a checkout")


@functools.cache
def _own_distribution() -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution("daskprobe")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return None


def installed_file(dist: importlib.metadata.Distribution | None, name: str) -> str | None:
    """The file called `name` that the installer recorded putting in place with `dist` (its RECORD;
    a wheel's scripts land outside site-packages, in the scheme's scripts directory)."""
    found = (f for f in (dist and dist.files or ()) if f.name == name)
    return next((os.path.normpath(f.locate()) for f in found), None)


def is_root() -> bool:
    return os.geteuid() == 0


def capture_lines(path: Path) -> list[str]:
    """The lines of a text capture, split on newlines only: read_text() would
    also break on a stray \r in a sampled name. What follows the last newline is
    a line a kill or a full disk cut short (its last number may read whole): left
    out. A missing file has none."""
    return path.read_bytes().decode("utf-8", "replace").split("\n")[:-1] if path.exists() else []


# An integer field of a tab-separated capture, as tsv_rows takes it: at most 18 digits, so that it
# fits an int64 whatever a corrupted line holds (a table's column would not be one otherwise).
INT = r"-?[0-9]{1,18}"


def as_int(text: str) -> int:
    """An integer field read one at a time (a stack sampler's line; faster than INT's match): a
    ValueError unless it is an integer an int64 holds."""
    value = int(text)
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"{text[:20]}...: more than an int64 holds")
    return value


def tsv_rows(path: Path, columns: dict[str, str], malformed: Counter | None = None) -> pd.DataFrame:
    """The rows of a tab-separated capture with exactly these columns, typed. A line with
    other fields (a torn or corrupted one: too few or too many, or a number that is not
    one) is left out, never the file, and counted in malformed[path.name]."""
    import pandas as pd
    lines = capture_lines(path)
    rows = [r for r in (line.split("\t") for line in lines) if len(r) == len(columns)]
    df = pd.DataFrame(rows, columns=list(columns), dtype=object)
    ints = [c for c, kind in columns.items() if kind == "int64"]
    whole = pd.Series(True, index=df.index)
    for c in ints:
        whole &= df[c].str.fullmatch(INT).fillna(False).astype(bool)
    df = df[whole].astype(columns).reset_index(drop=True)
    if malformed is not None:
        malformed[path.name] += len(lines) - len(df)
    return df


def ended_early(proc) -> str | None:
    """How a helper process that should still run has ended (None if it runs or there is none)."""
    code = proc.poll() if proc is not None else None
    if code is None:
        return None
    try:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    except ValueError:  # a real-time signal has no name
        how = f"killed by signal {-code}"
    return f"its process ended during the run ({how}): nothing was captured after that"
