"""Findings: what the split says to change, in the user's terms.

Each finding names a cause that took at least MIN_SHARE of the session (or
recomputed keys, whatever their share), the seconds it cost with their 90%
interval where they rest on samples, the evidence, and what to try. They are
ordered by seconds; the terminal shows the first three, the report all.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .intervals import inside, intersect, overlap_ns, union
from .thread_state import of_thread

MIN_SHARE = 0.10
SHUFFLE_PREFIXES = ("set_index", "set-index", "sort", "quantile", "divisions", "shuffle", "percentile")


def findings(s: dict, t: dict, meta: dict) -> list[dict]:
    """`s`: the summary so far; `t`: the decoded tables and the analysis' (tasks, critical_path,
    cpu_samples, thread_states, stack_categories); `meta`: run.json."""
    session = s["session_s"] or 1.0
    found = [f for f in (_recomputed(s), _saturation(s, meta), _client(s, t), _starvation(s, t, meta),
                         _gil(s, t, meta), _task_gil(s, t, meta), _stragglers(s, t), _hot_function(s, t),
                         _cold_start(s, t), _spilling(s, t), _loop_blocked(s, t), _decisions(s), _overhead(s), _network(s), _graph_data(s, t),
                         _materialization(s, t),
                         _transfers(s), _workers_wait(s)) if f]
    for f in found:
        f["share"] = f["seconds"] / session
    return sorted((f for f in found if f["share"] >= MIN_SHARE or f["id"] == "recomputed"),
                  key=lambda f: -f["seconds"])


def _finding(id_: str, seconds: float, title: str, evidence: str, advice: str, s: dict | None = None,
             category: str | None = None) -> dict:
    interval = (s or {}).get("critical_path_interval_s", {}).get(category or "", {})
    return {"id": id_, "seconds": float(seconds), "interval_s": [interval["lo"], interval["hi"]]
            if interval.get("samples") else None, "title": title, "evidence": evidence, "advice": advice}


def _cat(s: dict, category: str) -> float:
    return s["critical_path_s"].get(category, 0.0)


def _parts(s: dict, *texts: str) -> float:
    """Seconds of the critical path's parts named with any of the texts (each part once)."""
    return sum(v for k, v in s["critical_path_parts_s"].items() if any(t in k for t in texts))


def _recomputed(s: dict) -> dict | None:
    again = s["recomputed"]
    if not again["keys"]:
        return None
    top = list(again["by_prefix"].items())[:3]  # by extra computations, the most first
    shuffle = any(p in prefix for prefix, _ in top for p in SHUFFLE_PREFIXES)
    shared = "persist() what several computations share, or compute the outputs together with dask.compute(a, b)"
    advice = ("pass divisions= (or sorted=True) to set_index/sort_values, or persist() the frame before it: Dask "
              f"computes the frame once to find its divisions and again for the result; and {shared}") if shuffle \
        else shared
    return _finding("recomputed", again["compute_s"],
                    f"{again['keys']} keys were computed more than once",
                    f"{again['times']} extra computations, {again['compute_s']:.2f} s of compute; most in "
                    + ", ".join(f"'{p}' ({r['keys']} keys, {r['times']} extra)" for p, r in top), advice)


def _saturation(s: dict, meta: dict) -> dict | None:
    sec = _parts(s, "worker saturation")
    if not sec:
        return None
    c = meta.get("cluster", {})
    threads = c.get("workers", 0) * c.get("threads", 0)
    # more threads than cores, or the path waited for a CPU: more threads would starve more
    full = (meta.get("cpus") and threads >= meta["cpus"]) or _cat(s, "cpu_starvation") >= MIN_SHARE * s["session_s"]
    advice = ("the workers were saturated, and so was the machine (as many worker threads as CPUs, or the path "
              "waited for a CPU): more cores or machines, or cheaper tasks, shorten the path; more threads "
              "here would not") if full else \
        "the workers were saturated and the machine has cores to spare: more workers or threads shorten the path"
    return _finding("worker-saturation", sec, "tasks on the critical path waited for a worker thread",
                    f"the path ran through tasks that held the thread the next one waited for (their compute and "
                    f"the hand-over), with {c.get('workers', '?')} worker(s) x {c.get('threads', '?')} thread(s)"
                    + (f" on {meta['cpus']} CPU(s)" if meta.get("cpus") else ""), advice)


DASK_CLIENT_WORK = ("runtime_bookkeeping", "scheduler_decisions")  # rules' categories of Dask's own frames


