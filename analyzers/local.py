"""A run of Dask's local schedulers (threads, processes, sync), from the client hook's tables
(local_jobs, local_tasks), in the shapes a distributed run's analysis has: its attempts, jobs, tasks
and critical path, so that the attribution, the summary, the report and the trace read them alike.

A local scheduler's loop (dask.local.get_async) runs in the thread that called compute: it orders
the graph, dispatches each ready task to a pool (pretask), and takes each result in (posttask), one
at a time. So what a dispatch waited for is the loop's step before it: the latest result taken in
before it (the task it made ready, or whose thread it freed), else the job's start. The critical path
of a job, walked back from its end, goes through the last result taken in and, per task:

  the loop taking the result in  <- the pool packing it  <- compute  <- the pool unpacking the task
  <- the hand-over to the pool (a pool thread waking; in processes, pickling and the pipe; a new
  pool process's start)  <- the loop since the result before the dispatch.

A task that followed another in the same batch on the same thread (processes: chunksize) goes
through that one. Kinds: scheduler (the loop's thread: split by its state and samples, as a
cluster's event loop), pool (the task's thread: its GIL waits and CPU starvation, the rest Dask's
bookkeeping), compute (the task's thread: compute less its GIL waits and CPU starvation), client
(between jobs). The session is the jobs' span: time between jobs is the client's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .critical_path import COLUMNS, _Walk
from .jobs import JOB_COLUMNS
from .tasks import task_times
from .thread_state import of_thread

ATTEMPT_COLUMNS = ["key", "attempt", "run_id", "worker", "deps", "compute_sent_ns", "compute_recv_ns",
                   "finished_sent_ns", "finished_recv_ns", "nbytes", "thread", "compute_start_ns", "compute_stop_ns",
                   "transfer_start_ns", "transfer_stop_ns", "outcome", "moved_ns", "prefix", "scheduler_delay_ns"]
NEW_PROCESS = " (a new pool process: its start)"
OVERHEAD = ("hand_over_s", "unpack_s", "pack_s", "take_in_s")  # Dask's own time per task, from dispatch to result


def is_local(t: dict) -> bool:
    return len(t.get("local_tasks", ())) > 0 or len(t.get("local_jobs", ())) > 0


def names(processes: pd.DataFrame, pids) -> pd.Series:
    """pid -> the process's name in the run (processes), else "pool process PID" (a pool process
    daskprobe did not follow)."""
    known = processes.dropna(subset=["pid"]).drop_duplicates("pid", keep="last").set_index("pid").name
    pids = pd.Series(pd.unique(pd.Series(pids).dropna().astype("int64")))
    return pd.Series([known.get(p, f"pool process {p}") for p in pids], index=pids.to_numpy(), dtype=object)


def processes(t: dict) -> pd.DataFrame:
    """The processes table, with a row for each pool process it lacks (named by `names`), as a client's."""
    procs, lt = t["processes"], t["local_tasks"]
    pids = pd.concat([lt.pid, lt.exec_pid, t["local_jobs"].pid]).dropna().astype("int64").unique()
    known = set(procs.pid.dropna().astype("int64"))
    missing = [p for p in pids if p not in known]
    extra = pd.DataFrame({"pid": missing, "name": [f"pool process {p}" for p in missing], "role": "client"})
    return pd.concat([procs, extra], ignore_index=True) if missing else procs


def for_samples(t: dict) -> dict:
    """The tables the samples' side reads, for a local run: its tasks as attempts (a sample of a task's
    thread inside its compute span is compute), and the command's processes as schedulers rather than
    clients (their samples are classified by their stacks: the loop is Dask's scheduler here)."""
    procs = processes(t)
    return t | {"attempts": attempts(t), "processes": procs.assign(role=procs.role.replace("client", "local"))}


def other_loops(local_jobs: pd.DataFrame, procs: pd.DataFrame) -> dict[tuple[int, int], str]:
    """Loops that ran in a thread other than their process's main one (compute called from a thread):
    (pid, tid) -> the name their time goes under ("client thread TID")."""
    named = names(procs, local_jobs.pid)
    return {(int(r.pid), int(r.tid)): f"{named.get(r.pid)} thread {r.tid}" for r in local_jobs.itertuples()
            if r.tid != r.pid}


