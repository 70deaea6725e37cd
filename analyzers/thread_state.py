"""What each thread was doing when it was not running Python on a CPU, from the
eBPF probes: waiting for the GIL (take_gil asleep on the GIL's condition),
runnable without a CPU, or blocked. One row per interval; intervals of a thread
never overlap, and a GIL wait wins over the off-CPU time inside it (that sleep
is for the GIL).

A thread is on a CPU wherever it has no interval here. Off-CPU stretches under
50 µs and GIL waits under 5 µs are summed in BPF (short_waits), not located in
time, so they count as on-CPU here: a bound on the error, not a guess.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .intervals import overlap_ns, subtract, union

STATES = ("gil", "runnable", "blocked")
COLUMNS = ["pid", "tid", "start_ns", "end_ns", "state"]


def thread_states(offcpu: pd.DataFrame, gil: pd.DataFrame) -> pd.DataFrame:
    off = offcpu.assign(ready_ns=offcpu.out_ns + offcpu.blocked_ns)
    pieces = [_rows(gil, "start_ns", "end_ns", 0),
              _rows(off, "ready_ns", "in_ns", 1),
              _rows(off[off.blocked_ns > 0], "out_ns", "ready_ns", 2)]
    rows = np.concatenate(pieces, axis=1)
    rows = rows[:, np.lexsort((rows[4], rows[1], rows[0]))]  # by thread, then by state
    cut = np.flatnonzero((np.diff(rows[:2], axis=1) != 0).any(axis=0)) + 1
    out = [_one_thread(t) for t in np.split(rows, cut, axis=1) if t.shape[1]]
    out = np.concatenate(out, axis=1) if out else np.empty((5, 0), dtype="int64")
    out = out[:, np.lexsort((out[2], out[1], out[0]))]
    return pd.DataFrame({"pid": out[0], "tid": out[1], "start_ns": out[2], "end_ns": out[3],
                         "state": np.array(STATES, dtype=object)[out[4]]}, columns=COLUMNS)


def _rows(df: pd.DataFrame, start: str, end: str, state: int) -> np.ndarray:
    """pid, tid, start_ns, end_ns, state (an index of STATES) as the rows of one int64 array."""
    d = df[df[end] > df[start]]
    return np.vstack([d.pid.to_numpy("int64"), d.tid.to_numpy("int64"), d[start].to_numpy("int64"),
                      d[end].to_numpy("int64"), np.full(len(d), state, dtype="int64")])


def _one_thread(t: np.ndarray) -> np.ndarray:
    """One thread's intervals (rows as _rows's) made disjoint, in the order of STATES' priority."""
    taken = (np.empty(0, dtype="int64"), np.empty(0, dtype="int64"))
    out = []
    for state in range(len(STATES)):
        mine = t[:, t[4] == state]
        s, e = subtract(*union(mine[2], mine[3]), *taken)
        out.append(np.vstack([np.full((2, len(s)), t[:2, :1]), s, e, np.full(len(s), state)]))
        taken = union(np.r_[taken[0], s], np.r_[taken[1], e])
    return np.concatenate(out, axis=1)