def client_split(t: dict) -> dict[str, float] | None:
    """The shares of the client's time (the path's client segments) its main thread spent in Dask's
    client-side work (building, optimizing and serializing graphs: stacks in Dask's code), in the user's
    own code (on a CPU elsewhere), and waiting (off a CPU), from its samples there."""
    path, cpu, cats = t.get("critical_path"), t.get("cpu_samples"), t.get("stack_categories")
    if path is None or cpu is None or cats is None:
        return None
    segs = path[path.kind == "client"].sort_values("start_ns")
    main = cpu[(cpu.role == "client") & (cpu.tid == cpu.pid) & (cpu.source == "pyspy")]
    main = main[inside(main.t_ns.to_numpy(), *union(segs.start_ns, segs.end_ns))]
    if len(main) < 5:
        return None
    rule = main.stack_id.map(cats.set_index("stack_id").category)
    on = main.on_cpu.fillna(False).astype(bool)
    kinds = np.where(~on, "waiting", np.where(rule.isin(DASK_CLIENT_WORK), "dask", "yours"))
    return (pd.Series(kinds).value_counts() / len(kinds)).to_dict() | {"samples": len(kinds)}


def _client(s: dict, t: dict) -> dict | None:
    sec, jobs = _cat(s, "client"), len(s["jobs"])
    if not sec:
        return None
    split = client_split(t) or {}
    evidence = (f"time in which no computation of the client's was in the cluster, or the client had its result "
                f"and had not yet submitted the next ({jobs} computation(s))")
    if split:
        evidence += (f"; by its main thread's {split['samples']} samples: Dask's client-side work "
                     f"{split.get('dask', 0):.0%}, your own code {split.get('yours', 0):.0%}, waiting "
                     f"{split.get('waiting', 0):.0%}")
    if split.get("dask", 0) > max(split.get("yours", 0), split.get("waiting", 0)):
        return _finding("client-graph", sec * split["dask"], "the cluster waited on Dask's client-side work",
                        evidence + ": building, optimizing and serializing task graphs",
                        "fewer, larger tasks (larger chunks or partitions; collections rather than a loop of "
                        "delayed calls), so the graph is smaller to build and send")
    return _finding("client", sec, "the cluster waited on the client", evidence,
                    "compute outputs together (dask.compute(a, b)), submit the next work before processing "
                    "results (futures, as_completed), or move the client's own work onto the cluster")


def _starvation(s: dict, t: dict, meta: dict) -> dict | None:
    sec = _cat(s, "cpu_starvation")
    if not sec:
        return None
    c = meta.get("cluster", {})
    held = cpu_holders(t)
    return _finding("cpu-starvation", sec, "threads on the critical path waited for a CPU",
                    f"runnable without a CPU; the cluster ran {c.get('workers', '?')} worker(s) x "
                    f"{c.get('threads', '?')} thread(s) plus the scheduler and client"
                    + (f" on {meta['cpus']} CPU(s)" if meta.get("cpus") else "")
                    + (f"; meanwhile the CPUs ran {held}" if held else ""),
                    "the machine has more busy threads than cores: fewer workers or threads, or more cores; "
                    "or less of the work that held the CPUs")


def cpu_holders(t: dict, top: int = 3) -> str | None:
    """What the sampled threads on a CPU were doing while an event loop waited for one within a job:
    the largest (process, category) shares of on-CPU samples inside event loops' runnable intervals
    (outside jobs a client's imports, say, are not what starved the path)."""
    states, cpu, path = t.get("thread_states"), t.get("cpu_samples"), t.get("critical_path")
    if states is None or cpu is None or path is None or states.empty or cpu.empty:
        return None
    waits = states[(states.state == "runnable") & (states.tid == states.pid)]
    jobs = path[path.job >= 0]
    waited = intersect(*union(waits.start_ns, waits.end_ns), *union(jobs.start_ns, jobs.end_ns))[:2]
    running = cpu[cpu.on_cpu.fillna(False).astype(bool)]  # on a CPU: never one of the waiting threads then
    inside_ = inside(running.t_ns.to_numpy(), *waited)
    # weighted by the time each sample stands for: Python and eBPF samples come at different rates
    share = running[inside_].groupby(["process", "category"]).weight_s.sum()
    if share.empty or not share.sum():
        return None
    share = (share / share.sum()).sort_values(ascending=False).head(top)
    return ", ".join(f"{p} {c} {v:.0%}" for (p, c), v in share.items()) + f" (of {int(inside_.sum())} samples)"


