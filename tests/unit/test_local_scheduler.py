"""Dask's local schedulers: the hook's capture read into tables, the critical path walked through them,
and each local finding's rule, with the counterexample where its premise fails."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from daskprobe.analyzers import local
from daskprobe.analyzers.findings import local_findings
from daskprobe.analyzers.summary import _nothing
from daskprobe.probes.local_scheduler import LINES, read_local

LOOP, POOL = 100, 101  # the loop's thread (the process's main one: pid 100) and a pool thread


def line(kind: str, **fields) -> str:
    """One line by LINES alone: its kind's fields, in order, by name."""
    names = [f.split(":")[0] for f in LINES[kind][0].split()]
    assert set(names) == set(fields), (kind, names)
    return "\t".join([kind] + [str(fields[n]) for n in names]) + "\n"


def task(key, deps, sent, enter, loaded, computed, exit_, done, tid=POOL, pid=100, job=0) -> str:
    return (line("P", t_ns=sent, pid=100, tid=LOOP, job=job, key=key, deps="\x1f".join(deps))
            + line("X", pid=pid, tid=tid, ident=7000 + tid, key=key, enter_ns=enter, loaded_ns=loaded,
                   computed_ns=computed, exit_ns=exit_, failed=0)
            + line("T", t_ns=done, pid=100, tid=LOOP, job=job, key=key, worker=7000 + tid))


def chain(tmp_path, pid=100, tid=POOL):
    """A job of two tasks, b after a, times in µs: a's result is taken in at 40, b dispatched at 45."""
    text = (line("H", t_ns=0, pid=100, ppid=1) + line("J", t_ns=1_000, pid=100, tid=LOOP, job=0, tasks=2)
            + task("('a', 0)", [], 10_000, 12_000, 13_000, 30_000, 31_000, 40_000, tid, pid)
            + task("b-1", ["('a', 0)"], 45_000, 47_000, 48_000, 80_000, 81_000, 90_000, tid, pid)
            + line("F", t_ns=95_000, pid=100, tid=LOOP, job=0, errored=0))
    (tmp_path / "local_scheduler.100.tsv").write_text(text)
    jobs, tasks = read_local([tmp_path / "local_scheduler.100.tsv"])
    return jobs, tasks.assign(prefix=tasks.key.str.extract(r"([a-z]+)")[0])


def tables(jobs, tasks, procs=None) -> dict:
    procs = procs if procs is not None else pd.DataFrame({"pid": [100], "name": ["client"], "role": ["client"]})
    return {"local_jobs": jobs, "local_tasks": tasks, "processes": procs}


def test_reader_joins_each_dispatch_with_its_run_and_result(tmp_path):
    jobs, tasks = chain(tmp_path)
    assert jobs[["job", "pid", "tid", "start_ns", "end_ns"]].values.tolist() == [[0, 100, LOOP, 1_000, 95_000]]
    assert not jobs.errored[0] and jobs.graph_tasks[0] == 2
    a, b = tasks.itertuples()
    assert (a.key, a.sent_ns, a.enter_ns, a.computed_ns, a.done_ns, a.exec_tid) == ("('a', 0)", 10_000, 12_000, 30_000,
                                                                                    40_000, POOL)
    assert list(b.deps) == ["('a', 0)"] and b.enter_ns == 47_000 and b.worker_id == str(7000 + POOL)


def test_reader_leaves_out_malformed_and_torn_lines(tmp_path):
    good = line("J", t_ns=1, pid=100, tid=LOOP, job=0, tasks=1)
    path = tmp_path / "local_scheduler.100.tsv"
    path.write_text(good + "J\t2\tnot-a-pid\t1\t1\t1\n" + "Z\t1\n" + "F\t3\t100\t100\t0\t7\n" + good[:-3])
    bad = Counter()
    jobs, tasks = read_local([path], bad)
    assert len(jobs) == 1 and tasks.empty and pd.isna(jobs.end_ns[0])
    assert bad[path.name] == 3  # a pid that is no number, an unknown kind, a flag that is not one; the torn last
    # line is no line at all


