"""Evidence for the findings: what the run's tables say about a cause, computed from the summary's
tables (critical_path, cpu_samples, thread_states, tasks, stacks, frames): who held the GIL or the
CPUs, where the client's time went, which tasks straggled, which functions of the user's ran, what
was imported or spilled on the path, how much data the graphs carried."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from .intervals import inside, intersect, overlap_ns, union
from .thread_state import of_thread

DASK_CLIENT_WORK = ("runtime_bookkeeping", "scheduler_decisions")  # rules' categories of Dask's own frames


def client_split(t: dict) -> dict[str, float] | None:
    """The shares of the client's time (the path's client segments) that went to Dask's client-side work
    (building, optimizing and serializing graphs: the main thread's stacks in Dask's code, and the client's
    other threads, its event loop's, on a CPU), to the user's own code (the main thread on a CPU
    elsewhere), and to waiting (the rest), from the client's samples there: each read of the process
    samples all its threads, so their counts compare."""
    path, cpu, cats = t.get("critical_path"), t.get("cpu_samples"), t.get("stack_categories")
    if path is None or cpu is None or cats is None:
        return None
    segs = path[path.kind == "client"].sort_values("start_ns")
    client = cpu[(cpu.role == "client") & (cpu.source == "pyspy")]
    client = client[inside(client.t_ns.to_numpy(), *union(segs.start_ns, segs.end_ns))]
    main = client[client.tid == client.pid]
    if len(main) < 5:
        return None
    on = main.on_cpu.fillna(False).astype(bool)
    dask_main = on & main.stack_id.map(cats.set_index("stack_id").category).isin(DASK_CLIENT_WORK)
    loops = int(((client.tid != client.pid) & client.on_cpu.fillna(False).astype(bool)).sum())
    n, yours = len(main), int((on & ~dask_main).sum())
    dask = min(n - yours, int(dask_main.sum()) + loops)
    return {"dask": dask / n, "yours": yours / n, "waiting": (n - yours - dask) / n, "samples": n}


def cpu_holders(t: dict, top: int = 3) -> str | None:
    """What the sampled threads on a CPU were doing while an event loop waited for one within a job:
    the largest (process, category) shares of on-CPU samples inside event loops' runnable intervals
    (outside jobs a client's imports, say, are not what starved the path)."""
    running = _running_while_starved(t)
    # weighted by the time each sample stands for: Python and eBPF samples come at different rates
    share = running.groupby(["process", "category"]).weight_s.sum()
    if share.empty or not share.sum():
        return None
    share = (share / share.sum()).sort_values(ascending=False).head(top)
    return ", ".join(f"{p} {c} {v:.0%}" for (p, c), v in share.items()) + f" (of {len(running)} samples)"


def cpu_share_of(t: dict, tids: set[int]) -> float:
    """The share of what ran on the CPUs while an event loop waited for one (cpu_holders') that was
    the threads `tids`."""
    running = _running_while_starved(t)
    total = running.weight_s.sum()
    return float(running[running.tid.isin(tids)].weight_s.sum() / total) if total else 0.0


def cpu_shares(t: dict) -> dict[str, float]:
    """Of the cluster's eBPF CPU samples (any thread on a CPU, at one rate) while an event loop waited for
    a CPU within a job, the shares of: the threads that ran tasks ("tasks"), workers' threads Python never
    saw ("native": no thread state of theirs, so a native library's, a BLAS or OpenMP pool; the Python
    sampler cannot see them), and the rest ("dask": event loops, Dask's other threads, the client)."""
    smp, threads, procs, waited = t["samples"], t.get("threads"), t.get("processes"), _starved(t)
    tasks = t.get("attempt_threads")
    if waited is None or threads is None or procs is None or tasks is None or "source" not in smp:
        return {}
    ebpf = smp[(smp.source == "ebpf") & smp.pid.isin(procs[procs.role != "probe"].pid)]
    ebpf = ebpf[inside(ebpf.t_ns.to_numpy(), *waited)]
    if ebpf.empty:
        return {}
    task = ebpf.tid.isin(tasks.tid)
    python = threads[threads.ident.notna()].tid
    native = ~task & ebpf.pid.isin(procs[procs.role == "worker"].pid) & ~ebpf.tid.isin(python)
    return {"tasks": float(task.mean()), "native": float(native.mean()), "dask": float((~task & ~native).mean())}


def gil_holders_beside_tasks(t: dict) -> set[int]:
    """The workers' threads seen holding the GIL that are neither an event loop nor one that ran tasks."""
    smp, tids, procs = t["samples"], t.get("attempt_threads"), t.get("processes")
    if smp.empty or "owns_gil" not in smp or tids is None or procs is None:
        return set()
    workers = procs[procs.role == "worker"].pid
    held = smp[smp.owns_gil.fillna(False).astype(bool) & (smp.tid != smp.pid) & smp.pid.isin(workers)]
    return set(held.tid) - set(tids.tid)


def _starved(t: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """Event loops' runnable intervals within jobs (starts, ends; ns), or None without thread states."""
    states, path = t.get("thread_states"), t.get("critical_path")
    if states is None or path is None or states.empty:
        return None
    waits = states[(states.state == "runnable") & (states.tid == states.pid)]
    jobs = path[path.job >= 0]
    return intersect(*union(waits.start_ns, waits.end_ns), *union(jobs.start_ns, jobs.end_ns))[:2]


def _running_while_starved(t: dict) -> pd.DataFrame:
    """On-CPU samples inside event loops' runnable intervals within jobs."""
    cpu, waited = t.get("cpu_samples"), _starved(t)
    if cpu is None or cpu.empty or waited is None:
        return pd.DataFrame(columns=["process", "category", "tid", "weight_s"])
    running = cpu[cpu.on_cpu.fillna(False).astype(bool)]  # on a CPU: never one of the waiting threads then
    return running[inside(running.t_ns.to_numpy(), *waited)]


def gil_holder(t: dict, roles: list[str] | None = None) -> str | None:
    """The function most often on top of a non-main thread's GIL-holding samples (the sampler reads the
    holder's stack at each read of it: a tick on it, and every 200 ms), with its process; only of the
    processes of `roles` (a thread holds its own process's GIL only)."""
    held = gil_holder_thread(t, roles)
    return held[1] if held else None


def gil_holder_thread(t: dict, roles: list[str] | None = None) -> tuple[int, str] | None:
    """gil_holder's thread: its tid and the description gil_holder gives."""
    smp = t["samples"]
    if smp.empty or "owns_gil" not in smp:
        return None
    if roles is not None and "processes" in t:
        kinds = {"compute": "worker"}
        pids = t["processes"][t["processes"].role.isin([kinds.get(r, r) for r in roles])].pid
        smp = smp[smp.pid.isin(pids)]
    # on a CPU or not: a C call may sleep holding the GIL
    held = smp[smp.owns_gil.fillna(False).astype(bool) & (smp.tid != smp.pid)]
    if held.empty:
        return None
    process, tid, thread, stack_id = held.groupby(["process", "tid", "thread_name", "stack_id"]).size().idxmax()
    frames = t["stacks"].set_index("stack_id").frame_ids.get(stack_id)
    if frames is None or not len(frames):
        return int(tid), f"thread '{thread}' of {process}"
    f = t["frames"].set_index("frame_id").loc[frames[0]]
    return int(tid), f"thread '{thread}' of {process}, in {f.function} ({f.filename.rsplit('/', 1)[-1]}:{f.line})"


def bookkeeping_per_task(s: dict) -> float | None:
    """CPU seconds Dask's runtime (scheduler and workers: bookkeeping and decisions) spent per task."""
    n = s["tasks"]
    if not n:
        return None
    cpu = s.get("cpu_by_category_s", {})
    return sum(v for p, cats in cpu.items() if p == "scheduler" or p.startswith("worker")
               for c, v in cats.items() if c in DASK_CLIENT_WORK) / n


def heaviest_graphs(s: dict) -> dict | None:
    """The job whose graphs carried the most bytes per task: its number, bytes and tasks."""
    jobs = [j for j in s["jobs"] if j["tasks"]]
    if not jobs:
        return None
    j = max(jobs, key=lambda j: j.get("graph_bytes", 0) / j["tasks"])
    return {"job": j["job"], "bytes": j.get("graph_bytes", 0), "tasks": j["tasks"]}


STRAGGLER_FACTOR = 5.0   # a task this many times its prefix's median compute, and
STRAGGLER_MIN_S = 0.01   # this many seconds over it, is a straggler
LIBRARY = ("site-packages", "dist-packages", "/lib/python", "<frozen", "<string>")
# daskprobe's own files: its preloads run in the cluster (tracer/capture/peer_guard.py, the variants' schedulers and
# workers), and are not the user's code; scripts in experiments' folders (the diagnosis flows) are a user's
_OURS = Path(__file__).resolve().parent.parent
OURS = re.compile("^(?:" + "|".join(re.escape(f"{_OURS / d}/") for d in ("probes", "tracer", "analyzers", "dashboards"))
                  + "|" + re.escape(f"{_OURS / 'experiments'}/") + "[^/]+$)")


def stragglers(t: dict) -> pd.DataFrame:
    """Tasks on the critical path whose compute took far longer than their prefix's median (of at least 5
    tasks): job, key, prefix, worker, compute_s, median_s, path_s (their compute seconds on the path)."""
    if t.get("stragglers") is not None:  # worked out once for all findings (summary.analyze)
        return t["stragglers"]
    tasks, path = t.get("tasks"), t.get("critical_path")
    if tasks is None or path is None or tasks.empty:
        return pd.DataFrame()
    done = tasks.dropna(subset=["compute_start_ns", "compute_stop_ns"])
    dur = (done.compute_stop_ns - done.compute_start_ns).astype("float64") / 1e9
    by = dur.groupby(done.prefix)
    median, count = by.transform("median"), by.transform("size")
    slow = done.assign(compute_s=dur, median_s=median)[(count >= 5) & (dur > STRAGGLER_FACTOR * median)
                                                        & (dur - median > STRAGGLER_MIN_S)]
    on = path[path.kind == "compute"].assign(path_s=lambda p: (p.end_ns - p.start_ns) / 1e9)
    on = on.groupby(["job", "key"]).path_s.sum().reset_index()
    return slow.merge(on, on=["job", "key"]).sort_values("path_s", ascending=False)


# P2P stages (dask's shuffle and rechunk): the tasks that split, send and unpack the data moved all-to-all
P2P_STAGE = re.compile(r"(?:shuffle|rechunk).*(?:transfer|barrier|unpack|p2p)|^p2p|^shuffle-barrier")


def p2p_on_path(t: dict) -> float:
    """Seconds of the critical path in P2P shuffle and rechunk tasks (their compute, hand-overs and waits)."""
    tasks, path = t.get("tasks"), t.get("critical_path")
    if tasks is None or path is None or tasks.empty or path.empty:
        return 0.0
    stage = tasks.drop_duplicates(["job", "key"]).set_index(["job", "key"]).prefix.str.contains(P2P_STAGE)
    p = path.dropna(subset=["key"])
    hit = p[pd.MultiIndex.from_frame(p[["job", "key"]]).map(stage.to_dict().get).fillna(False).astype(bool)]
    return float((hit.end_ns - hit.start_ns).sum() / 1e9)


def oversubscribed_s(t: dict, cpus: int) -> float:
    """Seconds during which more tasks computed at once than the machine has CPUs (table tasks)."""
    tasks = t.get("tasks")
    if tasks is None or tasks.empty or not cpus:
        return 0.0
    done = tasks.dropna(subset=["compute_start_ns", "compute_stop_ns"])
    edges = pd.concat([pd.DataFrame({"t": done.compute_start_ns, "d": 1}),
                       pd.DataFrame({"t": done.compute_stop_ns, "d": -1})]).sort_values(["t", "d"])
    running = edges.d.cumsum().to_numpy()
    gaps = np.diff(edges.t.to_numpy().astype("int64"), append=edges.t.iat[-1])
    return float(gaps[running > cpus].sum() / 1e9)


def why_slow(row, t: dict) -> str:
    """Why a task took long: the seconds it fetched its inputs first, and what the thread that ran it did
    in its compute span (eBPF states: on a CPU, waiting for the GIL or a CPU, blocked)."""
    fetch = (row.transfer_stop_ns - row.transfer_start_ns) / 1e9 if pd.notna(row.transfer_start_ns) else 0.0
    said = [f"fetching its inputs {fetch:.2f} s first"] if fetch >= 0.01 else []
    states, threads, procs = t.get("thread_states"), t.get("threads"), t.get("processes")
    if states is None or threads is None or procs is None or states.empty or pd.isna(row.thread):
        return ", ".join(said)
    pid = procs[procs.name == row.worker].pid
    tid = threads[threads.pid.isin(pid) & (threads.ident == row.thread)].tid
    if pid.empty or tid.empty:
        return ", ".join(said)
    st, s0, s1 = of_thread(states, int(pid.iloc[0]), int(tid.iloc[0])), [row.compute_start_ns], [row.compute_stop_ns]
    span = row.compute_stop_ns - row.compute_start_ns
    waits = {w: int(overlap_ns(s0, s1, *st[state])[0]) / span
             for state, w in (("gil", "waiting for the GIL"), ("runnable", "waiting for a CPU"), ("blocked", "blocked"))}
    said.append(f"computing: on a CPU {max(0.0, 1 - sum(waits.values())):.0%}")
    return ", ".join(said + [f"{w} {v:.0%}" for w, v in waits.items() if v >= 0.05])


def user_frames(t: dict) -> pd.Series:
    """stack_id -> the innermost frame of the user's own code in it (frame_id), outside libraries."""
    stacks, frames = t.get("stacks"), t.get("frames")
    if stacks is None or frames is None:
        return pd.Series(dtype="float64")
    names = frames.filename.fillna("")
    theirs = names.str.contains("|".join(map(re.escape, LIBRARY))) | names.str.contains(OURS)
    # a frame read while the interpreter changed it has names in the wrong fields ("dtype" as a file, a line of
    # -2110975246): source files are paths, *.py or <dynamic-code>
    torn = ~(names.str.endswith(".py") | names.str.startswith("<") | names.str.contains("/")) \
        | ~frames.line.between(0, 10_000_000)
    theirs |= torn
    mine = set(frames.frame_id[~theirs])
    return stacks.set_index("stack_id").frame_ids.map(lambda ids: next((i for i in ids if i in mine), None))


def top_functions(t: dict, samples: pd.DataFrame, top: int = 3) -> list[dict]:
    """The user's functions most often innermost of their code in `samples` (cpu_samples' rows): each
    with its file and line, its share of those samples, and the seconds they stand for."""
    first = samples.stack_id.map(user_frames(t)).dropna().astype("int64")
    if first.empty:
        return []
    f = t["frames"].set_index("frame_id").loc[first.to_numpy()]
    rows = f.assign(n=1, w=samples.weight_s.loc[first.index].to_numpy()).groupby(
        ["function", "filename"], sort=False).agg(n=("n", "sum"), line=("line", "first"), seconds=("w", "sum"))
    rows = rows.sort_values("n", ascending=False).head(top).reset_index()
    return [{"function": r.function, "file": r.filename, "line": int(r.line), "share": r.n / len(samples),
             "samples": int(r.n), "seconds": float(r.seconds),
             "where": f"{r.function} ({r.filename.rsplit('/', 1)[-1]}:{int(r.line)})"} for r in rows.itertuples()]


def in_compute_spans(samples: pd.DataFrame, procs: pd.DataFrame, attempts: pd.DataFrame,
                     task_tids: pd.DataFrame) -> pd.DataFrame:
    """The samples (rows of cpu_samples) that a task's thread took inside its compute span, with the
    attempt's worker, prefix and span."""
    pids = procs.dropna(subset=["pid"]).drop_duplicates("name").set_index("name").pid.astype("int64")
    a = attempts[["worker", "prefix", "compute_start_ns", "compute_stop_ns"]].reset_index(drop=True)
    a = a.rename_axis("attempt").reset_index().merge(task_tids[["attempt", "tid"]], on="attempt")
    a = a.assign(pid=a.worker.map(pids)).dropna(subset=["pid", "compute_start_ns"])
    if samples.empty or a.empty:
        return samples.iloc[:0].assign(prefix="", compute_stop_ns=0)
    a = a.astype({"pid": "int64", "tid": "int64", "compute_start_ns": "int64"}).sort_values("compute_start_ns")
    m = pd.merge_asof(samples.sort_values("t_ns"), a, left_on="t_ns", right_on="compute_start_ns", by=["pid", "tid"])
    return m[m.t_ns < m.compute_stop_ns]


def blocked_in(t: dict, top: int = 2) -> list[str]:
    """Where the tasks' threads were blocked inside their compute spans: the innermost frames of their
    off-CPU samples, the most often first, as 'function (file:line) N samples'."""
    cpu, tids, attempts = t.get("cpu_samples"), t.get("attempt_threads"), t.get("attempts")
    if cpu is None or tids is None or attempts is None or t.get("stacks") is None:
        return []
    off = cpu[~cpu.on_cpu.fillna(True).astype(bool) & (cpu.source == "pyspy")]
    m = in_compute_spans(off, t["processes"], attempts, tids)
    leaf = t["stacks"].set_index("stack_id").frame_ids.map(lambda ids: ids[0] if len(ids) else None)
    ids = m.stack_id.map(leaf).dropna().astype("int64").value_counts().head(top)
    f = t["frames"].set_index("frame_id")
    return [f"{f.function[i]} ({str(f.filename[i]).rsplit('/', 1)[-1]}:{f.line[i]}) {n} samples"
            for i, n in ids.items()]


def compute_profile(t: dict, attempts: pd.DataFrame, task_tids: pd.DataFrame) -> pd.DataFrame:
    """Table compute_profile: per task prefix, the user's functions its tasks ran (the innermost frame of
    the user's code in each on-CPU sample inside a compute span, on the task's thread)."""
    cpu = t["cpu_samples"]
    comp = cpu[(cpu.category == "compute") & cpu.on_cpu.fillna(False).astype(bool) & (cpu.source == "pyspy")]
    m = in_compute_spans(comp, t["processes"], attempts, task_tids)
    if m.empty:
        return pd.DataFrame(columns=PROFILE_COLUMNS)
    per_prefix = m.groupby("prefix").size()
    m = m.assign(frame_id=m.stack_id.map(user_frames(t))).dropna(subset=["frame_id"])
    if m.empty:  # no sample inside a span ran code of the user's
        return pd.DataFrame(columns=PROFILE_COLUMNS)
    f = t["frames"].set_index("frame_id")
    m = m.join(f[["function", "filename", "line"]], on=m.frame_id.astype("int64"))
    m = m.assign(gil=m.owns_gil.fillna(False).astype("int64"))
    g = m.groupby(["prefix", "function", "filename"]).agg(line=("line", lambda x: x.mode().iat[0]),
                                                          samples=("t_ns", "size"), seconds=("weight_s", "sum"),
                                                          gil_samples=("gil", "sum"))
    g = g.reset_index()
    g["prefix_samples"] = g.prefix.map(per_prefix).astype("int64")
    g["share"] = g.samples / g.prefix_samples
    return g.sort_values(["prefix", "samples"], ascending=[True, False], ignore_index=True)[PROFILE_COLUMNS]


PROFILE_COLUMNS = ["prefix", "function", "filename", "line", "samples", "seconds", "prefix_samples", "share",
                   "gil_samples"]


def hot_functions(t: dict, top: int = 3) -> list[dict]:
    """The user's own functions most often running inside tasks' compute spans (table compute_profile,
    over all prefixes), with their share of those samples."""
    prof = t.get("compute_profile")
    if prof is None or prof.drop_duplicates("prefix").prefix_samples.sum() < 10:
        return []
    prof = prof if "gil_samples" in prof else prof.assign(gil_samples=pd.NA)  # a run analysed before the column
    g = prof.groupby(["function", "filename"], sort=False).agg(line=("line", "first"), samples=("samples", "sum"),
                                                               seconds=("seconds", "sum"),
                                                               gil=("gil_samples", lambda x: x.sum(min_count=1)))
    g = g.sort_values("samples", ascending=False).head(top).reset_index()
    n = prof.drop_duplicates("prefix").prefix_samples.sum()
    return [{"function": r.function, "file": r.filename, "line": int(r.line), "share": r.samples / n,
             "samples": int(r.samples), "seconds": float(r.seconds),
             "python": None if pd.isna(r.gil) else float(r.gil) / r.samples,
             "where": f"{r.function} ({r.filename.rsplit('/', 1)[-1]}:{int(r.line)})"} for r in g.itertuples()]


IMPORTING = "_find_and_load"  # importlib's frame under every import statement


def path_samples(t: dict, on_cpu: bool = True) -> pd.DataFrame:
    """Samples (on a CPU only, unless `on_cpu` is false) that processes took inside their own segments of
    a job's critical path (cpu_samples' rows, and the seconds of those segments in `path_s`): what each
    process on the path was running, or blocked in, while the path was in it."""
    if on_cpu and t.get("path_samples") is not None:  # worked out once for all findings (summary.analyze)
        return t["path_samples"]
    path, cpu, procs = t.get("critical_path"), t.get("cpu_samples"), t.get("processes")
    if path is None or cpu is None or procs is None or cpu.empty:
        return pd.DataFrame(columns=["t_ns", "pid", "tid", "stack_id", "weight_s", "on_cpu", "process", "path_s"])
    segs = path[(path.job >= 0) & path.process.notna()]
    pids = procs.dropna(subset=["pid"]).drop_duplicates("name").set_index("name").pid
    pool = cpu[cpu.on_cpu.fillna(False).astype(bool)] if on_cpu else cpu
    parts = []
    for process, mine in segs.groupby("process"):
        smp = pool[pool.pid == pids.get(process)]
        s0, s1 = union(mine.start_ns, mine.end_ns)
        parts.append(smp[inside(smp.t_ns.to_numpy(), s0, s1)].assign(process=process, path_s=(s1 - s0).sum() / 1e9))
    return pd.concat(parts, ignore_index=True) if parts else pool.iloc[:0].assign(process="", path_s=0.0)


def loops_in_user_code(t: dict) -> tuple[float, list[dict]]:
    """The schedulers' and workers' event loops in the user's own code: the CPU seconds of their on-CPU
    samples on the path with a frame of the user's innermost, and the user's functions their samples,
    on a CPU or blocked, anywhere in the run, most often show (a blocked thread is read every 200 ms
    only, too rarely to place on the path)."""
    procs = t.get("processes")
    if procs is None or t.get("cpu_samples") is None:
        return 0.0, []
    servers = procs[procs.role.isin(["scheduler", "worker"])].pid
    on_path = path_samples(t)
    on_path = on_path[on_path.pid.isin(servers) & (on_path.tid == on_path.pid)]
    mine = on_path.stack_id.map(user_frames(t)).notna()
    cpu = t["cpu_samples"]
    loops = cpu[cpu.pid.isin(servers) & (cpu.tid == cpu.pid) & (cpu.source == "pyspy")]
    return float(on_path.weight_s[mine].sum()), top_functions(t, loops, top=3)


def imports_on_path(t: dict) -> pd.DataFrame:
    """CPU seconds that processes on the critical path of a job spent importing modules (their on-CPU
    samples inside their own path segments whose stacks import), by process and top-level module."""
    smp = path_samples(t)
    if smp.empty or t.get("stacks") is None:
        return pd.DataFrame(columns=["process", "module", "seconds"])
    smp = smp.assign(module=smp.stack_id.map(_imported_module(t["stacks"], t["frames"]))).dropna(subset=["module"])
    return smp.groupby(["process", "module"]).weight_s.sum().rename("seconds").reset_index()


def _imported_module(stacks: pd.DataFrame, frames: pd.DataFrame) -> pd.Series:
    """stack_id -> the top-level module an import in that stack was loading (None: no import)."""
    f = frames.set_index("frame_id")
    importing = set(f.index[f.function == IMPORTING])
    module_level = f.filename[f.function == "<module>"].to_dict()

    def top(ids) -> str | None:
        ids = list(ids)
        outer = max((i for i, fid in enumerate(ids) if fid in importing), default=None)
        if outer is None:
            return None
        inner = next((module_level[fid] for fid in reversed(ids[:outer]) if fid in module_level), None)
        return _module_name(inner) if inner else "?"
    return stacks.set_index("stack_id").frame_ids.map(top)


def _module_name(filename: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1].split("/", 1)[0].removesuffix(".py")
    name = filename.rsplit("/", 2)
    return name[-2] if name[-1] == "__init__.py" and len(name) > 1 else name[-1].removesuffix(".py")


SPILLING = re.compile(r"distributed/spill\.py|/zict/")


def spills_on_path(t: dict) -> pd.Series:
    """By process, CPU seconds on the critical path in Dask's spilling code (the largest first)."""
    smp = path_samples(t)
    if smp.empty:
        return pd.Series(dtype="float64")
    f = t["frames"].set_index("frame_id")
    spill_frames = set(f.index[f.filename.fillna("").str.contains(SPILLING)])
    frames_of = t["stacks"].set_index("stack_id").frame_ids
    hit = smp[smp.stack_id.map(frames_of).map(lambda ids: any(i in spill_frames for i in ids))]
    return hit.groupby("process").weight_s.sum().sort_values(ascending=False)