TASK_GIL = "task thread waiting for the GIL"


def _gil_by_process(s: dict, task_threads: bool) -> dict[str, float]:
    """Seconds of gil_contention on the path by kind of process (scheduler, worker), of task threads'
    waits or of event loops'."""
    out: dict[str, float] = {}
    for k, v in s["critical_path_parts_s"].items():
        if k.endswith("[gil_contention]") and (TASK_GIL in k) == task_threads:
            kind = k.split(":", 1)[0]
            out[kind] = out.get(kind, 0.0) + v
    return out


def _gil(s: dict, t: dict, meta: dict) -> dict | None:
    where = _gil_by_process(s, task_threads=False)
    sec = sum(where.values())
    if not sec:
        return None
    holder = gil_holder(t, roles=[k for k in where if where[k] > 0])
    threads = meta.get("cluster", {}).get("threads") or 0
    worker = where.get("worker", 0) + where.get("compute", 0) >= where.get("scheduler", 0)
    if worker and threads > 1:
        advice = ("a task that holds the GIL delays its worker's event loop: with several threads per worker, use "
                  "more worker processes with fewer threads each, or tasks that release the GIL (numpy, numba, "
                  "Cython nogil)")
    elif worker:
        advice = ("the worker's one task thread holds the GIL while its event loop waits: tasks that release it "
                  "(numpy, numba, Cython nogil), or shorter tasks")
    else:
        advice = "another thread of the scheduler holds the GIL: a plugin, preload or library thread in it"
    return _finding("gil-contention", sec, "event loops waited for the GIL",
                    "event-loop time on the path spent waiting to take the GIL ("
                    + ", ".join(f"{k} {v:.2f} s" for k, v in where.items() if v) + ")"
                    + (f"; meanwhile the GIL was most often held by {holder}" if holder else ""), advice)


def _task_gil(s: dict, t: dict, meta: dict) -> dict | None:
    sec = sum(_gil_by_process(s, task_threads=True).values())
    if not sec:
        return None
    c = meta.get("cluster", {})
    hot = hot_functions(t, top=1)
    return _finding("task-gil", sec, "tasks waited for the GIL held by other tasks",
                    f"task threads on the critical path waited {sec:.2f} s to take the GIL, time Dask counts "
                    f"as compute; {c.get('workers', '?')} worker(s) x {c.get('threads', '?')} thread(s)"
                    + (f"; the tasks' own code was most often in {hot[0]['where']}" if hot else ""),
                    "pure-Python tasks run one at a time in a process however many threads it has: more "
                    "worker processes with one thread each (dask worker --nworkers N --nthreads 1, or "
                    "LocalCluster(n_workers=N, threads_per_worker=1)), or code that releases the GIL (numpy, "
                    "pandas built-ins, numba)")


def gil_holder(t: dict, roles: list[str] | None = None) -> str | None:
    """The function most often on top of a non-main thread's GIL-holding samples (the sampler reads the
    holder's stack at each read of it: a tick on it, and every 200 ms), with its process; only of the
    processes of `roles` (a thread holds its own process's GIL only)."""
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
    process, thread, stack_id = held.groupby(["process", "thread_name", "stack_id"]).size().idxmax()
    frames = t["stacks"].set_index("stack_id").frame_ids.get(stack_id)
    if frames is None or not len(frames):
        return f"thread '{thread}' of {process}"
    f = t["frames"].set_index("frame_id").loc[frames[0]]
    return f"thread '{thread}' of {process}, in {f.function} ({f.filename.rsplit('/', 1)[-1]}:{f.line})"


def _decisions(s: dict) -> dict | None:
    sec = _cat(s, "scheduler_decisions")
    return _finding("scheduler-decisions", sec, "the scheduler spent the path's time choosing workers",
                    "in worker choice, work stealing and occupancy estimates",
                    "fewer, larger tasks; or try distributed.scheduler.work-stealing: false", s,
                    "scheduler_decisions") if sec else None


def bookkeeping_per_task(s: dict) -> float | None:
    """CPU seconds Dask's runtime (scheduler and workers: bookkeeping and decisions) spent per task."""
    n = s["tasks"]
    if not n:
        return None
    cpu = s.get("cpu_by_category_s", {})
    return sum(v for p, cats in cpu.items() if p == "scheduler" or p.startswith("worker")
               for c, v in cats.items() if c in DASK_CLIENT_WORK) / n