def as_processes(loops: dict, procs: pd.DataFrame, states: pd.DataFrame, cpu: pd.DataFrame,
                 threads: pd.DataFrame) -> tuple:
    """(processes, states, cpu samples, threads) with each of `loops`' threads as a process of its own
    (its pid its tid: no process has a thread's id as its pid), of which it is the main thread: the
    attribution splits time inside a process by its main thread's state, here the loop's."""
    if not loops:
        return procs, states, cpu, threads

    def moved(df: pd.DataFrame) -> pd.DataFrame:
        df = df.copy()
        for pid, tid in loops:
            df.loc[(df.pid == pid) & (df.tid == tid), "pid"] = tid
        return df
    own = pd.DataFrame({"pid": [tid for _, tid in loops], "name": list(loops.values()), "role": "client"})
    return pd.concat([procs, own], ignore_index=True), moved(states), moved(cpu), moved(threads)


def attempts(t: dict, loops: dict | None = None) -> pd.DataFrame:
    """local_tasks as attempts rows (one per dispatch, same order), with their job: the dispatch is the
    loop's pretask, the task reaching the worker its thread entering execute_task, the compute span
    from its inputs unpacked to its function's return, the result leaving when execute_task did and
    reaching the scheduler at the posttask."""
    lt = t["local_tasks"].reset_index(drop=True)
    where = names(t["processes"], pd.concat([lt.exec_pid, lt.pid]))
    run = lt.exec_pid.fillna(lt.pid).astype("int64")
    on_loop = [(loops or {}).get((p, th)) for p, th in zip(run, lt.exec_tid.fillna(-1).astype("int64"))]
    failed = lt.failed.fillna(False).astype(bool)
    # a task that raised has no posttask: the loop raised its error, and the job ended, once it had it
    raised = lt.job.map(t["local_jobs"].set_index("job").end_ns).where(failed).astype("Int64")
    outcome = np.where(failed, "erred", np.where(lt.done_ns.notna(), "finished", "unfinished"))
    n = len(lt)
    none = pd.array([pd.NA] * n, dtype="Int64")
    return pd.DataFrame({
        "key": lt.key, "attempt": lt.groupby(["job", "key"]).cumcount(), "run_id": none,
        "worker": pd.Series(on_loop, dtype=object).fillna(run.map(where)),
        "deps": lt.deps, "compute_sent_ns": lt.sent_ns.astype("int64"),
        "compute_recv_ns": lt.enter_ns.fillna(lt.sent_ns).astype("int64"), "finished_sent_ns": lt.exit_ns,
        "finished_recv_ns": lt.done_ns.fillna(raised), "nbytes": none, "thread": lt.ident, "compute_start_ns": lt.loaded_ns,
        "compute_stop_ns": lt.computed_ns.fillna(lt.exit_ns.where(failed)), "transfer_start_ns": none,
        "transfer_stop_ns": none, "outcome": outcome, "moved_ns": none, "prefix": lt.prefix,
        "scheduler_delay_ns": np.zeros(n, dtype="int64"), "job": lt.job.astype("int64")})


def scheduler_kind(t: dict) -> dict:
    """Per job, which local scheduler ran it, from where its tasks ran: in the loop's own thread
    (sync), other threads of its process (threads), other processes (processes); and the pool's size
    (threads or processes seen running its tasks)."""
    lt = t["local_tasks"].dropna(subset=["exec_pid"])
    out = {}
    for job, g in lt.groupby("job"):
        other = g.exec_pid.astype("int64") != g.pid
        kind = "processes" if other.any() else "sync" if (g.exec_tid == g.tid).all() else "threads"
        pool = g.exec_pid.nunique() if kind == "processes" else g.exec_tid.nunique()
        out[int(job)] = {"scheduler": kind, "pool": int(pool)}
    return out


