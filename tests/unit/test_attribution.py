"""The makespan split on hand-made runs where every millisecond is known."""

import pandas as pd
import pytest

from scenario import META, Scenario, analyze, two_task_chain


def split(s: Scenario, **kw) -> dict:
    return analyze(s.tables(), META).summary | kw


def ms(summary: dict, category: str) -> float:
    return round(summary["critical_path_s"].get(category, 0.0) * 1e3, 6)


def test_every_millisecond_of_a_chain_is_where_it_happened():
    s = two_task_chain(Scenario())
    # the scheduler's event loop, in its 22 ms on the path:
    s.state("scheduler", "gil", 37, 39)        # waits 2 ms for the GIL
    s.state("scheduler", "runnable", 40, 41)   # 1 ms without a CPU
    s.state("scheduler", "blocked", 42, 45)    # 3 ms before compute-task leaves: the 5 ms batching interval
    s.state("scheduler", "blocked", 12, 14)    # 2 ms blocked long before the message: idle
    s.sample("scheduler", 16, "SchedulerState.decide_worker_non_rootish")
    s.sample("scheduler", 36.5, "SchedulerState._transition_waiting_processing")
    out = split(s)
    assert out["session_s"] == pytest.approx(0.1) and out["makespan_s"] == pytest.approx(0.056)
    assert sum(out["critical_path_s"].values()) == pytest.approx(out["session_s"])
    assert ms(out, "network") == 6 and ms(out, "compute") == 20 and ms(out, "client") == 44
    assert ms(out, "gil_contention") == 2 and ms(out, "cpu_starvation") == 1 and ms(out, "idle") == 2
    # 14 ms on a CPU, half of its samples deciding; 3 ms batching; the worker's 8 ms have no samples
    assert ms(out, "scheduler_decisions") == 7 and ms(out, "runtime_bookkeeping") == 10
    assert ms(out, "uncategorized") == 8
    assert out["critical_path_interval_s"]["scheduler_decisions"]["samples"] == 1
    assert out["critical_path_interval_s"]["scheduler_decisions"]["few_samples"]


def test_sequential_computations_are_jobs_and_the_gap_is_the_clients():
    s = Scenario()
    s.message("client", "scheduler", 0, 1, "register-client")
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 26)
    s.told("a-0", 27, 28)
    s.graph(1028, 1029, ["a-0", "b-0"])  # asks again for a-0 (held) and a new key
    s.task("b-0", "worker-1", 1030, 1031, 1032, 1042, 1043, 1044)
    s.told("a-0", 1030, 1030.5)
    s.told("b-0", 1045, 1046)
    out = split(s)
    assert [j["makespan_s"] for j in out["jobs"]] == pytest.approx([0.018, 0.018])
    assert ms(out, "client") == pytest.approx(10 + 1000)
    assert sum(out["critical_path_s"].values()) == pytest.approx(out["session_s"])


def test_a_job_whose_end_was_not_recorded_is_incomplete_and_its_time_not_the_clients():
    # the capture lost c-0's result (a full disk, a tap that lost packets): job 0 has no recorded end
    s = Scenario()
    s.message("client", "scheduler", 0, 1, "register-client")
    s.graph(10, 11, ["a-0", "c-0"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 26)
    s.told("a-0", 27, 28)
    s.task("c-0", "worker-0", 12, 13, 30, None, None, None, outcome="unfinished")
    s.graph(1028, 1029, ["b-0"])
    s.task("b-0", "worker-1", 1030, 1031, 1032, 1042, 1043, 1044)
    s.told("b-0", 1045, 1046)
    let_go = split(s)  # nothing lost: the client let c-0 go (cancelled it, dropped its future)
    assert [(j["complete"], j["untold"]) for j in let_go["jobs"]] == [(True, 1), (True, 0)]
    assert ms(let_go, "client") == pytest.approx(10 + 1000)
    out = analyze(s.tables(), META | {"lost": {"proxy": {"stopped": {"t_ns": 30 * 1_000_000}}}}).summary
    assert [(j["complete"], j["untold"]) for j in out["jobs"]] == [(False, 1), (True, 0)]
    assert ms(out, "client") == pytest.approx(10), "only before the first job: the rest is not known to be the client's"
    parts = out["critical_path_parts_s"]
    assert parts["incomplete: job incomplete: its end was not recorded [uncategorized]"] * 1e3 == pytest.approx(1000)
    assert sum(out["critical_path_s"].values()) == pytest.approx(out["session_s"])


def test_a_job_none_of_whose_keys_was_told_has_no_end_key():
    # fire_and_forget: the client asked for nothing back; the task still ran as the command ended
    s = Scenario()
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, None, None, None, outcome="unfinished")
    job = split(s)["jobs"][0]  # summary.json written and checked (strict in the tests): null, not NaN
    assert job["end_key"] is None and job["untold"] == 1