def _overhead(s: dict) -> dict | None:
    sec, n = _cat(s, "runtime_bookkeeping"), s["tasks"]
    compute_per_task = s["compute_s"] / n if n else 0.0
    aot, per_task = s["aot_s"] or 0.0, bookkeeping_per_task(s)
    # the premise: Dask's own work per task exceeds the task's, and tasks are short for the makespan
    if not sec or aot <= 2 * compute_per_task or per_task is None or per_task <= compute_per_task:
        return None
    return _finding("task-overhead", sec, "Dask's work per task outweighs the tasks' own",
                    f"runtime bookkeeping on the path; {n} tasks, each computing "
                    f"{compute_per_task * 1e3:.2f} ms on average against {per_task * 1e3:.2f} ms of Dask's CPU "
                    f"(scheduler and workers) and {aot * 1e3:.2f} ms of the jobs' makespan per task",
                    "fewer, bigger tasks: larger chunks or partitions, fewer delayed calls (each task costs Dask "
                    "about a millisecond whatever it does)", s, "runtime_bookkeeping")


BIG_GRAPH_BYTES = 10e6        # a graph this large, at this much per task, carries data rather than tasks
DATA_PER_TASK_BYTES = 100e3


def graph_bytes(t: dict) -> tuple[float, int]:
    """Bytes of the client's graph uploads, and the tasks they carried."""
    g, tasks = t.get("graphs"), t.get("tasks")
    if g is None or g.empty:
        return 0.0, 0
    return float(g[g.src_role == "client"].msg_bytes.sum()), int(len(tasks)) if tasks is not None else 0


def _graph_data(s: dict, t: dict) -> dict | None:
    size, n = graph_bytes(t)
    if size < BIG_GRAPH_BYTES or not n or size / n < DATA_PER_TASK_BYTES:
        return None
    sec = _parts(s, "graph upload", "scheduler: graph to dispatch") + \
        (client_split(t) or {}).get("dask", 0.0) * _cat(s, "client")
    return _finding("data-in-graph", sec, "the task graphs carried data",
                    f"the client sent {size / 1e6:.0f} MB of graphs for {n} tasks ({size / n / 1e3:.0f} kB per task): "
                    "objects embedded in the graph are serialized, sent and unpacked with it each time",
                    "do not put large objects into tasks' arguments: client.scatter(data) and pass the future, or "
                    "load the data inside the tasks (dask.dataframe.read_parquet, dask.array.from_zarr, "
                    "dask.delayed(load)(path))")


def _materialization(s: dict, t: dict) -> dict | None:
    sec = _parts(s, "scheduler: graph to dispatch")
    size, n = graph_bytes(t)
    if n and size / n >= DATA_PER_TASK_BYTES:  # a few tasks carrying data: fewer tasks would not help
        return None
    return _finding("graph-materialization", sec, "the scheduler took long from a graph's arrival to its first "
                    "dispatch", "time on the path between an update-graph arriving and its first compute-task "
                    "leaving: unpacking, materializing and ordering the graph",
                    "submit fewer tasks (larger chunks or partitions), build collections rather than many "
                    "delayed calls in a loop (each is a graph layer), or persist intermediate results"
                    ) if sec else None


def _transfers(s: dict) -> dict | None:
    sec = _parts(s, "get_data", "inputs")  # "serving inputs (get_data)" is one part, not two
    return _finding("transfers", sec, "moving task inputs between workers held up the path",
                    "time on the path fetching inputs from other workers (requests, replies and the work on "
                    "both sides)", "place dependent tasks together (fewer, larger partitions; avoid shuffles "
                    "where a map_partitions would do), or give workers more memory so inputs stay put"
                    ) if sec else None


def _workers_wait(s: dict) -> dict | None:
    own = ("[runtime_bookkeeping]", "[scheduler_decisions]")  # its own work (by samples), not its waits
    sec = sum(v for k, v in s["critical_path_parts_s"].items() if k.startswith("scheduler:") and k.endswith(own))
    idle = s.get("worker_idle_s") or {}
    mean_idle = sum(idle.values()) / len(idle) / s["makespan_s"] if idle and s["makespan_s"] else 0.0
    if mean_idle < 0.5:
        return None
    return _finding("scheduler-bound", sec, "workers sat idle while the path ran through the scheduler",
                    f"the workers held no task {100 * mean_idle:.0f}% of the makespan on average, while the "
                    "path spent this long in the scheduler's own work (bookkeeping and decisions)",
                    "the scheduler is the bottleneck: fewer, larger "
                    "tasks; fewer workers will not slow it; see the scheduler's categories for where its time went")