def jobs_table(local_jobs: pd.DataFrame, a: pd.DataFrame) -> pd.DataFrame:
    """Table jobs for a local run: one per compute, from its start callback to its finish (without
    one: its last result; incomplete, its untold the graph's tasks without a result). Its requested keys
    are the graph's sinks (no task of it depends on them)."""
    rows = []
    for j in local_jobs.itertuples():
        mine = a[a.job == j.job]
        needed = set(mine.deps.explode().dropna())
        sinks = mine[~mine.key.isin(needed)]
        last = mine.dropna(subset=["finished_recv_ns"])
        last = last.loc[last.finished_recv_ns.idxmax()] if len(last) else None
        end = j.end_ns if pd.notna(j.end_ns) else (int(last.finished_recv_ns) if last is not None else j.start_ns)
        untold = 0 if pd.notna(j.end_ns) else max(0, j.graph_tasks - int(mine.finished_recv_ns.notna().sum()))
        rows.append({"job": j.job, "start_ns": j.start_ns, "end_ns": int(end), "graphs": 1, "graph_bytes": 0,
                     "requested": len(sinks), "end_key": None if last is None else last.key, "end_told": pd.NA,
                     "complete": pd.notna(j.end_ns), "untold": untold, "last_told_ns": int(end)})
    out = pd.DataFrame(rows, columns=JOB_COLUMNS)
    out["end_key"] = pd.Series([r["end_key"] for r in rows], index=out.index, dtype=object)  # None, not NaN: null
    return out.astype({"job": "int64", "start_ns": "int64", "end_ns": "int64", "end_told": "Int64"})


def tasks_table(a: pd.DataFrame, jobs: pd.DataFrame) -> pd.DataFrame:
    """Table tasks for a local run: each dispatch is its task's only attempt; it was ready when the last
    of its dependencies' results was taken in (ready_by: that key), else when its job began (graph)."""
    t = a.drop(columns="attempt").assign(attempts=1, first_sent_ns=a.compute_sent_ns, graph=a.job)
    t["graph_ns"] = t.job.map(jobs.set_index("job").start_ns).astype("Int64")
    deps = t[["job", "key", "deps"]].reset_index().explode("deps").dropna(subset=["deps"])
    done = t[["job", "key", "finished_recv_ns"]].rename(columns={"key": "deps", "finished_recv_ns": "dep_ns"})
    deps = deps.merge(done, on=["job", "deps"]).dropna(subset=["dep_ns"])
    last = deps.sort_values("dep_ns", kind="stable").drop_duplicates("index", keep="last").set_index("index")
    t["ready_ns"] = last.dep_ns.reindex(t.index).astype("Int64").fillna(t.graph_ns)
    t["ready_by"] = last.deps.reindex(t.index).fillna("graph")
    return t.join(task_times(t))


def task_threads(a: pd.DataFrame, lt: pd.DataFrame, threads: pd.DataFrame) -> pd.DataFrame:
    """Table attempt_threads for a local run: the hook names each task's thread itself."""
    run = lt.reset_index(drop=True)[["exec_pid", "exec_tid"]].rename_axis("attempt").reset_index().dropna()
    run = run.astype({"exec_pid": "int64", "exec_tid": "int64"})
    named = threads[["pid", "tid", "name"]].rename(columns={"pid": "exec_pid", "tid": "exec_tid"})
    run = run.merge(named, on=["exec_pid", "exec_tid"], how="left")
    return pd.DataFrame({"attempt": run.attempt, "tid": run.exec_tid, "name": run.name.fillna("")})


def critical_path(jobs: pd.DataFrame, a: pd.DataFrame, lt: pd.DataFrame, local_jobs: pd.DataFrame,
                  processes: pd.DataFrame, states: pd.DataFrame | None = None, loops: dict | None = None) -> pd.DataFrame:
    """Every job's critical path (module doc). `a`: attempts(t), row for row with `lt` (local_tasks);
    `states`: thread_states, where eBPF had them (when the loop's thread woke for a result)."""
    named = names(processes, pd.concat([lt.pid, local_jobs.pid]))
    a = a.assign(exec_pid=lt.exec_pid.to_numpy(), exec_tid=lt.exec_tid.to_numpy(), loop_pid=lt.pid.to_numpy())
    by_job = local_jobs.set_index("job")
    rows = []
    for j in jobs.itertuples():
        loop = by_job.loc[j.job]
        blocked = of_thread(states, loop.pid, loop.tid)["blocked"] if states is not None else _NONE
        name = (loops or {}).get((int(loop.pid), int(loop.tid))) or named.get(loop.pid)
        rows += _walk(j, a[a.job == j.job], name, blocked)
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["job", "start_ns"], kind="stable", ignore_index=True)


_NONE = (np.empty(0, "int64"), np.empty(0, "int64"))


def _woke(blocked: tuple[np.ndarray, np.ndarray], after, before) -> int | None:
    """When the loop's thread last woke from sleep between a result leaving the pool and the loop taking
    it in: until then the result was still on its way (the pool thread handing it over)."""
    if after is None or before is None:
        return None
    ends = blocked[1][(blocked[0] < before) & (blocked[1] > after)]
    return int(min(ends.max(), before)) if len(ends) else None


