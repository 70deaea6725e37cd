"""The analysis of a run of Dask's local schedulers (threads, processes, sync): summary.analyze's
for such jobs, from analyzers/local.py's tables."""

from __future__ import annotations

import pandas as pd

from . import local
from .attribution import attribute
from .cpu import cpu_by_category, cpu_time
from .evidence import compute_profile
from .findings import local_findings
from .results import Analysis, job_entries, recomputed_keys, split
from .tasks import prefix_costs, recomputed
from .whole_run import cpu_check, in_flight, task_overhead


def analyze(t: dict, meta: dict, base: dict, sides: dict) -> Analysis:
    """The analysis of a local run (summary.analyze's, for jobs of a local scheduler): `base`, the summary's
    fixed keys; `sides`, the SAMPLED tables. """
    lt = t["local_tasks"].reset_index(drop=True)
    procs = local.processes(t)
    loops = local.other_loops(t["local_jobs"], procs)
    a = local.attempts(t, loops)
    jobs = local.jobs_table(t["local_jobs"], a)
    tasks = local.tasks_table(a, jobs)
    states, cpu, threads = sides["thread_states"], sides["cpu_samples"], sides["threads"]
    path = pd.concat([local.critical_path(jobs, a, lt, t["local_jobs"], procs, states, loops),
                      local.between_jobs(jobs, t["local_jobs"], procs)],
                     ignore_index=True).sort_values("start_ns", kind="stable", ignore_index=True)
    task_tids = local.task_threads(a, lt, threads)
    attr = attribute(path, *local.as_processes(loops, procs, states, cpu, threads), a, task_tids)
    window = (int(jobs.start_ns.min()), int(jobs.end_ns.max()))
    again = recomputed(a)
    ran = procs[procs.pid.isin(pd.concat([lt.pid, lt.exec_pid]).dropna().astype("int64"))]
    cpu_in_window = cpu_time(cpu, states, threads[threads.pid.isin(ran.pid.astype("int64"))], window)
    summary = base | local.numbers(jobs, tasks, a, window) | split(attr) | {
        "jobs": job_entries(jobs, tasks, a, attr, window, again), "recomputed": recomputed_keys(again),
        "cpu_by_category_s": cpu_by_category(cpu_in_window), "cpu_check": cpu_check(cpu_in_window, cpu, t["proc"], window),
        "worker_idle_s": {}, "workers_ended_s": {}, "task_overhead_s": task_overhead(tasks),
        "scheduler_cpu_per_task_s": None, "moved": {}, "thread_states": "ebpf" if len(states) else "samples",
        "local_scheduler": local.summary_of(t, tasks, meta)}
    seen = t | {"cpu_samples": cpu, "thread_states": states, "critical_path": path, "tasks": tasks, "threads": threads,
                "stack_categories": sides["stack_categories"], "processes": procs}
    profile = compute_profile(seen, a, task_tids)
    summary["findings"] = local_findings(summary, seen | {"compute_profile": profile}, meta)
    out = {"jobs": jobs, "tasks": tasks, "in_flight": in_flight(a), "prefixes": prefix_costs(tasks, path, summary["session_s"]),
           "critical_path": path, "attempt_threads": task_tids, "attribution": attr, "compute_profile": profile}
    return Analysis(out, summary)
