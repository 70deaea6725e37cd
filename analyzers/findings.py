"""Findings: what the split says to change, in the user's terms.

Each finding names a cause that took at least MIN_SHARE of the session (or
recomputed keys, whatever their share), the seconds it cost with their 90%
interval where they rest on samples, the evidence, and what to try. They are
ordered by seconds; the terminal shows the first three, the report all.
"""

from __future__ import annotations

from .intervals import inside, intersect, union

MIN_SHARE = 0.10
SHUFFLE_PREFIXES = ("set_index", "set-index", "sort", "quantile", "divisions", "shuffle", "percentile")


def findings(s: dict, t: dict, meta: dict) -> list[dict]:
    """`s`: the summary so far; `t`: the decoded tables; `meta`: run.json."""
    session = s["session_s"] or 1.0
    found = [f for f in (_recomputed(s), _saturation(s, meta), _client(s), _starvation(s, t, meta),
                         _gil(s, t), _decisions(s), _overhead(s), _network(s), _materialization(s),
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


def _client(s: dict) -> dict | None:
    sec, jobs = _cat(s, "client"), len(s["jobs"])
    return _finding("client", sec, "the cluster waited on the client",
                    f"time in which no computation of the client's was in the cluster, or the client "
                    f"had its result and had not yet submitted the next ({jobs} computation(s))",
                    "compute outputs together (dask.compute(a, b)), submit the next work before processing "
                    "results (futures, as_completed), or move the client's own work onto the cluster"
                    ) if sec else None


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


def _gil(s: dict, t: dict) -> dict | None:
    sec = _cat(s, "gil_contention")
    if not sec:
        return None
    holder = gil_holder(t)
    return _finding("gil-contention", sec, "event loops waited for the GIL",
                    "event-loop time on the path spent waiting to take the GIL"
                    + (f"; meanwhile the GIL was most often held by {holder}" if holder else ""),
                    "another thread of the same process holds the GIL: a task that does not release it on a "
                    "worker with several threads (use more processes with one thread each), or a plugin, "
                    "preload or library thread in the scheduler")


def gil_holder(t: dict) -> str | None:
    """The function most often on top of a non-main thread's GIL-holding samples (the sampler reads the
    holder's stack at each read of it: a tick on it, and every 200 ms), with its process."""
    smp = t["samples"]
    if smp.empty or "owns_gil" not in smp:
        return None
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


def _overhead(s: dict) -> dict | None:
    sec, n = _cat(s, "runtime_bookkeeping"), s["tasks"]
    compute_per_task = s["compute_s"] / n if n else 0.0
    aot = s["aot_s"] or 0.0
    if not sec or aot <= 2 * compute_per_task:
        return None
    return _finding("task-overhead", sec, "Dask's work per task outweighs the tasks' own",
                    f"runtime bookkeeping on the path; {n} tasks, each computing "
                    f"{compute_per_task * 1e3:.2f} ms on average against {aot * 1e3:.2f} ms of makespan per task",
                    "fewer, bigger tasks: larger chunks or partitions, fewer delayed calls (each task costs Dask "
                    "about a millisecond whatever it does)", s, "runtime_bookkeeping")


def _materialization(s: dict) -> dict | None:
    sec = _parts(s, "scheduler: graph to dispatch")
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