TIMES = ("compute_sent_ns", "compute_recv_ns", "compute_start_ns", "compute_stop_ns", "finished_sent_ns",
         "finished_recv_ns", "exec_pid", "exec_tid", "loop_pid")


def _walk(j, a: pd.DataFrame, loop: str | None, blocked=_NONE) -> list[tuple]:
    w = _Walk(j.job, j.start_ns, j.end_ns)
    a = a.reset_index(drop=True)
    c = {name: a[name].to_numpy("float64", na_value=np.nan) for name in TIMES}  # NaN: not recorded
    key, worker = a.key.to_numpy(object), a.worker.to_numpy(object)
    done = np.flatnonzero(~np.isnan(c["finished_recv_ns"]))
    done = done[np.argsort(c["finished_recv_ns"][done], kind="stable")]
    done_t = c["finished_recv_ns"][done]
    if not len(done):
        w.back_to(j.start_ns, "scheduler", "local scheduler: a job without results", process=loop)
        return w.rows
    ahead, new = _ahead_in_batch(c), _first_of_process(c)
    k = done[-1]
    w.back_to(_ns(done_t[-1]), "scheduler", "local scheduler: ending the job", key[k], loop)
    for _ in range(2 * len(a)):  # each step goes to an earlier task: at most every task twice
        at = {name: _ns(v[k]) for name, v in c.items()}
        woke = _woke(blocked, at["finished_sent_ns"], at["finished_recv_ns"])
        if woke is not None:  # the result reached the loop when its thread woke: the pool's until then
            w.back_to(woke, "scheduler", "local scheduler: taking the result in", key[k], loop)
            w.back_to(at["finished_sent_ns"], "pool", "handing the result over", key[k], worker[k])
        else:
            w.back_to(at["finished_sent_ns"], "scheduler", "local scheduler: taking the result in", key[k], loop)
        w.back_to(at["compute_stop_ns"], "pool", "packing the result", key[k], worker[k])
        w.back_to(at["compute_start_ns"], "compute", "compute", key[k], worker[k])
        w.back_to(at["compute_recv_ns"], "pool", "unpacking the task", key[k], worker[k])
        if ahead[k] >= 0:
            w.back_to(_ns(c["finished_sent_ns"][ahead[k]]), "pool", "the next task of its batch", key[k], worker[k])
            k = ahead[k]
            continue
        w.back_to(at["compute_sent_ns"], "pool", "hand-over to the pool" + (NEW_PROCESS if new[k] else ""), key[k],
                  worker[k])
        i = np.searchsorted(done_t, c["compute_sent_ns"][k], side="left") - 1  # the latest result before it
        if i < 0:
            w.back_to(j.start_ns, "scheduler", "local scheduler: ordering the graph to the first dispatch", key[k],
                      loop)
            break
        w.back_to(_ns(done_t[i]), "scheduler", "local scheduler: from a result to the next dispatch", key[k], loop)
        k = done[i]
    w.back_to(j.start_ns, "scheduler", "local scheduler: ordering the graph to the first dispatch", process=loop)
    return w.rows


def _ns(v) -> int | None:
    return None if pd.isna(v) else int(v)


def _ahead_in_batch(c: dict) -> np.ndarray:
    """Per task (c: _walk's columns), the task the same pool thread ran just before it if that one was still
    running when this one was dispatched (they went in one batch: this one waited for it); else -1."""
    out = np.full(len(c["exec_tid"]), -1)
    left, took, sent = c["finished_sent_ns"], c["compute_recv_ns"], c["compute_sent_ns"]
    ran = ~np.isnan(c["exec_tid"]) & ~np.isnan(left) & ~np.isnan(took)
    thread = c["exec_pid"] * (1 << 32) + c["exec_tid"]
    for t in np.unique(thread[ran]):
        mine = np.flatnonzero(ran & (thread == t))
        mine = mine[np.argsort(left[mine], kind="stable")]
        before = np.searchsorted(left[mine], took[mine], side="right") - 1  # the latest to leave before it came
        prev = np.where(before >= 0, mine[np.maximum(before, 0)], -1)
        waited = (prev >= 0) & (prev != mine) & (left[np.maximum(prev, 0)] > sent[mine])
        out[mine[waited]] = prev[waited]
    return out