def test_a_run_entered_after_the_result_is_another_dispatchs(tmp_path):
    """The same key computed in two jobs: each dispatch gets its own run of it, never the later one."""
    text = (line("J", t_ns=0, pid=100, tid=LOOP, job=0, tasks=1) + task("x", [], 10, 11, 12, 13, 14, 15)
            + line("F", t_ns=16, pid=100, tid=LOOP, job=0, errored=0)
            + line("J", t_ns=20, pid=100, tid=LOOP, job=1, tasks=1)
            + line("P", t_ns=30, pid=100, tid=LOOP, job=1, key="x", deps="")
            + line("F", t_ns=40, pid=100, tid=LOOP, job=1, errored=1))
    (tmp_path / "local_scheduler.100.tsv").write_text(text)
    jobs, tasks = read_local([tmp_path / "local_scheduler.100.tsv"])
    assert tasks.job.tolist() == [0, 1] and tasks.enter_ns.tolist()[0] == 11 and pd.isna(tasks.enter_ns[1])
    assert jobs.errored.tolist() == [False, True]
    j = local.jobs_table(jobs.assign(end_ns=jobs.end_ns.where(jobs.job == 0)), local.attempts(tables(
        jobs, tasks.assign(prefix="x"))))
    assert j.complete.tolist() == [True, False] and j.untold.tolist() == [0, 1]  # job 1 never ended: x untold
    assert j.end_key.tolist() == ["x", None]  # no result in job 1: null in summary.json, not NaN


def path_of(tmp_path, **kw) -> pd.DataFrame:
    jobs, tasks = chain(tmp_path, **kw)
    t = tables(jobs, tasks)
    a = local.attempts(t)
    return local.critical_path(local.jobs_table(jobs, a), a, tasks, jobs, local.processes(t))