def _network(s: dict) -> dict | None:
    sec = _cat(s, "network")
    return _finding("network", sec, "messages on the path took long on the wire",
                    "between first and last byte of messages on the path; "
                    f"{(s['bytes_per_task'] or 0) / 1e3:.1f} kB on the wire per task",
                    "move less data: keep intermediate results on the workers (persist, no gather), larger "
                    "chunks so fewer transfers, results reduced before they reach the client") if sec else None



STRAGGLER_FACTOR = 5.0   # a task this many times its prefix's median compute, and
STRAGGLER_MIN_S = 0.01   # this many seconds over it, is a straggler
LIBRARY = ("site-packages", "dist-packages", "/lib/python", "<frozen", "<string>")


def stragglers(t: dict) -> pd.DataFrame:
    """Tasks on the critical path whose compute took far longer than their prefix's median (of at least 5
    tasks): job, key, prefix, worker, compute_s, median_s, path_s (their compute seconds on the path)."""
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


def _why(row, t: dict) -> str:
    """What the thread that ran a task did in its compute span, from its eBPF states."""
    states, threads, procs = t.get("thread_states"), t.get("threads"), t.get("processes")
    if states is None or threads is None or procs is None or states.empty or pd.isna(row.thread):
        return ""
    pid = procs[procs.name == row.worker].pid
    tid = threads[threads.pid.isin(pid) & (threads.ident == row.thread)].tid
    if pid.empty or tid.empty:
        return ""
    st, s0, s1 = of_thread(states, int(pid.iloc[0]), int(tid.iloc[0])), [row.compute_start_ns], [row.compute_stop_ns]
    span = row.compute_stop_ns - row.compute_start_ns
    waits = {w: int(overlap_ns(s0, s1, *st[state])[0]) / span
             for state, w in (("gil", "waiting for the GIL"), ("runnable", "waiting for a CPU"), ("blocked", "blocked"))}
    return ", ".join([f"on a CPU {max(0.0, 1 - sum(waits.values())):.0%}"] + [f"{w} {v:.0%}" for w, v in waits.items()
                                                                            if v >= 0.05])


def _stragglers(s: dict, t: dict) -> dict | None:
    slow = stragglers(t)
    if slow.empty:
        return None
    sec = float((slow.path_s - slow.median_s).clip(lower=0).sum())
    top = [f"{r.key} ({r.prefix}) {r.compute_s:.2f} s on {r.worker} against a median of {r.median_s:.3f} s"
           + (f" ({why})" if (why := _why(r, t)) else "") for r in slow.head(3).itertuples()]
    return _finding("straggler", sec, f"{len(slow)} straggling task(s) held the critical path",
                    "tasks that took far longer than others of their kind, while the path waited for them: "
                    + "; ".join(top),
                    "find why these keys are slow (their data: a skewed partition or a larger chunk; their "
                    "worker: one that is busier or slower): repartition evenly, or split the slow inputs")


def user_frames(t: dict) -> pd.Series:
    """stack_id -> the innermost frame of the user's own code in it (frame_id), outside libraries."""
    stacks, frames = t.get("stacks"), t.get("frames")
    if stacks is None or frames is None:
        return pd.Series(dtype="float64")
    mine = set(frames.frame_id[~frames.filename.fillna("").str.contains("|".join(map(re.escape, LIBRARY)))])
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


def hot_functions(t: dict, top: int = 3) -> list[dict]:
    """The user's own functions most often running inside tasks' compute spans (worker samples in
    compute), with their share of those samples."""
    cpu = t.get("cpu_samples")
    if cpu is None or cpu.empty:
        return []
    comp = cpu[(cpu.category == "compute") & cpu.on_cpu.fillna(False).astype(bool) & (cpu.source == "pyspy")]
    return top_functions(t, comp, top) if len(comp) >= 10 else []


def _hot_function(s: dict, t: dict) -> dict | None:
    hot = hot_functions(t, top=3)
    comp = _cat(s, "compute")
    if not hot or hot[0]["share"] < 0.3 or comp < MIN_SHARE * s["session_s"]:
        return None
    h = hot[0]
    return _finding("hot-function", comp * h["share"], f"the tasks spent their time in {h['function']}",
                    f"{h['share']:.0%} of the tasks' on-CPU samples ({h['samples']}) were in your function "
                    f"{h['where']}; compute was {comp:.2f} s of the critical path"
                    + ("; then " + ", ".join(f"{x['where']} {x['share']:.0%}" for x in hot[1:]) if hot[1:] else ""),
                    f"speed up {h['function']}: vectorize it (numpy or pandas operations instead of Python loops "
                    "and row-wise apply), or compile it (numba); it is where the compute went")


