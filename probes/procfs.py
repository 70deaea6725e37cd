"""CPU time and RSS of every watched process from /proc, 5 times a second, and the name of
each of their threads: the captures' definition and readers. daskprobe-sampler reads them
(probes/sampler-core/src/procs.rs, started by sampler.py), at the wakes it makes to sample
stacks anyway, one line per process per reading:
    proc.tsv     t_ns  pid  utime_ticks  stime_ticks  rss_pages  cpu_ns
(cpu_ns: the process's CPU clock, in ns, where stat counts 10 ms ticks) and one line per
thread not seen before (its kernel name, so that threads no Python sampler names, native ones
included, have one), looked for once a second in the processes whose thread count changed,
every 10 s and at the end in all:
    threads.tsv  pid  tid  comm
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from .base import tsv_rows

if TYPE_CHECKING:  # the readers' tables come from tsv_rows
    import pandas as pd

CAPTURE = "proc.tsv"
THREADS = "threads.tsv"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread's, ended ones' too) the live process `pid` has used
    so far, from its CPU clock (clock_getcpuclockid's, which Python does not wrap), as the sampler
    reads it for proc.tsv."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9  # CPUCLOCK_SCHED of the whole process
    except OSError:
        raise ProcessLookupError(pid) from None


def read_thread_names(path: Path, malformed: Counter | None = None) -> pd.DataFrame:
    """One row per thread: its kernel name (comm, at most 15 characters). Malformed lines are
    left out and counted (tsv_rows)."""
    return tsv_rows(path, {"pid": "int64", "tid": "int64", "comm": "str"}, malformed)


COLUMNS = dict.fromkeys(["t_ns", "pid", "utime", "stime", "rss_pages", "cpu_ns"], "int64")


def read_proc(path: Path, malformed: Counter | None = None) -> pd.DataFrame:
    """One row per process and tick: cpu_s, cpu_percent over the previous tick, rss_bytes. Captures
    made before lines had cpu_ns give CPU time in stat's ticks. Malformed lines are left out and
    counted (tsv_rows)."""
    bad = Counter()
    df = tsv_rows(path, COLUMNS, bad)
    if df.empty:
        bad = Counter()
        df = tsv_rows(path, dict(list(COLUMNS.items())[:-1]), bad)
        df["cpu_ns"] = (df.utime + df.stime) * 1_000_000_000 // CLK_TCK
    if malformed is not None:
        malformed.update(bad)
    df = df.sort_values(["pid", "t_ns"])
    df["cpu_s"] = df.cpu_ns / 1e9
    g = df.groupby("pid")
    df["cpu_percent"] = (100 * g.cpu_s.diff() / (g.t_ns.diff() / 1e9)).fillna(0.0)
    df["rss_bytes"] = df.rss_pages * PAGE
    return df[["t_ns", "pid", "cpu_s", "cpu_percent", "rss_bytes"]].reset_index(drop=True)