def test_a_job_with_no_end_key_before_one_with_it_has_null_not_nan():
    # pandas makes a column of keys and nulls a string column, whose nulls are NaN (CI: a chain of 40
    # submits under the random scheduler, whose earlier keys the client let go untold)
    s = Scenario()
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, None, None, None, outcome="unfinished")
    s.graph(1028, 1029, ["b-0"])
    s.task("b-0", "worker-1", 1030, 1031, 1032, 1042, 1043, 1044)
    s.told("b-0", 1045, 1046)
    assert [j["end_key"] for j in split(s)["jobs"]] == [None, "b-0"]


def test_a_worker_that_died_is_idle_only_until_it_died():
    s = Scenario()
    s.graph(10, 11, ["a-0", "b-0"])
    s.task("a-0", "worker-1", 12, 13, 14, 24, 25, 26)
    s.task("b-0", "worker-0", 12, 13, 14, 1040, 1043, 1044)
    s.told("a-0", 27, 28)
    s.told("b-0", 1045, 1046)
    t = s.tables()
    ms_ = 1_000_000
    t["connections"] = pd.DataFrame({"peer": ["worker-1", "worker-0"], "closed_ns": pd.array([30 * ms_, None], "Int64")})
    out = analyze(t, META).summary
    assert out["workers_ended_s"] == {"worker-1": pytest.approx(0.020)}  # 30 ms, the session began at 10
    assert out["worker_idle_s"]["worker-1"] == pytest.approx(0.020 - 0.012), "not the 1 s after it died"  # held 13-25


def test_a_futures_loop_is_one_job_with_the_client_thinking_between_result_and_resubmission():
    s = Scenario()
    s.graph(0, 1, ["f-0"])
    s.graph(2, 3, ["f-1"])  # submitted while f-0 is in the cluster: one job
    s.task("f-0", "worker-0", 4, 5, 6, 16, 17, 18)
    s.task("f-1", "worker-1", 4, 5, 6, 525, 526, 527)  # still in the cluster when g-0 comes
    s.told("f-0", 19, 20)
    s.graph(520, 521, ["g-0"])  # as_completed: f-0's result, 500 ms of the client's own work, a new task
    s.task("g-0", "worker-0", 522, 523, 524, 534, 535, 536)
    s.told("f-1", 528, 529)
    s.told("g-0", 537, 538)
    out = split(s)
    assert len(out["jobs"]) == 1 and out["jobs"][0]["graphs"] == 3
    parts = out["jobs"][0]["critical_path_parts_s"]
    assert parts["client: client: between a result and its next submission [client]"] == pytest.approx(0.5)
    assert ms(out, "compute") == 20  # f-0 and g-0: the path runs through the result the client waited for


def test_a_stolen_task_waits_on_its_first_worker_and_the_steal_is_a_decision():
    s = Scenario()
    s.graph(0, 1, ["x-0"])
    s.task("x-0", "worker-0", 10, 11, None, None, None, None, outcome="stolen", moved=40)
    s.task("x-0", "worker-1", 45, 46, 47, 57, 60, 61)
    s.told("x-0", 65, 66)
    out = split(s)
    parts = out["jobs"][0]["critical_path_parts_s"]
    assert parts["queueing: worker-side queueing on worker-0 (then stolen) [queueing]"] == pytest.approx(0.029)
    assert parts["scheduler_decisions: work stealing (steal-request to re-dispatch) [scheduler_decisions]"] == \
        pytest.approx(0.005)
    assert out["dispatches"] == 2 and out["tasks"] == 1