IMPORTING = "_find_and_load"  # importlib's frame under every import statement


def path_samples(t: dict) -> pd.DataFrame:
    """On-CPU samples that processes took inside their own segments of a job's critical path (cpu_samples'
    rows): what each process on the path was running while the path was in it."""
    path, cpu, procs = t.get("critical_path"), t.get("cpu_samples"), t.get("processes")
    if path is None or cpu is None or procs is None or cpu.empty:
        return pd.DataFrame(columns=["t_ns", "pid", "tid", "stack_id", "weight_s", "process"])
    segs = path[(path.job >= 0) & path.process.notna()]
    pids = procs.dropna(subset=["pid"]).drop_duplicates("name").set_index("name").pid
    on = cpu[cpu.on_cpu.fillna(False).astype(bool)]
    parts = []
    for process, mine in segs.groupby("process"):
        smp = on[on.pid == pids.get(process)]
        parts.append(smp[inside(smp.t_ns.to_numpy(), *union(mine.start_ns, mine.end_ns))].assign(process=process))
    return pd.concat(parts, ignore_index=True) if parts else on.iloc[:0].assign(process="")


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


def _cold_start(s: dict, t: dict) -> dict | None:
    imports = imports_on_path(t)
    sec = float(imports.seconds.sum())
    if not sec:
        return None
    by_process = imports.groupby("process").seconds.sum().sort_values(ascending=False)
    modules = imports.groupby("module").seconds.sum().sort_values(ascending=False).head(4)
    return _finding("cold-start", sec, "processes imported modules while the path waited",
                    "CPU time importing, inside jobs, on the critical path: "
                    + ", ".join(f"{p} {v:.2f} s" for p, v in by_process.items())
                    + "; modules: " + ", ".join(f"{m} {v:.2f} s" for m, v in modules.items()),
                    "a cold start: each new process imports what its first tasks need. Import it before timing "
                    "(a worker preload: dask worker --preload MODULE, or client.run(importlib.import_module, "
                    "'MODULE') once), or keep one cluster alive across computations")


SPILLING = re.compile(r"distributed/spill\.py|/zict/")


def _spilling(s: dict, t: dict) -> dict | None:
    smp = path_samples(t)
    if smp.empty:
        return None
    f = t["frames"].set_index("frame_id")
    spill_frames = set(f.index[f.filename.fillna("").str.contains(SPILLING)])
    hit = smp[smp.stack_id.map(t["stacks"].set_index("stack_id").frame_ids).map(
        lambda ids: any(i in spill_frames for i in ids))]
    sec = float(hit.weight_s.sum())
    if not sec:
        return None
    by = hit.groupby("process").weight_s.sum().sort_values(ascending=False)
    return _finding("spilling", sec, "workers spilled data to disk while the path waited",
                    "CPU time on the critical path in Dask's spilling (writing results to disk and reading them "
                    "back): " + ", ".join(f"{p} {v:.2f} s" for p, v in by.items()),
                    "the workers' memory did not hold their data: more memory per worker (fewer, larger workers, "
                    "or a higher memory_limit), smaller chunks or partitions, or fewer results held at once "
                    "(persist less, release what is no longer needed)")


def _loop_blocked(s: dict, t: dict) -> dict | None:
    smp = path_samples(t)
    procs = t.get("processes")
    if smp.empty or procs is None:
        return None
    servers = procs[procs.role.isin(["scheduler", "worker"])].pid
    loop = smp[smp.pid.isin(servers) & (smp.tid == smp.pid)]
    top = top_functions(t, loop, top=3)
    sec = sum(x["seconds"] for x in top)
    if not top or not sec:
        return None
    h = top[0]
    return _finding("event-loop-blocked", sec, f"your code ran on Dask's event loop: {h['function']}",
                    "while the path was in the scheduler or a worker, its event loop ran your own code: "
                    + ", ".join(f"{x['where']} {x['seconds']:.2f} s" for x in top),
                    "nothing else in that process moves while its event loop runs your code (a plugin, a handler, "
                    "client.run or run_on_scheduler): make it quick, or run it in a thread "
                    "(loop.run_in_executor) or as a task")
