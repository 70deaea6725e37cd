"""Findings: what the split says to change, in the user's terms.

Each finding names a cause that took at least MIN_SHARE of the session (or
recomputed keys, whatever their share), the seconds it cost with their 90%
interval where they rest on samples, the evidence, and what to try. They are
ordered by seconds; the terminal shows the first three, the report all.
"""

from __future__ import annotations

from .evidence import (blocked_in, bookkeeping_per_task, cpu_holders, cpu_share_of, cpu_shares,
                       gil_holder, gil_holder_thread, gil_holders_beside_tasks, heaviest_graphs, hot_functions,
                       imports_on_path, loops_in_user_code, oversubscribed_s, p2p_on_path, spills_on_path,
                       stragglers, why_slow)
from .local import NEW_PROCESS
from .task_threads import TASK_BLOCKED
from .whatif.costs import layout

MIN_SHARE = 0.10
MIN_NATIVE = 0.2  # of the CPU samples while the path waited for a CPU: a library's pool, if more than Dask's own
SHUFFLE_PREFIXES = ("set_index", "set-index", "sort", "quantile", "divisions", "shuffle", "percentile")


def findings(s: dict, t: dict, meta: dict) -> list[dict]:
    """`s`: the summary so far; `t`: the decoded tables and the analysis' (tasks, critical_path,
    cpu_samples, thread_states, stack_categories) and the evidence several rules read (path_samples,
    stragglers, client_split); `meta`: run.json."""
    session = s["session_s"] or 1.0
    found = [f for f in (_recomputed(s), _saturation(s, t, meta), _client(s, t), _starvation(s, t, meta),
                         _gil(s, t, meta), _task_gil(s, t, meta), _stragglers(s, t), _hot_function(s, t),
                         _cold_start(s, t), _blocked_tasks(s, t, meta), _spilling(s, t), _loop_blocked(s, t),
                         _decisions(s), _overhead(s, meta),
                         _network(s), _graph_data(s, t), _materialization(s, t), _transfers(s, t), _workers_wait(s))
             if f]
    return _ranked(found, session)


def local_findings(s: dict, t: dict, meta: dict) -> list[dict]:
    """The findings of a run of Dask's local schedulers (threads, processes, sync; analyzers/local.py):
    `s`, `t` and `meta` as findings'."""
    found = [f for f in (_recomputed(s), _local_gil(s, t), _local_overhead(s), _local_starvation(s, meta),
                         _pool_start(s), _hot_function(s, t)) if f]
    return _ranked(found, s["session_s"] or 1.0)


def _ranked(found: list[dict], session: float) -> list[dict]:
    for f in found:
        f["share"] = f["seconds"] / session
    return sorted((f for f in found if f["share"] >= MIN_SHARE or f["id"] == "recomputed"),
                  key=lambda f: -f["seconds"])


def _finding(id_: str, seconds: float, title: str, evidence: str, advice: str, s: dict | None = None,
             category: str | None = None, what_if: dict | None = None) -> dict:
    """what_if: the change of the what-if model (whatif.Changes' fields) that the advice amounts to; None
    where the model cannot express it (analyzers/whatif/advice.py then says why)."""
    interval = (s or {}).get("critical_path_interval_s", {}).get(category or "", {})
    return {"id": id_, "seconds": float(seconds), "interval_s": [interval["lo"], interval["hi"]]
            if interval.get("samples") else None, "title": title, "evidence": evidence, "advice": advice,
            "what_if": what_if}


def _cluster(t: dict, meta: dict) -> tuple[int, int, int]:
    """The run's workers, threads per worker and cores, as the what-if model has them (run.json's, where
    the tables lack the tasks' workers)."""
    c = meta.get("cluster", {})
    if "worker" not in getattr(t.get("tasks"), "columns", ()) or t.get("processes") is None:
        return int(c.get("workers") or 1), int(c.get("threads") or 1), int(meta.get("cpus") or 2)
    workers, threads, cores, _ = layout(t, meta)
    return len(workers), threads, cores


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