def test_a_loop_waiting_on_its_offload_thread_is_that_threads_work_not_idle():
    s = two_task_chain(Scenario())
    s.state("scheduler", "blocked", 11, 15)   # graph to dispatch: the loop waits ...
    s.state("scheduler", "blocked", 5, 11, tid=101)
    for t in (11.5, 12.5, 13.5, 14.5):        # ... while the offload thread materializes the graph
        s.sample("scheduler", t, "_materialize_graph", "dask/highlevelgraph.py", tid=101, name="Dask-Offload_0")
    s.state("scheduler", "blocked", 15, 16, tid=101)
    s.sample("scheduler", 18, "SchedulerState._transition_waiting_processing")
    out = split(s)
    assert ms(out, "idle") == 0
    assert ms(out, "runtime_bookkeeping") == pytest.approx(22)  # all the scheduler's path time


def test_a_thread_spinning_in_code_of_its_own_does_not_hide_idle_time():
    s = two_task_chain(Scenario())
    s.state("scheduler", "blocked", 11, 15)
    s.state("scheduler", "runnable", 5, 6, tid=101)
    for t in (11.5, 12.5, 13.5, 14.5):
        s.sample("scheduler", t, "spin", "/home/me/plugin.py", tid=101, name="busy-plugin")
    s.sample("scheduler", 18, "SchedulerState._transition_waiting_processing")
    assert ms(split(s), "idle") == 4


def test_recomputed_keys_are_counted_per_job():
    s = Scenario()
    for job, t in enumerate((0, 100)):
        s.graph(t, t + 1, ["y-0"])
        s.task("x-0", "worker-0", t + 2, t + 3, t + 4, t + 14, t + 15, t + 16)
        s.task("y-0", "worker-0", t + 17, t + 18, t + 19, t + 29, t + 30, t + 31, deps=["x-0"])
        s.told("y-0", t + 32, t + 33)
    out = split(s)
    assert out["recomputed"]["keys"] == 2 and out["recomputed"]["times"] == 2
    assert out["recomputed"]["compute_s"] == pytest.approx(0.020)
    assert [j["recomputed"]["keys"] for j in out["jobs"]] == [0, 2]


def test_cpu_is_the_threads_on_cpu_time_shared_by_its_samples():
    s = two_task_chain(Scenario())
    s.state("scheduler", "blocked", 0, 50)     # the loop ran from 50 to 100 ms
    s.sample("scheduler", 1, "idle_wait", active=False)
    for t in (52, 55, 58):
        s.sample("scheduler", t, "SchedulerState.decide_worker_non_rootish")
    s.sample("scheduler", 63, "SchedulerState.transitions")
    s.state("scheduler", "blocked", 95, 99)
    cpu = split(s)["cpu_by_category_s"]["scheduler"]
    # makespan window 10-66 ms: the loop was on a CPU 50-66 ms; 3 of 4 on-CPU samples decide
    assert cpu["scheduler_decisions"] == pytest.approx(0.016 * 3 / 4)
    assert cpu["runtime_bookkeeping"] == pytest.approx(0.016 / 4)


def test_nothing_to_measure_says_why():
    s = Scenario()
    s.message("client", "scheduler", 0, 1, "register-client")
    s.task("a-0", "worker-0", 20, 21, 22, 32, 35, 36)
    assert "no update-graph" in split(s)["error"]
    # a command that failed is not taken for one that connected elsewhere
    failed = analyze(s.tables(), META | {"exit_code": 1}).summary["error"]
    assert "the command failed (exit code 1" in failed and "another scheduler" not in failed


def test_a_client_waiting_for_the_scheduler_to_answer_is_not_the_clients_own_time():
    s = two_task_chain(Scenario())
    s.message("client", "scheduler", 2, 2.1, "identity")
    s.message("scheduler", "client", 8, 8.1, "reply")  # late: the scheduler's loop waited for the GIL
    s.state("scheduler", "gil", 2.1, 8)
    out = split(s)
    assert ms(out, "gil_contention") == pytest.approx(5.9)
    assert ms(out, "client") == pytest.approx(44 - 6.1)
    assert sum(out["critical_path_s"].values()) == pytest.approx(out["session_s"])


