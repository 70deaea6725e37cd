"""The capture of Python stacks (pyspy.tsv), sampled by probes/sampler-core (our
reader for CPython 3.10 to 3.13, py-spy's for other versions and --native; started by
sampler.py), each sample stamped with CLOCK_MONOTONIC by the sampler: its definition
and its reader."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from .base import as_int, capture_lines

if TYPE_CHECKING:  # imported by read_samples: starting a run needs no pandas
    import pandas as pd

CAPTURE = "pyspy.tsv"
# The capture's one definition: each line is its kind's letter, then these fields, tab-separated.
# int; flag: 0 or 1; str: no tabs or newlines; ids: frame ids, leaf first, comma-separated.
# daskprobe-sampler writes them (probes/sampler-core/src/lines.rs, frames.rs), read_samples reads
# F and S lines by them, and tests/unit/test_formats.py holds both to one file the sampler's code wrote.
LINES = {
    "F": ("frame_id:int function:str filename:str line:int", "a frame, the first time it is seen"),
    "S": ("t_ns:int pid:int tid:int active:flag owns_gil:flag thread_name:str frame_ids:ids ident:int stale:flag "
          "tick:flag period_ns:int",
          "one thread's stack; ident: threading.get_ident() in that thread, 0 when unknown; stale: the stack "
          "was read before (up to 100 ms; 1 s with ticks) and the thread, off a CPU now, ran since; tick: read "
          "because a CPU's clock tick found the thread on it, one line per tick; period_ns: the CPU time such "
          "a line stands for, the period its CPU's clock ticked at then (drawn at random about 1/rate); polling "
          "(no ticks), the mean interval between reads then (pace.rs); 0 for the others (older captures end "
          "before ident, stale, tick or period_ns)"),
    "A": ("t_ns:int pid:int name:str reader:str",
          "attached; reader: ours (cpython310 to cpython313), py-spy, or py-spy (why not ours)"),
    "E": ("t_ns:int pid:int message:str", "could not attach, or the process exited"),
    "L": ("t_ns:int pid:int read_ns:int", "a sample dropped: the read took over 2 ms (read_ns), too long to place "
          "it; or, read_ns 0, a stack BPF copied at that tick that could not be named (its thread state held "
          "another thread by then, or a frame could not be read)"),
}
EXITED = "process exited"  # an E line's message for a process that ended (sampler-core/src/main.rs)
_F, _S = (1 + len(LINES[kind][0].split()) for kind in "FS")  # fields of the line, its letter included
LOST = "<a frame whose line was malformed>"  # the function of a frame a stack names and no line defined


def read_samples(path: Path, malformed: Counter | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(samples, stacks, frames) from the sampler's capture; a torn last line is dropped.
    `S` lines of older captures, without the thread's Python identifier, the stale flag, the tick
    flag or the tick's period, get ident 0, false and a null period. A thread's samples taken before
    it was named carry its first name. A malformed line (a letter no kind has, other fields than
    its kind's, a number that is not one, a frame defined twice) is left out and counted in
    malformed[path.name]; a frame a stack names that no line defined (its line was malformed)
    becomes a frame named LOST, counted too."""
    import pandas as pd
    frames, samples, stacks, bad = {}, [], {}, 0
    for text in capture_lines(path):
        try:
            f = text.split("\t")
            if f[0] == "F" and len(f) == _F and (frame_id := as_int(f[1])) not in frames:
                frames[frame_id] = (frame_id, f[2], f[3], as_int(f[4]))
            elif f[0] == "S" and _S - 4 <= len(f) <= _S:
                samples.append(_sample(f, stacks))
            elif f[0] not in LINES or f[0] in "FS":
                raise ValueError(text)
        except ValueError:  # a line cut short or changed by a kill, a full disk or a fault
            bad += 1
    lost = {i for ids in stacks for i in ids} - frames.keys()
    frames.update((i, (i, LOST, "", 0)) for i in lost)
    if malformed is not None:
        malformed[path.name] += bad + len(lost)
    s = pd.DataFrame(samples, columns=["t_ns", "pid", "tid", "thread_name", "active", "owns_gil", "ident", "stale",
                                       "tick", "period_ns", "stack_id"])
    s["period_ns"] = s.period_ns.astype("Int64")
    # A thread runs a little before threading registers its name, and the sampler asks again at a
    # growing interval: its samples from before then take the first name it was given.
    key = ["pid", "tid", "ident"]
    first = s[s.thread_name != ""].sort_values("t_ns", kind="stable").drop_duplicates(key)[key + ["thread_name"]]
    given = s[key].merge(first, on=key, how="left").thread_name.fillna("").to_numpy()
    s["thread_name"] = s.thread_name.where(s.thread_name != "", given)
    # Where py-spy cannot read native thread ids (CPython 3.8) it gives pthread ids (addresses, above
    # 2^31); the main thread's native id is its pid, so its eBPF states and its event loop's role hold.
    main = (s.tid > 2**31 - 1) & (s.thread_name == "MainThread")
    s.loc[main, "tid"] = s.pid[main]
    st = pd.DataFrame({"stack_id": list(stacks.values()), "frame_ids": [list(k) for k in stacks]})
    fr = pd.DataFrame(sorted(frames.values()), columns=["frame_id", "function", "filename", "line"])
    return s, st, fr


def not_sampled(path: Path) -> list[str]:
    """Why processes were not sampled ("pid P: why"), from the E lines that say more than an exit: a
    process the sampler could not attach to, or whose interpreter or libpython it would not read."""
    errors = (text.split("\t") for text in capture_lines(path))
    return [f"pid {f[2]}: Python stacks not sampled: {f[3]}" for f in errors if f[0] == "E" and len(f) == 4
            and f[3] != EXITED]


def _sample(f: list[str], stacks: dict) -> tuple:
    """An S line's row (its fields split), its stack's id from `stacks` (frame ids: stack id)."""
    _, t_ns, pid, tid, active, owns_gil, thread_name, frame_ids, ident, stale, tick, period = \
        (f + ["0"] * (_S - 1 - len(f)) + [""])[:_S]
    ids = tuple(as_int(i) for i in frame_ids.split(",") if i)
    row = (as_int(t_ns), as_int(pid), as_int(tid), thread_name, active == "1", owns_gil == "1", as_int(ident))
    return (*row, stale == "1", tick == "1", as_int(period) if period else None, stacks.setdefault(ids, len(stacks)))