def _saturation(s: dict, t: dict, meta: dict) -> dict | None:
    # the holding tasks' waits for the GIL or a CPU are those findings' (task-gil, cpu-starvation), not this one's
    sec = sum(v for k, v in s["critical_path_parts_s"].items()
              if "worker saturation" in k and not k.endswith(("[gil_contention]", "[cpu_starvation]")))
    # threads held by stragglers, or busy reading and writing spilled data: those findings' seconds
    spilled, blocked = float(spills_on_path(t).sum()), _parts(s, TASK_BLOCKED)
    sec = max(0.0, sec - spilled - _straggling_s(t) - blocked)  # blocked: those threads left their CPU free
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
    workers, _, cores = _cluster(t, meta)
    what_if = {"cores": 2 * cores} if full else {"workers": 2 * workers}
    if spilled >= MIN_SHARE * s["session_s"]:  # more threads per worker would hold more data in the same memory
        advice = ("the workers were saturated while they spilled: more workers (each with its own memory) or "
                  "smaller chunks; more threads per worker would hold more data in the same memory")
        what_if = None  # the model has no memory: more workers would spill less, which it cannot say
    return _finding("worker-saturation", sec, "tasks on the critical path waited for a worker thread",
                    f"the path ran through tasks that held the thread the next one waited for (their compute and "
                    f"the hand-over), with {c.get('workers', '?')} worker(s) x {c.get('threads', '?')} thread(s)"
                    + (f" on {meta['cpus']} CPU(s)" if meta.get("cpus") else ""), advice, what_if=what_if)


def _client(s: dict, t: dict) -> dict | None:
    sec, jobs = _cat(s, "client"), len(s["jobs"])
    if not sec:
        return None
    split = t.get("client_split") or {}
    evidence = (f"time in which no computation of the client's was in the cluster, or the client had its result "
                f"and had not yet submitted the next ({jobs} computation(s))")
    if split:
        evidence += (f"; by the client's {split['samples']} sample reads: Dask's client-side work "
                     f"{split.get('dask', 0):.0%}, your own code {split.get('yours', 0):.0%}, waiting "
                     f"{split.get('waiting', 0):.0%}")
    if _data_graph(s) and split:  # data-in-graph's seconds hold the client's Dask share: not counted twice
        sec, split = sec * (1 - split["dask"]), split | {"dask": 0.0}
        evidence += " (Dask's share is counted under data-in-graph)"
    if split.get("dask", 0) > max(split.get("yours", 0), split.get("waiting", 0)):
        return _finding("client-graph", sec * split["dask"], "the cluster waited on Dask's client-side work",
                        evidence + ": building, optimizing and serializing task graphs",
                        "fewer, larger tasks (larger chunks or partitions; collections rather than a loop of "
                        "delayed calls), so the graph is smaller to build and send")
    if jobs < 2:  # nothing to overlap or merge: the script's own time before its work and after its result
        return _finding("client", sec, "the cluster waited on the client", evidence,
                        "this is your script's own time before it submitted its computation or after its result "
                        "came (loading or building inputs, handling the output): speed that code up, or let the "
                        "cluster do it (read the inputs with Dask, write the outputs from the workers)")
    return _finding("client", sec, "the cluster waited on the client", evidence,
                    "compute outputs together (dask.compute(a, b)), submit the next work before processing "
                    "results (futures, as_completed), or move the client's own work onto the cluster",
                    what_if={"client": 0.0})