def test_handshakes_that_cross_on_a_slow_link_are_counted_once():
    s = two_task_chain(Scenario())
    s.message("client", "scheduler", 1, 5, "handshake")      # 4 ms on a delayed link
    s.message("scheduler", "client", 1.1, 5.1, "handshake")  # sent on connect: reaches the proxy first
    out = split(s)
    assert sum(out["critical_path_s"].values()) == pytest.approx(out["session_s"])
    assert ms(out, "network") == pytest.approx(6 + 4 + 0.1)


def test_a_gather_the_scheduler_passes_on_to_a_worker_is_the_wire_and_that_worker():
    s = two_task_chain(Scenario())
    s.message("client", "scheduler", 70, 70.1, "gather")                # after the job: no job in the cluster
    ask = s.message("scheduler", "worker-0", 71, 75, "get_data")        # 4 ms on the wire
    s.message("worker-0", "scheduler", 80, 84, "reply")                  # the worker 5 ms, 4 ms back
    s.msgs[-1]["reply_to"] = ask
    s.message("scheduler", "client", 85, 85.1, "reply")
    out = split(s)
    parts = out["critical_path_parts_s"]
    assert parts["network: scheduler's request to a worker [network]"] == pytest.approx(0.004)
    assert parts["network: worker's reply to the scheduler [network]"] == pytest.approx(0.004)
    assert sum(v for k, v in parts.items() if k.startswith("worker: answering the scheduler")) == pytest.approx(0.005)
    assert ms(out, "client") == pytest.approx(44 - 15.1)  # the client's own: all but 70 -> 85.1


def test_a_loop_runnable_while_its_own_process_holds_the_gil_waits_for_the_gil():
    s = two_task_chain(Scenario())
    s.state("scheduler", "runnable", 36, 44)  # 8 ms on the path without a CPU
    for t in (37, 39, 41, 43):  # four reads of the scheduler, its loop off the CPU in each
        s.sample("scheduler", t, "SchedulerState.transition", active=False)
    for t in (37, 39):  # in two, a thread of its own ran Python on a CPU
        s.sample("scheduler", t, "spin", file="plugin.py", tid=101, name="busy-plugin")
    # in one, that thread was preempted still holding the GIL: the loop would wait for it all the same
    s.state("scheduler", "runnable", 40.5, 41.5, tid=101)
    s.sample("scheduler", 41, "spin", file="plugin.py", tid=101, name="busy-plugin", active=False)
    # in the last, a thread without the GIL: the loop only lacked a CPU
    s.sample("scheduler", 43, "wait", file="threading.py", tid=102, name="idle-pool", active=False, owns_gil=False)
    out = split(s)
    assert ms(out, "gil_contention") == pytest.approx(6) and ms(out, "cpu_starvation") == pytest.approx(2)
    assert out["critical_path_interval_s"]["gil_contention"]["samples"] == 3
    assert sum(out["critical_path_s"].values()) == pytest.approx(out["session_s"])


def test_a_job_waiting_on_a_task_an_earlier_job_dispatched_waits_on_its_compute():
    s = Scenario()
    s.graph(0, 1, ["a-0"])
    s.task("a-0", "worker-0", 2, 3, 4, 12, 13, 14)
    s.task("s-0", "worker-1", 3, 4, 5, 30, 31, 32)  # a future submitted with a-0, not waited for: it runs on
    s.told("a-0", 15, 16)  # the first job ends
    s.graph(20, 21, ["b-0"])  # b-0 needs s-0, still computing
    s.task("b-0", "worker-0", 33, 34, 35, 40, 41, 42, deps=("s-0",))
    s.told("b-0", 43, 44)
    out = split(s)
    assert len(out["jobs"]) == 2
    parts = out["jobs"][1]["critical_path_parts_s"]
    assert sum(parts.values()) == pytest.approx(0.024)  # its makespan, 20 to 44 ms, all of it placed
    assert parts["compute: compute [compute]"] == pytest.approx(0.010 + 0.005)  # s-0 from the job's start, b-0