def _first_of_process(c: dict) -> np.ndarray:
    """Per task, whether it was the first a pool process other than the loop's took (its start is in its
    hand-over)."""
    pid, took = c["exec_pid"], c["compute_recv_ns"]
    other = ~np.isnan(pid) & ~np.isnan(took) & (pid != c["loop_pid"])
    first = pd.Series(took[other]).groupby(pid[other]).transform("min").to_numpy()
    out = np.zeros(len(pid), bool)
    out[np.flatnonzero(other)] = took[other] == first
    return out


def numbers(jobs: pd.DataFrame, tasks: pd.DataFrame, a: pd.DataFrame, window: tuple[int, int]) -> dict:
    """The summary's counts for a local run: the session is the jobs' span; no messages."""
    n = len(tasks)
    spans = (a.compute_stop_ns - a.compute_start_ns).dropna().astype("float64")
    span_s = (window[1] - window[0]) / 1e9
    return {"session_s": span_s, "session_window_ns": list(window), "makespan_s": span_s, "window_ns": list(window),
            "tasks": n, "dispatches": len(a),
            "aot_s": float((jobs.end_ns - jobs.start_ns).sum()) / 1e9 / n if n else None,
            "compute_s": float(spans.sum()) / 1e9, "messages": 0, "ops": 0, "messages_per_task": None,
            "bytes_per_task": None, "ops_by_name": {}}


def between_jobs(jobs: pd.DataFrame, local_jobs: pd.DataFrame, procs: pd.DataFrame) -> pd.DataFrame:
    """The client's time: from a job's end to the next one's start (jobs of one process run one at a
    time; jobs of several threads at once leave no gap)."""
    ends = np.maximum.accumulate(jobs.end_ns.to_numpy("int64"))[:-1]
    starts = jobs.start_ns.to_numpy("int64")[1:]
    keep = starts > ends
    loop = names(procs, local_jobs.pid)
    who = local_jobs.set_index("job").pid.map(loop).reindex(jobs.job[1:]).to_numpy()[keep]
    return pd.DataFrame({"job": -1, "start_ns": ends[keep], "end_ns": starts[keep], "kind": "client",
                         "part": "client: between jobs", "key": None, "process": who, "batch_ns": 0},
                        columns=COLUMNS)


def summary_of(t: dict, tasks: pd.DataFrame, meta: dict) -> dict:
    """summary.json's local_scheduler: which scheduler ran the jobs, the pool's size, and a finished task's
    mean times from its dispatch to its result taken in, over all jobs and per job."""
    kinds = scheduler_kind(t)
    for job, k in kinds.items():
        _, mean, around = per_task(tasks[tasks.job == job])
        k.update(per_task_mean_s=mean, overhead_per_task_s=around)
    n, mean, around = per_task(tasks)
    return {"schedulers": sorted({k["scheduler"] for k in kinds.values()}),
            "pool": max((k["pool"] for k in kinds.values()), default=0),
            "by_job": {str(j): k for j, k in kinds.items()}, "tasks_timed": n, "per_task_mean_s": mean,
            "overhead_per_task_s": around}


def per_task(tasks: pd.DataFrame) -> tuple[int, dict, float | None]:
    """Over the finished tasks whose run was recorded: how many, their mean times by step (s), and the
    sum of the steps around compute (OVERHEAD)."""
    f = tasks[tasks.outcome == "finished"].dropna(subset=["compute_start_ns", "compute_stop_ns", "finished_sent_ns"])
    ready = f.ready_ns.astype("float64") / 1e9
    f = f[["compute_sent_ns", "compute_recv_ns", "compute_start_ns", "compute_stop_ns", "finished_sent_ns",
           "finished_recv_ns"]].astype("float64") / 1e9
    steps = {"ready_to_dispatch_s": f.compute_sent_ns - ready, "hand_over_s": f.compute_recv_ns - f.compute_sent_ns,
             "unpack_s": f.compute_start_ns - f.compute_recv_ns, "compute_s": f.compute_stop_ns - f.compute_start_ns,
             "pack_s": f.finished_sent_ns - f.compute_stop_ns, "take_in_s": f.finished_recv_ns - f.finished_sent_ns}
    mean = {k: float(v.mean()) if len(v) else None for k, v in steps.items()}
    around = [mean[k] for k in OVERHEAD if mean[k] is not None]
    return len(f), mean, (sum(around) if around else None)