def _starvation(s: dict, t: dict, meta: dict) -> dict | None:
    sec = _cat(s, "cpu_starvation") - _cpu_held_by_other(s, t)  # that thread's share: task-gil's
    if not sec:
        return None
    c, cpus = meta.get("cluster", {}), meta.get("cpus")
    held = cpu_holders(t)
    counted = [p["proc_s"] for p in s.get("cpu_check", {}).values() if p.get("proc_s") is not None]  # /proc's
    share = sum(counted) / (cpus * s["makespan_s"]) if counted and cpus and s["makespan_s"] else None
    elsewhere = share is not None and share < 0.5  # runnable threads, yet the cluster had not half the CPUs
    evidence = (f"runnable without a CPU; the cluster ran {c.get('workers', '?')} worker(s) x "
                f"{c.get('threads', '?')} thread(s) plus the scheduler and client"
                + (f" on {cpus} CPU(s)" if cpus else "")
                + (f", and its processes used {share:.0%} of those CPUs over the makespan (their /proc CPU time)"
                   if share is not None else "")
                + (f"; meanwhile the cluster's own samples on a CPU were {held}" if held else ""))
    if elsewhere:
        return _finding("cpu-starvation", sec, "threads on the critical path waited for CPUs taken by other work",
                        evidence, "most of the machine's CPU went to work outside this cluster (other programs, "
                        "or daskprobe's own probes): measure on a quiet machine, or give the cluster cores of its own",
                        what_if={"load": 0.0})
    over = oversubscribed_s(t, cpus or 0)
    shares = cpu_shares(t)
    native = shares.get("native", 0.0)
    if cpus and over < sec and shares and native >= max(MIN_NATIVE, shares["dask"]):
        return _finding("library-threads", sec, "threads on the critical path waited for CPUs busy with threads "
                        "a library started in the workers", evidence + f"; more tasks than CPUs computed at once "
                        f"for only {over:.2f} s; of the eBPF CPU samples meanwhile, {native:.0%} were worker threads "
                        f"Python never saw (a native library's pool), {shares['tasks']:.0%} the task threads, "
                        f"{shares['dask']:.0%} Dask's own and the client" + _pools_said(c),
                        _pools_advice(c))
    if cpus and over < sec:  # the tasks never outnumbered the cores for long enough: fewer threads would not help
        return _finding("cpu-contention", sec, "threads on the critical path waited for CPUs busy with Dask's own "
                        "work", evidence + f"; more tasks than CPUs computed at once for only {over:.2f} s",
                        "the tasks alone did not outnumber the cores: the CPUs went to Dask's own threads (each "
                        "worker process's event loop, the scheduler) and the client; fewer worker processes (more "
                        "threads each where the tasks release the GIL), or a lower sample rate, leave the tasks "
                        "more of the machine")
    return _finding("cpu-starvation", sec, "threads on the critical path waited for a CPU",
                    evidence + f"; more tasks than CPUs computed at once for {over:.2f} s",
                    "the machine has more busy threads than cores: fewer workers or threads, or more cores; "
                    "or less of the work that held the CPUs", what_if=_fewer_threads(t, meta))


POOLS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # BLAS and OpenMP pools' sizes


def _pools(c: dict) -> dict[str, str] | None:
    """The BLAS and OpenMP pool sizes the workers started with (run.json cluster.worker_environ; unset:
    None); None where the run does not say (attach)."""
    env = c.get("worker_environ")
    return None if env is None else {k: env.get(k) for k in POOLS}


def _pools_said(c: dict) -> str:
    pools = _pools(c)
    return "" if pools is None else "; the workers started with " + ", ".join(
        f"{k}={v}" if v is not None else f"{k} unset" for k, v in pools.items())


def _pools_advice(c: dict) -> str:
    """One thread per task thread for the pools the workers had larger (or unset, or not known); where
    they had them all at 1, the threads are another library's."""
    pools = _pools(c)
    wide = [k for k, v in (pools or dict.fromkeys(POOLS)).items() if v != "1"]
    if not wide:
        return ("the workers' BLAS and OpenMP pools had one thread each already: these threads are another "
                "library's pool (numexpr: NUMEXPR_MAX_THREADS; numba: NUMBA_NUM_THREADS; polars: "
                "POLARS_MAX_THREADS; pyarrow: pyarrow.set_cpu_count; torch: torch.set_num_threads): one thread "
                "each per task thread, or fewer task threads")
    return ("the tasks' libraries run threads of their own beside the tasks (BLAS, OpenMP): one each per task "
            f"thread ({', '.join(wide)} set to 1 in the workers' environment"
            + (", as a nanny sets them unless the environment has them" if pools is None else "")
            + "), or fewer task threads")


