"""CPU time by category, from samples and thread states.

Samples say what a thread was doing, not for how long: on a busy machine the
sampler itself waits for a CPU, so it reads threads more often while they are
off one (measured on the ETL workflow: a worker's event loop was on a CPU for
32% of the time by sched_switch, but only 12% of its samples found it there).
So a thread's CPU seconds come from its on/off-CPU intervals (eBPF, exact)
where it has them, and its samples share them out: each category gets the
fraction of the thread's on-CPU samples that fall in it. Where the sampler
had CPU ticks (a process's samples include tick ones), its on-CPU samples
are those: a tick, an interrupt, finds the thread on its CPU whatever the
sampler waits for, and each stands for the period its CPU ticked at then
(period_ns: drawn at random about 1/rate and held up to a second or so; a
thread spinning for 93 mean periods was given 67 to 131 ticks). When
the sampler polled instead, without eBPF states, a sample counts as CPU time
only if the sampler saw its thread running (per /proc, and not parked in a
known wait), and stands for the time since its process's previous read
(reads spaced at random about the sampler's interval, period_ns: 1/rate, or
longer on a cluster using little CPU); that estimate carries the sampler's bias. A native sample (eBPF cpu-clock)
is on a CPU by construction and stands for 1/cpu_hz s.

Category: a worker's sample taken inside a task's compute span, on the thread
that ran the task, is compute, whatever Dask frames are on its stack; the
client's samples are the client's; otherwise the category of its stack
(rules in analyzers/rules).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .categories import UNCATEGORIZED
from .intervals import inside, union
from .thread_state import on_cpu_ns

COLUMNS = ["t_ns", "pid", "tid", "process", "role", "source", "stack_id", "on_cpu", "owns_gil", "category",
           "weight_s"]
MAX_PERIODS = 3


def classify_samples(samples: pd.DataFrame, processes: pd.DataFrame, states: pd.DataFrame, stack_category: pd.Series,
                     attempts: pd.DataFrame, rate: float, cpu_hz: float) -> pd.DataFrame:
    """Every sample with its thread state (on_cpu), category and, for the estimate without
    eBPF states, the seconds it stands for (weight_s)."""
    role = processes.dropna(subset=["pid"]).drop_duplicates("pid").set_index("pid").role
    s = samples.dropna(subset=["process"])
    python = set(s[s.source == "pyspy"].pid)
    # a process sampled by the Python sampler is counted from those samples only
    s = s[(s.source == "pyspy") | ~s.pid.isin(python)].reset_index(drop=True)
    out = pd.DataFrame({"t_ns": s.t_ns, "pid": s.pid, "tid": s.tid, "process": s.process,
                        "role": s.pid.map(role).fillna("?"), "source": s.source, "stack_id": s.stack_id})
    out["weight_s"] = _weights(s, rate, cpu_hz)
    out["on_cpu"] = _on_cpu(s, states)
    out["owns_gil"] = s.owns_gil.astype("boolean") if "owns_gil" in s else pd.array([pd.NA] * len(s), "boolean")
    out["category"] = s.stack_id.map(stack_category).fillna(UNCATEGORIZED).to_numpy(object)
    out.loc[out.role == "client", "category"] = "client"
    out.loc[_in_compute(s, attempts), "category"] = "compute"
    return out[COLUMNS]


def _weights(s: pd.DataFrame, rate: float, cpu_hz: float) -> np.ndarray:
    """Seconds each sample stands for: its tick's period for a tick's (1/rate where not recorded; none for
    the other samples of a ticked process), else the gap since its process's previous read, at most
    MAX_PERIODS of the sampler's mean interval then (its period_ns; 1/rate where not recorded)."""
    w = np.full(len(s), 1.0 / cpu_hz)
    py = s.source.to_numpy() == "pyspy"
    periods = s.period_ns.astype("Float64").fillna(0).to_numpy(float) / 1e9 if "period_ns" in s else np.zeros(len(s))
    periods = np.where(periods > 0, periods, 1.0 / rate)
    rounds = s[py][["pid", "t_ns"]].assign(period=periods[py]).drop_duplicates(["pid", "t_ns"])
    rounds = rounds.sort_values(["pid", "t_ns"])
    gap = (rounds.groupby("pid").t_ns.diff() / 1e9).fillna(rounds.period)
    rounds["w"] = np.minimum(gap, MAX_PERIODS * rounds.period).to_numpy()
    w[py] = s[py].merge(rounds[["pid", "t_ns", "w"]], on=["pid", "t_ns"], how="left").w.to_numpy()
    tick, ticked = _ticks(s)
    w[ticked] = np.where(tick[ticked], periods[ticked], 0.0)
    return w