def test_the_critical_path_goes_through_the_loop_and_the_pool_and_covers_the_job(tmp_path):
    path = path_of(tmp_path)
    assert path.start_ns.iloc[0] == 1_000 and path.end_ns.iloc[-1] == 95_000
    assert (path.start_ns.to_numpy()[1:] == path.end_ns.to_numpy()[:-1]).all()  # contiguous
    steps = list(zip(path.kind, path.part.str.replace("local scheduler: ", ""), path.start_ns // 1000))
    assert steps == [("scheduler", "ordering the graph to the first dispatch", 1), ("pool", "hand-over to the pool", 10),
                     ("pool", "unpacking the task", 12), ("compute", "compute", 13), ("pool", "packing the result", 30),
                     ("scheduler", "taking the result in", 31), ("scheduler", "from a result to the next dispatch", 40),
                     ("pool", "hand-over to the pool", 45), ("pool", "unpacking the task", 47),
                     ("compute", "compute", 48), ("pool", "packing the result", 80),
                     ("scheduler", "taking the result in", 81), ("scheduler", "ending the job", 90)]
    assert set(path.process) == {"client"}


def test_a_new_pool_process_is_named_on_its_first_hand_over(tmp_path):
    path = path_of(tmp_path, pid=555, tid=555)
    hand = path[path.part.str.startswith("hand-over")]
    assert hand.part.tolist() == ["hand-over to the pool" + local.NEW_PROCESS, "hand-over to the pool"]
    assert set(path.process[path.kind != "scheduler"]) == {"pool process 555"}


def test_a_task_that_waited_for_the_one_ahead_in_its_batch_goes_through_it(tmp_path):
    """Two independent tasks dispatched together to one thread (chunksize 2): b's hand-over is a's run."""
    text = (line("J", t_ns=0, pid=100, tid=LOOP, job=0, tasks=2) + task("a", [], 10, 11, 12, 50, 51, 60)
            + task("b", [], 20, 52, 53, 90, 91, 95) + line("F", t_ns=99, pid=100, tid=LOOP, job=0, errored=0))
    (tmp_path / "local_scheduler.100.tsv").write_text(text)
    jobs, tasks = read_local([tmp_path / "local_scheduler.100.tsv"])
    t = tables(jobs, tasks.assign(prefix=tasks.key))
    a = local.attempts(t)
    path = local.critical_path(local.jobs_table(jobs, a), a, tasks, jobs, local.processes(t))
    assert path[path.kind == "compute"].key.tolist() == ["a", "b"]
    assert "the next task of its batch" in path.part.tolist()


def test_the_client_has_the_time_between_jobs():
    jobs = pd.DataFrame({"job": [0, 1], "start_ns": [0, 100], "end_ns": [50, 150]})
    local_jobs = pd.DataFrame({"job": [0, 1], "pid": [100, 100]})
    procs = pd.DataFrame({"pid": [100], "name": ["client"], "role": ["client"]})
    gap = local.between_jobs(jobs, local_jobs, procs)
    assert gap[["start_ns", "end_ns", "kind", "process"]].values.tolist() == [[50, 100, "client", "client"]]


def summary(schedulers=("threads",), pool=4, parts=None, cats=None, overhead=50e-6, compute=20e-6) -> dict:
    cats = {"compute": 1.0, **(cats or {})}
    return {"session_s": 10.0, "makespan_s": 10.0, "tasks": 1000, "recomputed": {"keys": 0},
            "critical_path_s": cats, "critical_path_parts_s": parts or {}, "critical_path_interval_s": {},
            "local_scheduler": {"schedulers": list(schedulers), "pool": pool, "overhead_per_task_s": overhead,
                                "per_task_mean_s": {"compute_s": compute, "hand_over_s": 2e-5, "unpack_s": 1e-5,
                                                    "pack_s": 1e-5, "take_in_s": 1e-5}}}


NO_TABLES = {"compute_profile": pd.DataFrame(columns=["prefix", "function", "filename", "line", "samples", "seconds",
                                                      "prefix_samples", "share"])}
GIL = {"compute: compute (task thread waiting for the GIL) [gil_contention]": 6.0}


def ids(s: dict, meta: dict | None = None) -> list[str]:
    return [f["id"] for f in local_findings(s, NO_TABLES, meta or {"cpus": 2})]


def test_local_gil_fires_on_a_threads_pool_whose_tasks_waited_for_the_gil():
    assert "local-gil" in ids(summary(parts=GIL, cats={"gil_contention": 6.0}))


def test_local_gil_counterexamples():
    assert "local-gil" not in ids(summary())  # tasks that release the GIL: no waits on the path
    waits = {"parts": GIL, "cats": {"gil_contention": 6.0}}
    assert "local-gil" not in ids(summary(schedulers=("sync",), pool=1, **waits))  # no pool of threads
    assert "local-gil" not in ids(summary(pool=1, **waits))  # one thread: nothing to serialise against
    assert "local-gil" not in ids(summary(cats={"gil_contention": 0.5}))  # under a tenth of the session


def test_local_overhead_fires_when_dasks_work_on_the_path_outweighs_the_tasks():
    assert "local-overhead" in ids(summary(cats={"runtime_bookkeeping": 4.0, "compute": 1.0}))
    # the counterexamples: compute outweighs Dask's work; no Dask work on the path
    assert "local-overhead" not in ids(summary(cats={"runtime_bookkeeping": 4.0, "compute": 5.0}))
    assert "local-overhead" not in ids(summary(cats={"runtime_bookkeeping": 0.0}))


def test_local_starvation_advice_follows_the_pool_against_the_cpus():
    s = summary(cats={"cpu_starvation": 3.0}, pool=8)
    (f,) = [f for f in local_findings(s, NO_TABLES, {"cpus": 2}) if f["id"] == "local-cpu-starvation"]
    assert "num_workers=2" in f["advice"]
    (f,) = [f for f in local_findings(summary(cats={"cpu_starvation": 3.0}, pool=2), NO_TABLES, {"cpus": 2})
            if f["id"] == "local-cpu-starvation"]
    assert "quiet machine" in f["advice"]
    assert "local-cpu-starvation" not in ids(summary())


def test_pool_start_fires_only_on_new_pool_processes_on_the_path():
    part = f"pool: hand-over to the pool{local.NEW_PROCESS} [runtime_bookkeeping]"
    assert "pool-start" in ids(summary(schedulers=("processes",), parts={part: 3.0}))
    assert "pool-start" not in ids(summary(schedulers=("processes",),
                                           parts={"pool: hand-over to the pool [runtime_bookkeeping]": 3.0}))


def test_nothing_to_measure_says_no_computation_was_seen_not_another_scheduler():
    """A command that computed nothing (the cluster's own heartbeats went by): before, the hint asked whether
    it had connected to another scheduler, also when it had computed with a local scheduler."""
    said = _nothing({"messages": pd.DataFrame({"src_role": ["worker"], "op": ["heartbeat_worker"]})}, {})
    assert "no local scheduler" in said and "did the command connect" not in said


def test_local_tables_make_jobs_tasks_and_ready_times(tmp_path):
    jobs, tasks = chain(tmp_path)
    t = tables(jobs, tasks)
    a = local.attempts(t)
    j = local.jobs_table(jobs, a)
    assert j[["job", "start_ns", "end_ns", "requested", "end_key"]].values.tolist() == [[0, 1_000, 95_000, 1, "b-1"]]
    tt = local.tasks_table(a, j)
    assert tt.ready_by.tolist() == ["graph", "('a', 0)"] and tt.ready_ns.tolist() == [1_000, 40_000]
    assert np.array_equal(a.compute_start_ns.to_numpy("int64"), [13_000, 48_000])
    assert local.scheduler_kind(t) == {0: {"scheduler": "threads", "pool": 1}}


def test_collect_copies_the_commands_files_and_follows_nothing_it_planted(tmp_path, monkeypatch):
    """The command's user owns the directory: root copies only regular files of that user's, through no link,
    never waits on a FIFO, and reads at most MAX_BYTES of one (cut at a line's end)."""
    import os
    from daskprobe.probes import local_scheduler as ls
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir(), dest.mkdir()
    (src / "local_scheduler.1.tsv").write_text(line("J", t_ns=1, pid=1, tid=1, job=0, tasks=1))
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    (src / "local_scheduler.2.tsv").symlink_to(secret)
    os.mkfifo(src / "local_scheduler.3.tsv")
    (src / "local_scheduler.4.tsv").write_text("x\n")
    os.chown(src / "local_scheduler.4.tsv", 65534, 65534)  # another user's
    (src / "local_scheduler.5.tsv").write_text("a\tb\n" * 10)
    (src / "unrelated.txt").write_text("not ours to copy\n")
    monkeypatch.setattr(ls, "MAX_BYTES", 12)
    said = ls.collect(src, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["local_scheduler.1.tsv", "local_scheduler.5.tsv"]
    assert (dest / "local_scheduler.5.tsv").read_text() == "a\tb\n" * 3  # 12 bytes: three whole lines
    assert [s.split(":")[0] for s in said] == ["local_scheduler.2.tsv", "local_scheduler.3.tsv",
                                               "local_scheduler.4.tsv", "local_scheduler.5.tsv"]
    assert "regular file" in said[1] and "regular file" in said[2] and "cut" in said[3]
    (tmp_path / "link").symlink_to(src)
    assert ls.collect(tmp_path / "link", dest)  # the directory itself a link: refused, said


def test_local_jobs_beside_a_clusters_are_said_not_dropped():
    from daskprobe.analyzers.caveats import caveats
    said = caveats({}, {"local_scheduler": {"schedulers": ["threads"], "ignored_jobs": 2}})
    assert said and "2 job(s) of a local scheduler (threads)" in said[0]
    assert not caveats({}, {"local_scheduler": {"schedulers": ["threads"], "pool": 4}})  # a local run's own


def test_a_task_that_raised_ends_its_jobs_path(tmp_path):
    """No posttask for a task that raised: the loop raised its error and the job ended. Before, such a job's
    path was one stretch of the loop's, without the task."""
    text = (line("J", t_ns=0, pid=100, tid=LOOP, job=0, tasks=1)
            + line("P", t_ns=10, pid=100, tid=LOOP, job=0, key="boom", deps="")
            + line("X", pid=100, tid=POOL, ident=1, key="boom", enter_ns=12, loaded_ns=13, computed_ns=0, exit_ns=50,
                   failed=1)
            + line("F", t_ns=60, pid=100, tid=LOOP, job=0, errored=1))
    (tmp_path / "local_scheduler.100.tsv").write_text(text)
    jobs, tasks = read_local([tmp_path / "local_scheduler.100.tsv"])
    t = tables(jobs, tasks.assign(prefix="boom"))
    a = local.attempts(t)
    assert a.outcome.tolist() == ["erred"] and a.compute_stop_ns.tolist() == [50]
    path = local.critical_path(local.jobs_table(jobs, a), a, tasks, jobs, local.processes(t))
    assert path.kind.tolist() == ["scheduler", "pool", "pool", "compute", "scheduler"]
    assert path.start_ns.iloc[0] == 0 and path.end_ns.iloc[-1] == 60


def test_a_loop_in_another_thread_than_the_main_one_is_split_by_its_own_state(tmp_path):
    """compute called from a thread: its loop's time goes under that thread, a process of its own for the
    attribution (whose main thread it is), not the process's main thread (blocked in a join, say: idle)."""
    jobs, tasks = chain(tmp_path)
    jobs = jobs.assign(tid=555)
    tasks = tasks.assign(tid=555)
    procs = pd.DataFrame({"pid": [100], "name": ["client"], "role": ["client"]})
    loops = local.other_loops(jobs, procs)
    assert loops == {(100, 555): "client thread 555"}
    t = tables(jobs, tasks, procs)
    a = local.attempts(t, loops)
    path = local.critical_path(local.jobs_table(jobs, a), a, tasks, jobs, procs, None, loops)
    assert set(path.process[path.kind == "scheduler"]) == {"client thread 555"}
    assert set(path.process[path.kind != "scheduler"]) == {"client"}  # the pool's threads stay the process's
    states = pd.DataFrame({"pid": [100, 100], "tid": [555, 100], "start_ns": [0, 0], "end_ns": [9, 9],
                           "state": ["gil", "blocked"]})
    p2, s2, _, _ = local.as_processes(loops, procs, states, states.iloc[:0], states.iloc[:0])
    assert p2.set_index("name").pid.to_dict() == {"client": 100, "client thread 555": 555}
    assert s2[["pid", "tid", "state"]].values.tolist() == [[555, 555, "gil"], [100, 100, "blocked"]]
