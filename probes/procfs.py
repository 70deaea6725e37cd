"""CPU time and RSS of every watched process from /proc, 5 times a second, and
the name of each of their threads.

A thread in daskprobe itself: one read of /proc/PID/stat per process and
tick, from a file kept open, and of the process's CPU clock (its CPU time in
ns, where stat counts 10 ms ticks: a probe's few ms a second, or a short
window's, are read to the microsecond). The captures are text, one line per
process per tick:
    proc.tsv     t_ns  pid  utime_ticks  stime_ticks  rss_pages  cpu_ns
and one line per thread not seen before (its kernel name, so that threads no
Python sampler names, native ones included, have one), looked for once a second
in the processes whose thread count changed, every 10 s and at the end in all
(listing every process's threads each second was a quarter of daskprobe's CPU):
    threads.tsv  pid  tid  comm
"""

from __future__ import annotations

import os
import select
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .base import CLUSTER_ROLES, Probe, tsv_rows
from .rundir import RunDir, open_append

if TYPE_CHECKING:  # the readers' tables come from tsv_rows
    import pandas as pd

CAPTURE = "proc.tsv"
THREADS = "threads.tsv"
NAMES_EVERY = 5  # ticks between scans for new threads where their count changed: once a second
ALL_NAMES_EVERY = 50  # and in every process, for a thread that ended as another started
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_ns(pid: int) -> int | None:
    """CPU time (user + system, every thread's, ended ones' too) the process has used so far, in ns,
    from its CPU clock (clock_getcpuclockid's, which Python does not wrap); None once it is gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the whole process
    except OSError:
        return None


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the live process `pid` has used so far."""
    if (ns := cpu_ns(pid)) is None:
        raise ProcessLookupError(pid)
    return ns / 1e9


class ProcFS(Probe):
    name = "proc"
    roles = CLUSTER_ROLES | {"probe"}

    # A timed wait costs 60-110 µs of CPU on a VM, more than a tick's reads: at 10 a second, this
    # thread was 0.8% of the CPU of a cluster running 10 ms tasks. Per-thread CPU comes from eBPF
    # and the samples; these readings are the processes' totals, for which 200 ms is enough.
    def __init__(self, rate: float = 5.0):
        self.period, self.pids, self.fds = 1.0 / rate, {}, {}
        self.thread = None
        self.counts, self.changed = {}, set()  # thread count by pid, as /proc/PID/stat last had it

    def start(self, run: RunDir, ports: set[int] = frozenset()) -> None:
        self.out = open_append(run / "captures" / CAPTURE, text=True)
        self.names, self.named = open_append(run / "captures" / THREADS, text=True), set()
        # told to stop through a pipe it polls: an Event's timed wait cost this VM 115 µs of CPU, a poll's 75
        self.stop_r, self.stop_w = os.pipe2(os.O_CLOEXEC)
        self.stopping = select.poll()
        self.stopping.register(self.stop_r, select.POLLIN)
        self.thread = threading.Thread(target=self._loop, name="daskprobe-procfs", daemon=True)
        self.thread.start()

    def watch(self, proc: dict) -> None:
        self.pids[proc["pid"]] = proc["name"]

    def stop(self, grace: float = 5.0) -> None:
        if self.thread:
            os.write(self.stop_w, b"x")
            self.thread.join()
            for fd in [*self.fds.values(), self.stop_r, self.stop_w]:
                os.close(fd)
            self.thread = None  # stopped: a second stop() has nothing to close
            for f in (self.out, self.names):
                try:
                    f.close()
                except OSError as e:
                    self.error = self.error or f"closing {Path(f.name).name}: {e.strerror}"

    def _loop(self) -> None:
        try:
            self._sample()
            self._name_threads(set(self.pids))
        except OSError as e:  # a full disk: stop capturing; what was written stays readable
            self.error = f"writing {CAPTURE} or {THREADS}: {e.strerror}"

    def _sample(self) -> None:
        next_tick, tick = time.monotonic(), 0
        while True:
            lines = []
            for pid in list(self.pids):
                if (fields := self._stat(pid)) is None or fields[0] in (b"Z", b"X") or fields[21] == b"0":
                    continue  # exiting (its memory already gone) or exited: nothing left to measure
                if (cpu := cpu_ns(pid)) is None:
                    continue
                lines.append(f"{time.monotonic_ns()}\t{pid}\t{int(fields[11])}\t{int(fields[12])}\t{int(fields[21])}"
                             f"\t{cpu}\n")
                if self.counts.get(pid) != fields[17]:
                    self.counts[pid] = fields[17]
                    self.changed.add(pid)
            if tick % ALL_NAMES_EVERY == 0:
                self._name_threads(set(self.pids))
            elif tick % NAMES_EVERY == 0:
                self._name_threads(self.changed)
            tick += 1
            self.out.write("".join(lines))
            self.out.flush()
            next_tick += self.period
            if self.stopping.poll(max(0, round((next_tick - time.monotonic()) * 1000))):
                return

    def _stat(self, pid: int) -> list[bytes] | None:
        """/proc/PID/stat after the command name, which may hold spaces ([0]: its state, [11] and [12]
        utime and stime in ticks, [17] its thread count, [21] RSS in pages), from a file kept open and
        read again in place (a ninth of the CPU of opening it each tick: 9 against 78 µs); None once
        the process is gone."""
        try:
            if pid not in self.fds:
                self.fds[pid] = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(self.fds[pid], 4096, 0).rsplit(b")", 1)[1].split()
        except OSError:  # gone (ENOENT at open, ESRCH at read once it was reaped)
            if (fd := self.fds.pop(pid, None)) is not None:
                os.close(fd)
            self.pids.pop(pid, None)
            self.counts.pop(pid, None)  # a new process may take its pid
            return None

    def _name_threads(self, pids: set[int]) -> None:
        lines = []
        for pid in list(pids):
            self.changed.discard(pid)
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                if (pid, tid) not in self.named:
                    try:
                        comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip().replace("\t", " ")
                    except OSError:
                        continue
                    self.named.add((pid, tid))
                    lines.append(f"{pid}\t{tid}\t{comm}\n")
        self.names.write("".join(lines))
        self.names.flush()


def read_thread_names(path: Path) -> pd.DataFrame:
    """One row per thread: its kernel name (comm, at most 15 characters)."""
    return tsv_rows(path, {"pid": "int64", "tid": "int64", "comm": "str"})


COLUMNS = dict.fromkeys(["t_ns", "pid", "utime", "stime", "rss_pages", "cpu_ns"], "int64")


def read_proc(path: Path) -> pd.DataFrame:
    """One row per process and tick: cpu_s, cpu_percent over the previous tick, rss_bytes. Captures
    made before lines had cpu_ns give CPU time in stat's ticks."""
    df = tsv_rows(path, COLUMNS)
    if df.empty:
        df = tsv_rows(path, dict(list(COLUMNS.items())[:-1]))
        df["cpu_ns"] = (df.utime + df.stime) * 1_000_000_000 // CLK_TCK
    df = df.sort_values(["pid", "t_ns"])
    df["cpu_s"] = df.cpu_ns / 1e9
    g = df.groupby("pid")
    df["cpu_percent"] = (100 * g.cpu_s.diff() / (g.t_ns.diff() / 1e9)).fillna(0.0)
    df["rss_bytes"] = df.rss_pages * PAGE
    return df[["t_ns", "pid", "cpu_s", "cpu_percent", "rss_bytes"]].reset_index(drop=True)