def of_thread(states: pd.DataFrame, pid: int, tid: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """state -> (starts, ends), sorted, for one thread."""
    t = states[(states.pid == pid) & (states.tid == tid)]
    return {s: (t.start_ns[t.state == s].to_numpy("int64"), t.end_ns[t.state == s].to_numpy("int64"))
            for s in STATES}


def threads_table(samples: pd.DataFrame, states: pd.DataFrame, comms: pd.DataFrame) -> pd.DataFrame:
    """Every thread seen: pid, tid, process, name (Python's, else the kernel's), its Python ident
    (what a worker's task-finished names its thread by), when it was first and last seen (by a
    sample or an eBPF interval), whether eBPF states cover it, and whether it is its process's
    main thread (the event loop of Dask's scheduler and workers)."""
    s = samples.dropna(subset=["process"])
    seen = s.groupby(["pid", "tid"]).agg(process=("process", "first"), first_ns=("t_ns", "min"),
                                         last_ns=("t_ns", "max"))
    names = s[s.source == "pyspy"].dropna(subset=["thread_name"]) if "thread_name" in s else s.iloc[:0]
    names = names[names.thread_name != ""].groupby(["pid", "tid"]).thread_name.last()
    st = states.groupby(["pid", "tid"]).agg(st_first=("start_ns", "min"), st_last=("end_ns", "max"))
    known = s[s.ident.fillna(0) > 0] if "ident" in s else s.iloc[:0].assign(ident=0)
    idents = known.groupby(["pid", "tid"]).ident.last().astype("Int64")
    t = seen.join(st, how="outer").join(names.rename("name")).join(idents.rename("ident"))
    t["first_ns"] = t[["first_ns", "st_first"]].min(axis=1).astype("int64")
    t["last_ns"] = t[["last_ns", "st_last"]].max(axis=1).astype("int64")
    t = t.drop(columns=["st_first", "st_last"]).reset_index()
    t["process"] = t.process.fillna(t.pid.map(s.drop_duplicates("pid").set_index("pid").process))
    with_states = set(states.pid.unique())
    t["ebpf_states"] = t.pid.isin(with_states)
    t["main"] = t.pid == t.tid
    t["name"] = thread_names(t, comms)
    return t[["pid", "tid", "process", "name", "ident", "main", "ebpf_states", "first_ns", "last_ns"]]


# A kernel name (comm) a thread has only because it never set one: a Python process's threads keep
# the interpreter's ("python3.11"; CPython before 3.14 names none of its threads).
DEFAULT_COMM = r"python[0-9.]*"


def thread_names(t: pd.DataFrame, comms: pd.DataFrame) -> pd.Series:
    """Each thread's name (t: pid, tid, process, name: Python's or null), unique within its process: Python's
    name, else the kernel's where the thread set one (not a Python process's "python3.11", nor, on a thread
    other than the main one, its process's own name, as the proxy's threads have), else "main" or its
    process's name and a number in tid order ("worker-0 thread 3"). Names several threads of a process share
    (a thread pool's, a thread started again) get " #1", " #2"... in tid order."""
    s = t.sort_values(["pid", "tid"])  # numbers go in tid order
    comm = dict(zip(zip(comms.pid, comms.tid), comms.comm))
    kernel = pd.Series([comm.get((p, i)) for p, i in zip(s.pid, s.tid)], index=s.index, dtype="object")
    own = pd.Series([comm.get((p, p)) for p in s.pid], index=s.index, dtype="object")
    inherited = kernel.fillna("").str.fullmatch(DEFAULT_COMM) | ((s.tid != s.pid) & (kernel == own))
    name = s.name.where(s.name.fillna("").str.strip() != "", kernel.where(~inherited))
    name = name.where(name.notna() | (s.tid != s.pid), "main")
    unnamed = name.isna()
    k = unnamed.groupby(s.pid).cumsum()
    name[unnamed] = s.process[unnamed].fillna("process") + " thread " + k[unnamed].astype(str)
    shared = name.groupby([s.pid, name]).transform("size") > 1
    n = name.groupby([s.pid, name]).cumcount() + 1
    name[shared] = name[shared] + " #" + n[shared].astype(str)
    return name.reindex(t.index)


def on_cpu_ns(states: pd.DataFrame, thread, starts, ends) -> np.ndarray:
    """Per [start, end), ns the thread (a threads_table row) was on a CPU: its lifetime
    there, less its GIL waits and off-CPU intervals."""
    s0 = np.clip(np.asarray(starts, dtype="int64"), thread.first_ns, thread.last_ns)
    s1 = np.clip(np.asarray(ends, dtype="int64"), thread.first_ns, thread.last_ns)
    mine = states[(states.pid == thread.pid) & (states.tid == thread.tid)]
    return np.clip(s1 - s0, 0, None) - overlap_ns(s0, s1, mine.start_ns.to_numpy(), mine.end_ns.to_numpy())


def attempt_threads(attempts: pd.DataFrame, threads: pd.DataFrame) -> pd.DataFrame:
    """Table attempt_threads: per attempt (its row in attempts) whose thread is known, the tid and
    name of the worker thread that ran it. A task-finished
    names its thread by Python ident, which a later thread may get again once the first has ended:
    of the threads with that ident, the one seen nearest the compute's start wins (seen alive then:
    none nearer). A thread is seen only from its first sample, which may come after the start."""
    a = attempts[["worker", "thread", "compute_start_ns"]].reset_index(drop=True).rename_axis("attempt")
    a = a.dropna().reset_index()
    th = threads.dropna(subset=["ident", "process"])[["process", "ident", "tid", "name", "first_ns", "last_ns"]]
    m = a.merge(th.astype({"ident": "int64"}), left_on=["worker", "thread"], right_on=["process", "ident"])
    m["gap"] = np.maximum(0, np.maximum(m.first_ns - m.compute_start_ns, m.compute_start_ns - m.last_ns))
    m = m.sort_values(["attempt", "gap"], kind="stable").drop_duplicates("attempt")
    return m[["attempt", "tid", "name"]].reset_index(drop=True)