def _ticks(s: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Which samples a tick took, and which are of a process the sampler read on ticks."""
    if "tick" not in s:
        return np.zeros(len(s), bool), np.zeros(len(s), bool)
    tick = s.tick.fillna(False).astype(bool).to_numpy()
    return tick, s.pid.isin(set(s.pid[tick])).to_numpy()


def _on_cpu(s: pd.DataFrame, states: pd.DataFrame) -> np.ndarray:
    on = s.active.astype(bool).to_numpy().copy() if "active" in s else np.ones(len(s), bool)
    on[s.source.to_numpy() == "ebpf"] = True
    per_thread = dict(list(states.groupby(["pid", "tid"])))
    known = set(states.pid.unique())
    py = (s.source == "pyspy").to_numpy()
    empty = states.iloc[:0]
    tick, ticked = _ticks(s)
    for (pid, tid), idx in s[py & s.pid.isin(known).to_numpy()].groupby(["pid", "tid"]).groups.items():
        st = per_thread.get((pid, tid), empty)
        t = s.t_ns.loc[idx].to_numpy()
        on[idx] = ~inside(t, st.start_ns.to_numpy(), st.end_ns.to_numpy())
        # A tick's thread read while it waited for the CPU it was preempted from (by the sampler, say)
        # is still where the tick found it: on a CPU then. One woken from a wait since is not.
        waiting = st[_preempted(st)]
        on[idx] |= tick[idx] & inside(t, waiting.start_ns.to_numpy(), waiting.end_ns.to_numpy())
    # A stale stack (the sampler found the thread off a CPU, so kept the one it read before) of a thread
    # on a CPU by eBPF at t_ns, which it reached between its read and t_ns: what it does is unknown, and
    # whether it woke in that window has nothing to do with what it does, so the sample is left out.
    if "stale" in s:
        on &= ~s.stale.fillna(False).astype(bool).to_numpy()
    # A tick sample read after its thread went to sleep, or found parked in a wait, did what the tick
    # saw before the read. A ticked process's other samples come at times the sampler chose, and would
    # bias its shares.
    on &= tick | ~ticked
    return on


def _preempted(st: pd.DataFrame) -> np.ndarray:
    """A thread's runnable intervals (its states, by start) that follow a stretch on a CPU: it was
    preempted, not woken (a wake-up's runnable interval starts where its blocked or GIL one ends)."""
    return ((st.state == "runnable") & (st.start_ns != st.end_ns.shift())).to_numpy()


def _in_compute(s: pd.DataFrame, attempts: pd.DataFrame) -> np.ndarray:
    """Samples of a worker thread inside one of that worker's compute spans on that thread.
    Samples that carry the thread's Python ident are matched to the task's thread exactly;
    older captures (no ident) match any thread of the worker but its event loop."""
    hit = np.zeros(len(s), dtype=bool)
    spans = attempts.dropna(subset=["compute_start_ns", "compute_stop_ns"])
    exact = "ident" in s and bool((s.ident.fillna(0) != 0).any())
    for key, sp in spans.groupby(["worker", "thread"] if exact else ["worker"]):
        worker = key[0] if isinstance(key, tuple) else key
        mine = (s.process == worker) & ((s.ident == key[1]) if exact else (s.tid != s.pid))
        if not mine.any():
            continue
        lo, hi = union(sp.compute_start_ns.astype("int64"), sp.compute_stop_ns.astype("int64"))
        idx = np.flatnonzero(mine.to_numpy())
        hit[idx] = inside(s.t_ns.to_numpy()[idx], lo, hi)
    return hit


def cpu_time(cpu: pd.DataFrame, states: pd.DataFrame, threads: pd.DataFrame, edges) -> pd.DataFrame:
    """CPU seconds per bin (between consecutive edges, ns), process, thread and category,
    with the on-CPU samples each rests on."""
    edges = np.asarray(edges, dtype="int64")
    on = cpu[cpu.on_cpu & (cpu.t_ns >= edges[0]) & (cpu.t_ns < edges[-1])]
    on = on.assign(bin=np.searchsorted(edges, on.t_ns.to_numpy(), side="right") - 1)
    out, by_thread = [], dict(list(on.groupby(["pid", "tid"], sort=False)))
    for th in threads.itertuples():
        mine = by_thread.get((th.pid, th.tid), on.iloc[:0])
        if th.ebpf_states:
            secs = on_cpu_ns(states, th, edges[:-1], edges[1:]) / 1e9
        else:
            secs = np.bincount(mine.bin, mine.weight_s, len(edges) - 1)
        out.append(_share(secs, mine, th))
    cols = ["bin", "process", "tid", "category", "seconds", "samples"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)


def _share(secs: np.ndarray, mine: pd.DataFrame, th) -> pd.DataFrame:
    """Each bin's seconds by the categories of its on-CPU samples (the thread's over all
    bins where a bin has none; uncategorized where the thread has none at all)."""
    rows, busy = [], np.flatnonzero(secs > 0)
    if mine.empty:
        rows = [(b, th.process, th.tid, UNCATEGORIZED, secs[b], 0) for b in busy]
        return pd.DataFrame(rows, columns=["bin", "process", "tid", "category", "seconds", "samples"])
    counts = mine.groupby(["bin", "category"]).size().unstack(fill_value=0)
    overall = mine.category.value_counts()
    for b in busy:
        k = counts.loc[b] if b in counts.index else overall
        k = k[k > 0]
        n = int(k.sum())
        if n == 0:
            rows.append((b, th.process, th.tid, UNCATEGORIZED, secs[b], 0))
            continue
        rows += [(b, th.process, th.tid, cat, secs[b] * c / n, int(c)) for cat, c in k.items()]
    return pd.DataFrame(rows, columns=["bin", "process", "tid", "category", "seconds", "samples"])


def cpu_by_category(time: pd.DataFrame) -> dict:
    """Per process, CPU seconds by category (from cpu_time over one bin)."""
    by = time.groupby(["process", "category"]).seconds.sum()
    return {p: {cat: float(v) for cat, v in part.droplevel(0).items()} for p, part in by.groupby(level=0)}