def _fewer_threads(t: dict, meta: dict) -> dict | None:
    """As many task threads as cores: fewer threads per worker first, then fewer workers; None if no fewer."""
    workers, threads, cores = _cluster(t, meta)
    fewer = max(1, min(threads, cores // workers))
    fewer_workers = max(1, min(workers, cores // fewer))
    return None if (fewer, fewer_workers) == (threads, workers) else {"workers": fewer_workers, "threads": fewer}


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
    # the tasks' own Python held it, or a thread of its own that also held the tasks up: their finding's
    if _loops_held_by_tasks(s, t) or (_task_gil_s(s) and _loops_held_by_other(s, t)):
        where.pop("worker")
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
                    + (f"; meanwhile the GIL was most often held by {holder}" if holder else ""), advice,
                    what_if={"gil": False})


def _cpu_held_by_other(s: dict, t: dict) -> float:
    """The path's waits for a CPU that threads beside the tasks took, when one of them held the workers'
    GIL most: cpu_starvation by those threads' share of what ran meanwhile."""
    if _worker_gil_holder(t) != "other" or not _task_gil_s(s):
        return 0.0
    return _cat(s, "cpu_starvation") * cpu_share_of(t, gil_holders_beside_tasks(t))


def _task_gil_s(s: dict) -> float:
    return sum(_gil_by_process(s, task_threads=True).values())


def _task_gil(s: dict, t: dict, meta: dict) -> dict | None:
    sec = _task_gil_s(s)
    if not sec:
        return None
    c = meta.get("cluster", {})
    if _worker_gil_holder(t) == "other":  # no task's thread held it: a thread of a plugin's, a library's, the user's
        loops, cpu = _loops_held_by_other(s, t), _cpu_held_by_other(s, t)
        return _finding("task-gil", sec + loops + cpu, "tasks waited for the GIL held by a thread that runs no task",
                        f"task threads on the critical path waited {sec:.2f} s to take the GIL, time Dask counts "
                        f"as compute, and the workers' event loops {loops:.2f} s"
                        + (f"; threads waited {cpu:.2f} s for the CPUs it kept busy" if cpu else "")
                        + f"; meanwhile it was most often held by {gil_holder(t, roles=['worker'])}, which ran no task",
                        "a thread beside the tasks (a plugin's, a library's, your own) holds the GIL: make it "
                        "sleep or block between its work, move it out of the worker process, or have it release "
                        "the GIL (numpy, C); more threads or processes for the tasks would not help",
                        what_if={"gil": False, "load": 0.0})  # the thread gone: its GIL and the CPU it took
    loops = _loops_held_by_tasks(s, t)
    return _finding("task-gil", sec + loops, "tasks waited for the GIL held by other tasks",
                    f"task threads on the critical path waited {sec:.2f} s to take the GIL, time Dask counts "
                    "as compute" + (f", and the workers' event loops {loops:.2f} s" if loops else "")
                    + f"; {c.get('workers', '?')} worker(s) x {c.get('threads', '?')} thread(s)"
                    + _hot_where(t),
                    "pure-Python tasks run one at a time in a process however many threads it has: more "
                    "worker processes with one thread each (dask worker --nworkers N --nthreads 1, or "
                    f"LocalCluster(n_workers=N, threads_per_worker=1)), or {RELEASES_GIL}",
                    what_if=_one_thread_each(t, meta))


def _one_thread_each(t: dict, meta: dict) -> dict:
    workers, threads, _ = _cluster(t, meta)
    return {"workers": workers * threads, "threads": 1}


RELEASES_GIL = "code that releases the GIL (numpy, pandas built-ins, numba)"


def _hot_where(t: dict) -> str:
    hot = hot_functions(t, top=1)
    return f"; the tasks' own code was most often in {hot[0]['where']}" if hot else ""


def _decisions(s: dict) -> dict | None:
    sec = _cat(s, "scheduler_decisions")
    return _finding("scheduler-decisions", sec, "the scheduler spent the path's time choosing workers",
                    "in worker choice, work stealing and occupancy estimates",
                    "fewer, larger tasks; or try distributed.scheduler.work-stealing: false", s,
                    "scheduler_decisions", what_if={"decisions": 0.0}) if sec else None


TASKS_PER_THREAD = 10  # fewer tasks than this per worker thread: merging them would leave threads idle


def _overhead(s: dict, meta: dict) -> dict | None:
    sec, n = _cat(s, "runtime_bookkeeping"), s["tasks"]
    compute_per_task = s["compute_s"] / n if n else 0.0
    aot, per_task = s["aot_s"] or 0.0, bookkeeping_per_task(s)
    c = meta.get("cluster", {})
    threads = (c.get("workers") or 0) * (c.get("threads") or 0)
    # the premise: Dask's own work per task exceeds the task's, tasks are short for the makespan, and there
    # are enough of them that fewer would still keep every thread busy
    if not sec or aot <= 2 * compute_per_task or per_task is None or per_task <= compute_per_task \
            or n < TASKS_PER_THREAD * threads:
        return None
    return _finding("task-overhead", sec, "Dask's work per task outweighs the tasks' own",
                    f"runtime bookkeeping on the path; {n} tasks, each computing "
                    f"{compute_per_task * 1e3:.2f} ms on average against {per_task * 1e3:.2f} ms of Dask's CPU "
                    f"(scheduler and workers) and {aot * 1e3:.2f} ms of the jobs' makespan per task",
                    "fewer, bigger tasks: larger chunks or partitions, fewer delayed calls (each task costs Dask "
                    "about a millisecond whatever it does)", s, "runtime_bookkeeping")


BIG_GRAPH_BYTES = 10e6        # a graph this large, at this much per task, carries data rather than tasks
DATA_PER_TASK_BYTES = 100e3


def _data_graph(s: dict) -> dict | None:
    """heaviest_graphs', where those graphs carried data (large, and large per task)."""
    g = heaviest_graphs(s)
    return g if g and g["bytes"] >= BIG_GRAPH_BYTES and g["bytes"] / g["tasks"] >= DATA_PER_TASK_BYTES else None


def _graph_data(s: dict, t: dict) -> dict | None:
    if not (g := _data_graph(s)):
        return None
    sec = _parts(s, "graph upload", "scheduler: graph to dispatch") + \
        (t.get("client_split") or {}).get("dask", 0.0) * _cat(s, "client")
    return _finding("data-in-graph", sec, "the task graphs carried data",
                    f"job {g['job']}'s graphs were {g['bytes'] / 1e6:.0f} MB for {g['tasks']} tasks "
                    f"({g['bytes'] / g['tasks'] / 1e3:.0f} kB per task): objects embedded in a graph are serialized, "
                    "sent and unpacked with it, each time it is computed",
                    "do not put large objects into tasks' arguments: client.scatter(data) and pass the future, or "
                    "load the data inside the tasks (dask.dataframe.read_parquet, dask.array.from_zarr, "
                    "dask.delayed(load)(path))")


def _materialization(s: dict, t: dict) -> dict | None:
    sec = _parts(s, "scheduler: graph to dispatch")
    g = heaviest_graphs(s)
    if g and g["bytes"] / g["tasks"] >= DATA_PER_TASK_BYTES:  # a few tasks carrying data: fewer would not help
        return None
    return _finding("graph-materialization", sec, "the scheduler took long from a graph's arrival to its first "
                    "dispatch", "time on the path between an update-graph arriving and its first compute-task "
                    "leaving: unpacking, materializing and ordering the graph",
                    "submit fewer tasks (larger chunks or partitions), build collections rather than many "
                    "delayed calls in a loop (each is a graph layer), or persist intermediate results"
                    ) if sec else None


def _transfers(s: dict, t: dict) -> dict | None:
    fetched = _parts(s, "get_data", "inputs")  # "serving inputs (get_data)" is one part, not two
    p2p = p2p_on_path(t)
    sec, by = fetched + p2p, s.get("moved", {}).get("by_kind", {})
    if not sec:
        return None
    moved = ", ".join(f"{k} {v['bytes'] / 1e6:,.0f} MB in {v['messages']} messages" for k, v in by.items())
    return _finding("transfers", sec, "moving data between workers held up the path",
                    f"time on the path fetching inputs from other workers {fetched:.2f} s (requests, replies and "
                    f"the work on both sides) and in P2P shuffle or rechunk tasks {p2p:.2f} s"
                    + (f"; moved between workers: {moved}" if moved else ""),
                    "move less data between workers: rechunk or shuffle less (choose chunks that suit every "
                    "step, filter and select columns before a shuffle, avoid shuffles where a map_partitions "
                    "would do), or place dependent tasks together (fewer, larger partitions)",
                    what_if={"network": 0.0} if fetched >= p2p else None)  # P2P moves data inside tasks: compute


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
                    "chunks so fewer transfers, results reduced before they reach the client",
                    what_if={"network": 0.0}) if sec else None


def _stragglers(s: dict, t: dict) -> dict | None:
    slow = stragglers(t)
    if slow.empty:
        return None
    sec = _straggling_s(t, slow)
    top = [f"{r.key} ({r.prefix}) {r.compute_s:.2f} s on {r.worker} against a median of {r.median_s:.3f} s"
           + (f" ({why})" if (why := why_slow(r, t)) else "") for r in slow.head(3).itertuples()]
    return _finding("straggler", sec, f"{len(slow)} straggling task(s) held the critical path",
                    "tasks that took far longer than others of their kind, while the path waited for them: "
                    + "; ".join(top),
                    "find why these keys are slow (their data: a skewed partition or a larger chunk; their "
                    "worker: one that is busier or slower): repartition evenly, or split the slow inputs",
                    what_if={"at_median": sorted(slow.key.astype(str).unique())})


def _straggling_s(t: dict, slow=None) -> float:
    """Seconds of the path in stragglers beyond their prefix's median."""
    slow = stragglers(t) if slow is None else slow
    return float((slow.path_s - slow.median_s).clip(lower=0).sum()) if not slow.empty else 0.0


def _python_hot(t: dict) -> dict | None:
    """The tasks' hot function when it ran its own Python (holding the GIL in most of its samples)."""
    hot = hot_functions(t, top=1)
    return hot[0] if hot and hot[0]["share"] >= 0.3 and (hot[0]["python"] or 0) >= 0.5 else None


def _worker_gil_holder(t: dict) -> str | None:
    """Who held the workers' GIL most often in their samples: 'tasks' (a thread that ran tasks), 'other'
    (a thread that ran none: a plugin's, a library's, the user's), or None (no holder seen)."""
    holder, tids = gil_holder_thread(t, roles=["worker"]), t.get("attempt_threads")
    if holder is None or tids is None:
        return None
    return "tasks" if holder[0] in set(tids.tid) else "other"


def _loops_held_by_tasks(s: dict, t: dict) -> float:
    """The workers' event loops' waits for the GIL on the path, when task threads held it: task-gil's when
    the tasks also waited for each other (the loop is one more thread in their queue), else the hot
    function's when the tasks ran their own Python (the loop cannot run while it computes)."""
    by_tasks = _worker_gil_holder(t) == "tasks" and (_task_gil_s(s) or _python_hot(t))
    return _gil_by_process(s, task_threads=False).get("worker", 0.0) if by_tasks else 0.0


def _loops_held_by_hot_function(s: dict, t: dict) -> float:
    """Of _loops_held_by_tasks, the hot function's: none where task-gil holds them."""
    return 0.0 if _task_gil_s(s) else _loops_held_by_tasks(s, t)


def _loops_held_by_other(s: dict, t: dict) -> float:
    """The workers' event loops' waits for the GIL on the path, when a thread that runs no task held it."""
    return _gil_by_process(s, task_threads=False).get("worker", 0.0) if _worker_gil_holder(t) == "other" else 0.0


def _hot_function(s: dict, t: dict) -> dict | None:
    hot = hot_functions(t, top=3)
    if not hot:
        return None
    h = hot[0]
    compiled = h["python"] is not None and h["python"] < 0.5  # most samples ran with the GIL released
    # a straggler running compiled code is slow for its data, not for the function: its excess is that finding's
    # time blocked is not the function's CPU (blocked-tasks says it)
    comp = _cat(s, "compute") - _parts(s, TASK_BLOCKED) - (_straggling_s(t) if compiled else 0.0)
    if h["share"] < 0.3 or comp < MIN_SHARE * s["session_s"]:
        return None
    evidence = (f"{h['share']:.0%} of the tasks' on-CPU samples ({h['samples']}) were in your function {h['where']}"
                f"; compute was {_cat(s, 'compute'):.2f} s of the critical path"
                + ("; then " + ", ".join(f"{x['where']} {x['share']:.0%}" for x in hot[1:]) if hot[1:] else ""))
    if compiled:
        return _finding("hot-function", comp * h["share"], f"the tasks spent their time in compiled code called "
                        f"from {h['function']}", evidence + f"; the thread held the GIL in {h['python']:.0%} of "
                        "them: the time is in the compiled code it calls (numpy, pandas, I/O), not its Python",
                        f"{h['function']} is vectorized already: a cheaper algorithm in the calls it makes, less "
                        "data per task, or more cores shorten it; rewriting its Python will not")
    held = f"; the thread held the GIL in {h['python']:.0%} of them (its own Python)" if h["python"] else ""
    loops = _loops_held_by_hot_function(s, t)
    held += f"; the workers' event loops waited {loops:.2f} s on the path for the GIL it held" if loops else ""
    return _finding("hot-function", comp * h["share"] + loops, f"the tasks spent their time in {h['function']}",
                    evidence + held,
                    f"speed up {h['function']}: vectorize it (numpy or pandas operations instead of Python loops "
                    "and row-wise apply), or compile it (numba); it is where the compute went")


def _blocked_tasks(s: dict, t: dict, meta: dict) -> dict | None:
    sec = _parts(s, TASK_BLOCKED)
    if not sec:
        return None
    threads = meta.get("cluster", {}).get("threads")
    where = blocked_in(t)
    more = ("more threads per worker (--nthreads; a blocked thread leaves its CPU to the others), " if threads
            and threads < 2 * (meta.get("cpus") or 1) else "")
    return _finding("blocked-tasks", sec, "tasks on the critical path were blocked, not computing",
                    f"task threads on the path off a CPU without waiting for one or for the GIL {sec:.2f} s "
                    "(sleeping, I/O, a lock), time Dask counts as compute"
                    + (f"; their samples were blocked in {', '.join(where)}" if where else "")
                    + (f"; {threads} thread(s) per worker" if threads else ""),
                    f"the tasks wait on something outside Dask: {more}asynchronous or batched I/O, or a faster "
                    "source; a faster CPU or fewer tasks would not help", what_if={"blocked": 0.0})


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


def _spilling(s: dict, t: dict) -> dict | None:
    by = spills_on_path(t)
    sec = float(by.sum())
    if not sec:
        return None
    return _finding("spilling", sec, "workers spilled data to disk while the path waited",
                    "CPU time on the critical path in Dask's spilling (writing results to disk and reading them "
                    "back): " + ", ".join(f"{p} {v:.2f} s" for p, v in by.items()),
                    "the workers' memory did not hold their data: more memory per worker (fewer, larger workers, "
                    "or a higher memory_limit), smaller chunks or partitions, or fewer results held at once "
                    "(persist less, release what is no longer needed)")


UNNAMED_BLOCKED_SHARE = 0.25  # blocked loops with none of the user's code in their samples: a finding from this share


def _loop_blocked(s: dict, t: dict) -> dict | None:
    blocked = {kind: v for kind in ("scheduler", "worker") if (v := sum(
        x for k, x in s["critical_path_parts_s"].items() if k.startswith(f"{kind}: ") and k.endswith("[idle]")))}
    running, where = loops_in_user_code(t)
    sec = sum(blocked.values()) + running
    if not sec:
        return None
    named = [w for w in where if w["samples"] >= 2]
    if not named and sec < UNNAMED_BLOCKED_SHARE * s["session_s"]:  # a little idle is any loop's lot
        return None
    return _finding("event-loop-blocked", sec, "Dask's event loops were held up while the path waited"
                    + (f": in your {named[0]['function']}" if named else ""),
                    "event-loop time on the path "
                    + ", ".join([f"blocked with nothing of Dask's to do in the {k} {v:.2f} s" for k, v in blocked.items()]
                                + ([f"running your code {running:.2f} s"] if running else []))
                    + ("; the loops' samples show your code in " + ", ".join(
                        f"{w['where']} ({w['samples']} samples)" for w in named) if named else ""),
                    "something blocked the event loop: a blocking call (I/O, sleep, a lock) or long work in a "
                    "plugin, a handler, client.run or run_on_scheduler; nothing else in that process moves "
                    "meanwhile: make it quick and never blocking, or run it in a thread (loop.run_in_executor)")


def _local(s: dict) -> dict:
    return s.get("local_scheduler") or {}


def _local_gil(s: dict, t: dict) -> dict | None:
    """Threads of a local pool that waited on the path for the GIL (their compute, or Dask's work around it)."""
    loc = _local(s)
    if "threads" not in loc.get("schedulers", []) or loc.get("pool", 0) < 2:
        return None
    sec = _cat(s, "gil_contention")  # no other Python thread than the pool's and the loop's runs a compute
    if not sec:
        return None
    tasks = sum(v for k, v in s["critical_path_parts_s"].items()
                if k.startswith(("compute:", "pool:")) and k.endswith("[gil_contention]"))
    return _finding("local-gil", sec, "the pool's threads were serialised on the GIL",
                    f"threads on the critical path waited {sec:.2f} s to take the GIL ({tasks:.2f} s of it the "
                    f"tasks' threads, the rest the scheduler's loop) held by the pool's {loc['pool']} threads: time "
                    "Dask's callbacks (and dask.diagnostics.Profiler) count as the tasks' own"
                    + _hot_where(t),
                    "pure-Python tasks run one at a time however many threads the pool has: "
                    "dask.compute(..., scheduler='processes'), or distributed with one thread per worker process "
                    f"(Client(n_workers=N, threads_per_worker=1)); or {RELEASES_GIL}")


def _local_overhead(s: dict) -> dict | None:
    """Dask's own work on the path (the loop, the hand-overs, packing) outweighing the tasks' compute there."""
    loc, sec = _local(s), _cat(s, "runtime_bookkeeping")
    mean = loc.get("per_task_mean_s") or {}
    if not sec or sec <= _cat(s, "compute") or not mean.get("compute_s"):
        return None
    procs = "processes" in loc.get("schedulers", [])
    return _finding("local-overhead", sec, "Dask's local scheduler spent more per task than the tasks did",
                    f"Dask's own work on the critical path ({sec:.2f} s) outweighed the tasks' compute there "
                    f"({_cat(s, 'compute'):.2f} s); {s['tasks']} tasks; per task, on average, "
                    + "; ".join(_around(k) for k in _by_scheduler(loc)) + " (wall time, waits included)",
                    "fewer, bigger tasks: larger chunks or partitions, fewer delayed calls"
                    + ("; the processes scheduler pickles each task and result through a pipe: "
                       "scheduler='threads' where the tasks release the GIL" if procs else ""), s, "runtime_bookkeeping")


def _by_scheduler(loc: dict) -> list[dict]:
    """One job's entry (local_scheduler.by_job) per scheduler, its first; the whole run's where none has times."""
    first = {}
    for k in loc.get("by_job", {}).values():
        if k.get("per_task_mean_s", {}).get("compute_s") is not None:
            first.setdefault(k["scheduler"], k)
    return list(first.values()) or [loc | {"scheduler": "/".join(loc.get("schedulers", []))}]


def _around(k: dict) -> str:
    m = k["per_task_mean_s"]
    return (f"{k['scheduler']}: {m['compute_s'] * 1e6:.0f} µs of compute, and from its dispatch to its result taken in "
            f"a hand-over to the pool of {m['hand_over_s'] * 1e6:.0f} µs, unpacking {m['unpack_s'] * 1e6:.0f} µs, "
            f"packing {m['pack_s'] * 1e6:.0f} µs, taking the result in {m['take_in_s'] * 1e6:.0f} µs")


def _local_starvation(s: dict, meta: dict) -> dict | None:
    sec = _cat(s, "cpu_starvation")
    if not sec:
        return None
    loc, cpus = _local(s), meta.get("cpus")
    pool, kind = loc.get("pool", 0), "processes" if "processes" in loc.get("schedulers", []) else "threads"
    more = bool(cpus) and pool > cpus
    return _finding("local-cpu-starvation", sec, "threads on the critical path waited for a CPU",
                    f"the scheduler's loop or the pool's threads were runnable without a CPU; the pool ran {pool} "
                    f"{kind}" + (f" on {cpus} CPU(s)" if cpus else ""),
                    f"a pool larger than the machine: num_workers={cpus} or fewer (dask.config.set(num_workers=N))"
                    if more else "other work took the CPUs: measure on a quiet machine, or give the command cores "
                    "of its own")


def _pool_start(s: dict) -> dict | None:
    sec = _parts(s, NEW_PROCESS)
    if not sec:
        return None
    return _finding("pool-start", sec, "new pool processes started while the path waited",
                    "the hand-over of each new pool process's first task, on the critical path: the process's "
                    "start, its imports and its first unpickling",
                    "the processes scheduler starts a pool for each compute: compute the outputs together "
                    "(dask.compute(a, b)), give it one pool for all (dask.config.set(pool=concurrent.futures."
                    "ProcessPoolExecutor(N))), or keep a distributed cluster across computes")
