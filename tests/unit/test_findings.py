"""Findings fire on the evidence that calls for them, and stay quiet without it."""

import functools
from pathlib import Path

import pytest

from daskprobe.analyzers import evidence
from scenario import META, MS, Scenario, analyze, two_task_chain


def found(s: Scenario, meta: dict = META) -> dict:
    return {f["id"]: f for f in analyze(s.tables(), meta).summary["findings"]}


def short_session(s: Scenario) -> Scenario:
    """A chain whose client connects just before submitting and leaves just after its result."""
    return two_task_chain(s, connect=9, leave=67)


@functools.cache
def quiet_findings() -> frozenset:
    """The findings of a short session with nothing to find: the counterexample most rules share (analysed
    once: an analysis takes a third of a second however small its run)."""
    return frozenset(found(short_session(Scenario())))


def test_recomputed_keys_name_their_prefix_and_a_single_computation_names_none():
    s = Scenario()
    for t in (0, 100):
        s.graph(t, t + 1, ["y-0"])
        s.task("x-0", "worker-0", t + 2, t + 3, t + 4, t + 14, t + 15, t + 16)
        s.task("y-0", "worker-0", t + 17, t + 18, t + 19, t + 29, t + 30, t + 31, deps=["x-0"])
        s.told("y-0", t + 32, t + 33)
    f = found(s)["recomputed"]
    assert "2 keys" in f["title"] and "'x'" in f["evidence"] and "'y'" in f["evidence"]
    assert "recomputed" not in quiet_findings()


def test_recomputed_keys_are_named_by_the_prefix_computed_again_most_often():
    # three cheap keys computed twice, and one dear key: the cheap ones are the more frequent cause
    s = Scenario()
    for t in (0, 200):
        s.graph(t, t + 1, ["dear-0", "cheap-2"])
        for i in range(3):
            u = t + 2 + 6 * i
            s.task(f"cheap-{i}", "worker-0", u, u + 1, u + 2, u + 3, u + 4, u + 5, deps=[f"cheap-{i - 1}"] * (i > 0))
        s.task("dear-0", "worker-1", t + 2, t + 3, t + 4, t + 64, t + 65, t + 66)
        s.told("dear-0", t + 67, t + 68)
        s.told("cheap-2", t + 21, t + 22)
    evidence = found(s)["recomputed"]["evidence"]
    assert "'cheap' (3 keys, 3 extra)" in evidence and evidence.index("'cheap'") < evidence.index("'dear'")


def test_client_time_between_computations_is_a_finding_only_when_it_is_large():
    s = Scenario()
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 26)
    s.told("a-0", 27, 28)
    s.graph(1028, 1029, ["b-0"])
    s.task("b-0", "worker-1", 1030, 1031, 1032, 1042, 1043, 1044)
    s.told("b-0", 1045, 1046)
    assert next(iter(found(s))) == "client"
    assert "client" not in quiet_findings()


def test_a_task_waiting_for_a_busy_thread_is_worker_saturation():
    s = Scenario()
    s.graph(0, 1, ["a-0", "b-0"])
    s.task("a-0", "worker-0", 2, 3, 4, 54, 55, 56)
    s.task("b-0", "worker-0", 2, 3, 54, 64, 65, 66)  # arrived at 3, its thread free only at 54
    s.told("a-0", 57, 58)
    s.told("b-0", 67, 68)
    assert "worker-saturation" in found(s)
    assert "worker-saturation" not in quiet_findings()
    # what to change depends on whether the machine had cores to spare
    advice = {cpus: analyze(s.tables(), META | {"cpus": cpus, "cluster": {"workers": 2, "threads": 1}})
              .summary["findings"] for cpus in (2, 8)}
    advice = {cpus: next(f["advice"] for f in fs if f["id"] == "worker-saturation") for cpus, fs in advice.items()}
    assert "would not" in advice[2] and "more workers or threads shorten" in advice[8]


def one_thread_parts(a: tuple, b: tuple) -> dict:
    """The path's parts of a job of two tasks dispatched together to one thread of worker-0; each task's
    (compute start, stop, finished sent, received, told) in ms."""
    s = Scenario()
    s.graph(0, 1, ["a-0", "b-0"])
    for key, (start, stop, sent, recv, told) in (("a-0", a), ("b-0", b)):
        s.task(key, "worker-0", 2, 3, start, stop, sent, recv)
        s.told(key, told, told + 1)
    return analyze(s.tables(), META).summary["critical_path_parts_s"]


def test_a_task_that_ran_next_on_the_thread_is_not_one_it_waited_for():
    """Two short tasks on one thread whose recorded spans overlap (30-30.4 and 30.2-30.6 ms: the
    worker's clock, converted): each stopped within the hand-over slack of the other's start. Only the
    one that started first can be what the other waited for; else the walk went round from one to the
    other and left the job's time to the client ("client: submitting": a 3.4 s transfers run read 94%
    client)."""
    parts = one_thread_parts(a=(30.2, 30.6, 31, 32, 33), b=(30, 30.4, 61, 62, 63))
    assert not any("submitting" in k for k in parts), parts


def test_a_start_recorded_just_before_the_previous_stop_on_one_thread_still_waited_for_it():
    """Seen in a run: the next task's start 28 us before its predecessor's stop (the worker's clock,
    converted); one thread runs one task at a time, so it waited for that one."""
    parts = one_thread_parts(a=(4, 54, 55, 56, 57), b=(53.972, 64, 65, 66, 67))
    held = "compute: compute (worker saturation: holding the thread the next task waited for) [compute]"
    assert parts.get(held) == pytest.approx(0.05, abs=1e-4), parts  # a-0's 4-54 ms, not b-0's wait as idle


def test_gil_contention_names_the_thread_that_held_the_gil():
    s = short_session(Scenario())
    s.state("scheduler", "gil", 36, 44)  # the scheduler's loop waits for the GIL between a-0 and b-1
    for t in (36.5, 38.5, 40.5, 42.5):
        s.sample("scheduler", t, "spin", "/home/me/plugin.py", tid=101, name="busy-plugin")
    f = found(s)["gil-contention"]
    assert "thread 'busy-plugin' of scheduler, in spin (plugin.py:1)" in f["evidence"], f
    assert "gil-contention" not in quiet_findings()


def test_a_scheduler_short_of_cpu_is_cpu_starvation():
    s = short_session(Scenario())
    s.state("scheduler", "runnable", 36, 44)
    for t in (37, 38, 39):  # meanwhile a worker's thread ran on the CPU
        s.sample("worker-0", t, "SchedulerState.decide_worker_non_rootish")  # any stack: its category counts
    s.state("scheduler", "runnable", 1, 8)  # before the job: what the client ran then starved no path
    for t in (2, 3, 4, 5, 6):
        s.sample("client", t, "_find_and_load")
    starved = next(f for f in analyze(s.tables(), META).summary["findings"] if f["id"] == "cpu-starvation")
    assert "worker-0 scheduler_decisions 100% (of 3 samples)" in starved["evidence"], starved
    assert "cpu-starvation" in found(s)
    assert "cpu-starvation" not in quiet_findings()


def test_slow_worker_choice_is_a_decisions_finding():
    s = short_session(Scenario())
    for t in (37, 39, 41, 43):
        s.sample("scheduler", t, "SchedulerState.decide_worker_non_rootish")
    assert "scheduler-decisions" in found(s)
    assert "scheduler-decisions" not in quiet_findings()


def test_tasks_small_for_their_overhead():
    s = short_session(Scenario())
    for t in range(12, 66):  # the scheduler's bookkeeping the whole job: 31 ms of its CPU per task
        s.sample("scheduler", t, "SchedulerState._transition_waiting_processing")
    assert "task-overhead" in found(s)  # 10 ms of compute per task, 28 ms of makespan per task
    assert "task-overhead" not in quiet_findings()


def test_no_fewer_bigger_tasks_when_dask_spends_less_per_task_than_the_tasks():
    """The premise: Dask's CPU per task above the tasks' compute. Here 8 ms against 10 ms, though the
    makespan per task (28 ms) is well above the compute: the makespan went elsewhere."""
    s = short_session(Scenario())
    for t in (37, 39, 41, 43):
        s.sample("scheduler", t, "SchedulerState._transition_waiting_processing")
    assert "task-overhead" not in found(s)


def test_a_graph_slow_to_dispatch_is_a_materialization_finding():
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 40, 41, 42, 52, 55, 56)  # 29 ms from the graph to its first dispatch
    s.told("a-0", 57, 58)
    s.message("client", "scheduler", 58.5, 59, "close-client")
    assert "graph-materialization" in found(s)
    assert "graph-materialization" not in found(two_task_chain(Scenario()))  # 9 ms of 100


def test_inputs_fetched_from_another_worker_are_a_transfers_finding():
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    s.graph(10, 11, ["b-0"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 26)
    ask = s.message("worker-1", "worker-0", 30, 31, "get_data")
    s.message("worker-0", "worker-1", 45, 46, "reply")  # 14 ms serving, fetched over 28-47
    s.msgs[-1]["reply_to"] = ask
    s.task("b-0", "worker-1", 27, 28, 48, 58, 59, 60, deps=["a-0"], transfer=(28, 47))
    s.told("b-0", 61, 62)
    s.message("client", "scheduler", 62.5, 63, "close-client")
    summary = analyze(s.tables(), META).summary
    f = {f["id"]: f for f in summary["findings"]}["transfers"]
    moving = [v for k, v in summary["critical_path_parts_s"].items() if "get_data" in k or "inputs" in k]
    assert f["seconds"] == pytest.approx(sum(moving)) and f["seconds"] <= summary["session_s"]  # each part once
    assert "transfers" not in quiet_findings()


def test_p2p_rechunk_tasks_on_the_path_are_transfers_with_the_bytes_moved():
    """A rechunk's transfer task holds the path 30 ms while its data goes to the other worker by
    shuffle_receive: transfers, with the MB moved; the same chain with plain prefixes is not."""
    def chain(prefix: str) -> Scenario:
        s = Scenario()
        s.message("client", "scheduler", 9, 9.5, "register-client")
        s.graph(10, 11, ["b-0"])
        s.task(f"{prefix}-0", "worker-0", 12, 13, 14, 44, 45, 46)
        s.message("worker-0", "worker-1", 20, 40, "shuffle_receive")
        s.msgs[-1]["msg_bytes"] = 64_000_000
        s.task("b-0", "worker-1", 47, 48, 49, 51, 52, 53, deps=[f"{prefix}-0"])
        s.told("b-0", 54, 55)
        s.message("client", "scheduler", 55.5, 56, "close-client")
        return s
    f = found(chain("rechunk-transfer"))["transfers"]
    assert f["seconds"] >= 0.03 and "shuffle_receive 64 MB in 1 messages" in f["evidence"], f
    assert "transfers" not in found(chain("crunch"))


def test_a_slow_wire_is_a_network_finding():
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 45)  # task-finished 20 ms on the wire
    s.told("a-0", 46, 47)
    s.message("client", "scheduler", 47.5, 48, "close-client")
    assert next(iter(found(s))) == "network"
    assert "network" not in found(two_task_chain(Scenario()))  # 6 ms of 100


def test_idle_workers_behind_a_busy_scheduler_are_scheduler_bound():
    s = short_session(Scenario())
    for t in range(12, 66, 2):  # the scheduler's loop busy in its own work the whole job
        s.sample("scheduler", t, "SchedulerState._transition_waiting_processing")
    s.task("c-0", "worker-1", 62, 62.5, 63, 63.5, 63.7, 64)  # worker-1 held one task for 2 ms
    assert "scheduler-bound" in found(s)
    assert "scheduler-bound" not in quiet_findings()


def gil_bound_tasks(waits: bool) -> Scenario:
    """The chain's two tasks run by worker-0's task thread (tid 201, ident 7), which waits for the GIL
    for 8 of each task's 10 ms when `waits`."""
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    s.graph(10, 11, ["b-1"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 26, thread=7)
    s.task("b-1", "worker-0", 27, 28, 29, 39, 40, 41, deps=["a-0"], thread=7)
    s.told("b-1", 42, 43)
    s.message("client", "scheduler", 43.5, 44, "close-client")
    for t in (15, 20, 30, 35):
        s.sample("worker-0", t, "crunch", "/home/me/flow.py", tid=201, name="Dask-Default-Threads-0", ident=7)
    if waits:
        s.state("worker-0", "gil", 15, 23, tid=201)
        s.state("worker-0", "gil", 30, 38, tid=201)
    return s


def test_task_threads_waiting_for_the_gil_are_named_first_not_counted_as_compute():
    meta = META | {"cluster": {"workers": 1, "threads": 4}}
    summary = analyze(gil_bound_tasks(True).tables(), meta).summary
    first = summary["findings"][0]
    assert first["id"] == "task-gil" and "threads_per_worker=1" in first["advice"], first
    assert summary["critical_path_s"]["gil_contention"] == pytest.approx(0.016)
    assert summary["critical_path_s"]["compute"] == pytest.approx(0.004)
    quiet = analyze(gil_bound_tasks(False).tables(), meta).summary
    assert "task-gil" not in {f["id"] for f in quiet["findings"]}
    assert quiet["critical_path_s"]["compute"] == pytest.approx(0.020)


def test_event_loops_waiting_for_the_gil_among_waiting_tasks_are_task_gils_not_the_hot_functions():
    """Task threads queue for each other's GIL and the worker's loop queues with them (4 ms on the path):
    the loop's waits count for task-gil, which comes first; without the tasks' waits they are the hot
    function's."""
    def run(waits: bool) -> dict:
        s = gil_bound_tasks(waits)
        for t in (16, 17, 18, 19, 21, 22, 31, 32, 33, 34, 36, 37):
            s.sample("worker-0", t, "crunch", "/home/me/flow.py", tid=201, name="Dask-Default-Threads-0", ident=7)
        for t0, t1 in ((13, 14), (24, 25), (28, 29), (39, 40)):
            s.state("worker-0", "gil", t0, t1)
        return analyze(s.tables(), META | {"cluster": {"workers": 1, "threads": 4}}).summary["findings"]
    f = run(True)
    by = {x["id"]: x for x in f}
    assert f[0]["id"] == "task-gil" and by["task-gil"]["seconds"] == pytest.approx(0.016 + 0.004), f
    assert "and the workers' event loops" in by["task-gil"]["evidence"]
    assert "gil-contention" not in by and "event loops" not in by.get("hot-function", {}).get("evidence", ""), f
    alone = {x["id"]: x for x in run(False)}
    assert "task-gil" not in alone and "event loops waited" in alone["hot-function"]["evidence"], alone


def test_tasks_waiting_for_the_gil_of_a_thread_that_runs_no_task_name_that_thread():
    """A thread of the user's spins in pure Python in the worker: the tasks' GIL waits are its doing,
    and more processes for the tasks is not the advice."""
    meta = META | {"cluster": {"workers": 1, "threads": 4}}
    s = gil_bound_tasks(True)
    for t in range(15, 39):
        s.sample("worker-0", t + 0.5, "spin", "/home/me/monitor.py", tid=301, name="progress-monitor")
    first = analyze(s.tables(), meta).summary["findings"][0]
    assert first["id"] == "task-gil" and "runs no task" in first["title"], first
    assert "'progress-monitor' of worker-0, in spin (monitor.py:1)" in first["evidence"]
    assert "threads_per_worker=1" not in first["advice"]


def test_gil_advice_never_asks_for_one_thread_per_worker_where_there_is_one():
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, 20, 40, 41)  # task-finished leaves 20 ms after the compute
    s.told("a-0", 42, 43)
    s.message("client", "scheduler", 43.5, 44, "close-client")
    s.state("worker-0", "gil", 20, 39)  # meanwhile worker-0's loop waited for the GIL
    advice = {threads: next(f["advice"] for f in analyze(s.tables(), META | {"cluster": {"workers": 2,
                                                                                          "threads": threads}})
                           .summary["findings"] if f["id"] == "gil-contention") for threads in (1, 4)}
    assert "one thread each" not in advice[1] and "more worker processes" not in advice[1]
    assert "more worker processes" in advice[4]


def fan_out(durations: list[float]) -> Scenario:
    """Independent tasks x-0... of the given compute ms, two at a time on two workers, all asked for."""
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    keys = [f"x-{i}" for i in range(len(durations))]
    s.graph(10, 11, keys)
    free = {"worker-0": 12.0, "worker-1": 12.0}
    for key, d in zip(keys, durations):
        w = min(free, key=free.get)
        t = free[w]
        s.task(key, w, t, t + 0.5, t + 1, t + 1 + d, t + 1.5 + d, t + 2 + d)
        s.told(key, t + 2.5 + d, t + 3 + d)
        free[w] = t + 3 + d
    end = max(free.values())
    s.message("client", "scheduler", end + 0.5, end + 1, "close-client")
    return s


def test_a_straggler_is_named_with_its_key_worker_and_its_prefixs_median():
    f = found(fan_out([2, 2, 2, 2, 2, 2, 2, 60]))["straggler"]
    assert "x-7" in f["evidence"] and "against a median of 0.002 s" in f["evidence"], f
    assert "straggler" not in found(fan_out([10] * 8))  # even tasks: nothing straggles
    assert "straggler" not in found(fan_out([2, 2, 60]))  # too few of the kind to call one typical


def test_the_tasks_hot_function_is_named_with_its_file_and_line():
    s = gil_bound_tasks(False)
    for t in (16, 17, 18, 19, 21, 22, 31, 32, 33, 34, 36, 37):
        s.sample("worker-0", t, "crunch", "/home/me/flow.py", tid=201, name="Dask-Default-Threads-0", ident=7)
    f = found(s)["hot-function"]
    assert "crunch (flow.py:1)" in f["evidence"] and "crunch" in f["advice"], f
    s = gil_bound_tasks(False)
    for t in (16, 17, 18, 19, 21, 22, 31, 32, 33, 34, 36, 37):  # in a library's code only: not the user's
        s.sample("worker-0", t, "dot", "/venv/lib/python3.11/site-packages/numpy/core/numeric.py", tid=201,
                 name="Dask-Default-Threads-0", ident=7)
    assert "hot-function" not in found(s)


def test_a_hot_function_in_compiled_code_is_not_told_to_vectorize():
    """The same samples with the GIL released (numpy's sort running under the user's line): the
    function is named, and the advice does not ask for what it already does."""
    s = gil_bound_tasks(False)
    for t in (16, 17, 18, 19, 21, 22, 31, 32, 33, 34, 36, 37):
        s.sample("worker-0", t, "summarize", "/home/me/flow.py", tid=201, name="Dask-Default-Threads-0", ident=7,
                 owns_gil=False)
    f = found(s)["hot-function"]
    assert "compiled code called from summarize" in f["title"] and "vectorize it" not in f["advice"], f
    assert "held the GIL in 0%" in f["evidence"]


def test_event_loops_waiting_for_the_gil_of_tasks_running_python_are_the_hot_functions_cost():
    """The worker's loop waits for the GIL around each task (4 ms on the path) while its task thread
    runs the user's Python: one cause, the function; with the GIL released in it, the loop's waits are
    another's (a gil-contention finding of their own)."""
    def run(python: bool) -> dict:
        s = gil_bound_tasks(False)
        for t in (16, 17, 18, 19, 21, 22, 31, 32, 33, 34, 36, 37):
            s.sample("worker-0", t, "crunch", "/home/me/flow.py", tid=201, name="Dask-Default-Threads-0", ident=7,
                     owns_gil=python)
        for t0, t1 in ((13, 14), (24, 25), (28, 29), (39, 40)):
            s.state("worker-0", "gil", t0, t1)  # the main thread: the event loop
        return found(s)
    f, compiled = run(True), run(False)
    assert "gil-contention" not in f and "event loops waited" in f["hot-function"]["evidence"], f
    assert f["hot-function"]["seconds"] == pytest.approx(compiled["hot-function"]["seconds"] + 0.004)
    assert "gil-contention" in compiled


def test_task_threads_blocked_in_their_own_io_are_named_with_where_they_blocked():
    """Each task's thread is blocked 8 of its 10 ms (a socket read): a finding of its own, naming the
    call; the same tasks on a CPU throughout get none."""
    def run(blocked: bool) -> dict:
        s = gil_bound_tasks(False)
        if blocked:
            for t0, t1 in ((15, 23), (30, 38)):
                s.state("worker-0", "blocked", t0, t1, tid=201)
                s.sample("worker-0", t0 + 1, "recv_into", "/usr/lib/python3.11/socket.py", tid=201,
                         name="Dask-Default-Threads-0", ident=7, active=False, owns_gil=False)
        return found(s, META | {"cpus": 2, "cluster": {"workers": 1, "threads": 1}})
    f = run(True)["blocked-tasks"]
    assert f["seconds"] == pytest.approx(0.016) and "recv_into (socket.py:1) 2 samples" in f["evidence"], f
    assert "more threads per worker" in f["advice"]
    assert "worker-saturation" not in run(True), "its threads were blocked: more threads would help"
    assert "blocked-tasks" not in run(False)


def test_torn_frames_are_nobodys_code():
    """A frame read while it changed: a function name as its file and a line of -2110975246."""
    s = gil_bound_tasks(False)
    for t in (16, 17, 18, 19, 21, 22, 31, 32, 33, 34, 36, 37):
        s.sample("worker-0", t, "device", "dtype", tid=201, name="Dask-Default-Threads-0", ident=7)
    tables = s.tables()
    tables["frames"].loc[tables["frames"].function == "device", "line"] = -2110975246
    assert "hot-function" not in {f["id"] for f in analyze(tables, META).summary["findings"]}


def client_between(file: str) -> Scenario:
    """Two computations 1 s apart; in between, the client's main thread runs code in `file`."""
    s = Scenario()
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 26)
    s.told("a-0", 27, 28)
    for t in range(40, 1020, 20):
        s.sample("client", t, "build", file)
    s.graph(1028, 1029, ["b-0"])
    s.task("b-0", "worker-1", 1030, 1031, 1032, 1042, 1043, 1044)
    s.told("b-0", 1045, 1046)
    return s


def test_the_clients_time_in_dasks_graph_building_is_told_apart_from_its_own_code():
    ids = list(found(client_between("/venv/lib/python3.11/site-packages/dask/highlevelgraph.py")))
    assert ids[0] == "client-graph" and "client" not in ids, ids
    ids = list(found(client_between("/home/me/flow.py")))
    assert ids[0] == "client" and "client-graph" not in ids, ids
    s = client_between("/home/me/flow.py")  # the main thread waits while the client's event loop works
    for smp in s.samples:
        smp["active"] = False
    for t in range(40, 1020, 20):
        s.sample("client", t, "dumps", "/venv/lib/python3.11/site-packages/distributed/protocol/core.py", tid=401)
    assert list(found(s))[0] == "client-graph"


def test_data_carried_in_the_graph_is_named_and_fewer_tasks_is_not_advised():
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    s.graph(10, 11, ["a-0"])
    s.graphs[-1]["msg_bytes"] = 50_000_000  # one task carrying 50 MB
    s.task("a-0", "worker-0", 40, 41, 42, 52, 55, 56)
    s.told("a-0", 57, 58)
    s.message("client", "scheduler", 58.5, 59, "close-client")
    ids = found(s)
    assert "data-in-graph" in ids and "graph-materialization" not in ids, list(ids)
    assert "job 0's graphs were 50 MB for 1 tasks" in ids["data-in-graph"]["evidence"]
    s.graphs[-1]["msg_bytes"] = 100
    assert "data-in-graph" not in found(s)


def test_the_clients_dask_share_is_data_in_graphs_when_its_graphs_carry_data():
    """Between two computations the client's main thread runs its own code two thirds of the time and
    waits the rest while its event loop serializes: the client finding counts all of it, unless the graphs
    carried data (the second: 50 MB for one task), where data-in-graph holds the Dask third."""
    s = client_between("/home/me/flow.py")
    for smp in s.samples[::3]:  # the main thread waits ...
        smp["active"] = False
        s.sample("client", smp["t_ns"] / MS, "dumps", "/venv/lib/python3.11/site-packages/distributed/protocol/core.py",
                 tid=401)  # ... while the loop serializes
    whole = found(s)["client"]
    s.graphs[-1]["msg_bytes"] = 50_000_000
    carried = found(s)
    assert "data-in-graph" in carried and "client-graph" not in carried
    assert carried["client"]["seconds"] == pytest.approx(whole["seconds"] * 32 / 49, rel=0.01), (whole, carried)
    assert "counted under data-in-graph" in carried["client"]["evidence"]
    assert "counted under data-in-graph" not in whole["evidence"]


def test_update_graphs_batched_in_one_message_count_its_bytes_once():
    """100 client.submit calls leave in one 1.6 MB message: 16 kB per task, not 1.6 MB."""
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    s.graph(10, 11, ["a-0"])
    for i in range(1, 100):
        s.graphs.append(s.graphs[0] | {"keys": [f"a-{i}"], "graph_id": i})
    for g in s.graphs:
        g["msg_bytes"] = 1_600_000  # the one message's bytes, on each graph it carried
    for i in range(100):
        s.task(f"a-{i}", "worker-0", 40 + i, 41 + i, 42 + i, 42.5 + i, 43 + i, 44 + i)
        s.told(f"a-{i}", 45 + i, 45.5 + i)
    s.message("client", "scheduler", 146, 147, "close-client")
    assert analyze(s.tables(), META).summary["jobs"][0]["graph_bytes"] == 1_600_000
    assert "data-in-graph" not in found(s)


def test_aot_is_over_the_jobs_makespans_not_the_clients_time_between_them():
    summary = analyze(client_between("/home/me/flow.py").tables(), META).summary
    jobs = sum(j["makespan_s"] for j in summary["jobs"])
    assert summary["aot_s"] == pytest.approx(jobs / summary["tasks"])
    assert summary["aot_s"] < summary["makespan_s"] / summary["tasks"] / 10  # 1 s of client time left out


def worker_loop_runs(frames: list[tuple[str, str]], active: bool = True, stop: float = 24) -> Scenario:
    """One task computing until `stop` ms whose task-finished leaves worker-0 at 60 ms, while worker-0's
    loop runs (or, not active, is blocked in) a stack of (function, file) frames, innermost first."""
    s = Scenario()
    s.message("client", "scheduler", 9, 9.5, "register-client")
    s.graph(10, 11, ["a-0"])
    s.task("a-0", "worker-0", 12, 13, 14, stop, 60, 61)
    s.told("a-0", 62, 63)
    s.message("client", "scheduler", 63.5, 64, "close-client")
    for t in range(int(stop) + 1, 59, 2):
        s.sample_stack("worker-0", t, frames, active=active)
    return s


DASK_LOOP = [("handle_stream", "/venv/lib/python3.11/site-packages/distributed/core.py"),
             ("_run", "/usr/lib/python3.11/asyncio/events.py")]


def test_module_imports_inside_a_job_are_a_cold_start_naming_the_module():
    f = found(worker_loop_runs([("<module>", "/venv/lib/python3.11/site-packages/pandas/core/frame.py"),
                                ("_find_and_load", "<frozen importlib._bootstrap>"),
                                ("<module>", "/venv/lib/python3.11/site-packages/pandas/__init__.py"),
                                ("_find_and_load", "<frozen importlib._bootstrap>"), *DASK_LOOP]))["cold-start"]
    assert "worker-0" in f["evidence"] and "pandas" in f["evidence"] and "preload" in f["advice"], f
    assert "cold-start" not in found(worker_loop_runs(DASK_LOOP))


def test_spilling_on_the_path_is_named_per_worker():
    f = found(worker_loop_runs([("write", "/venv/lib/python3.11/site-packages/zict/file.py"),
                                ("__setitem__", "/venv/lib/python3.11/site-packages/distributed/spill.py"),
                                *DASK_LOOP]))["spilling"]
    assert "worker-0" in f["evidence"] and "memory" in f["advice"], f
    assert "spilling" not in found(worker_loop_runs(DASK_LOOP))


def test_the_users_code_on_an_event_loop_is_named_with_its_function():
    f = found(worker_loop_runs([("slow_transition", "/home/me/plugin.py"), *DASK_LOOP]))["event-loop-blocked"]
    assert "slow_transition (plugin.py:1)" in f["evidence"] and "run_in_executor" in f["advice"], f
    assert "event-loop-blocked" not in found(worker_loop_runs(DASK_LOOP))
    ours = str(Path(evidence.__file__).parent.parent / "tracer" / "capture" / "peer_guard.py")  # daskprobe's preload: not yours
    assert "event-loop-blocked" not in found(worker_loop_runs([("_handle_stream", ours), *DASK_LOOP]))
    blocked = worker_loop_runs([("sleep", "/usr/lib/python3.11/time.py"), ("slow_transition", "/home/me/plugin.py"),
                                *DASK_LOOP], active=False)  # a blocking call in a plugin: off a CPU
    assert "slow_transition (plugin.py:1)" in found(blocked)["event-loop-blocked"]["evidence"]


def test_a_stragglers_why_names_its_threads_waits_and_its_inputs():
    s = fan_out([2, 2, 2, 2, 2, 2, 2, 60])
    slow = s.attempts[-1]
    slow["thread"], slow["transfer_start_ns"], slow["transfer_stop_ns"] = 7, slow["compute_recv_ns"], \
        slow["compute_recv_ns"] + 20_000_000  # 20 ms fetching its inputs
    start = slow["compute_start_ns"] / 1e6
    s.sample(slow["worker"], start + 1, "work", "/home/me/flow.py", tid=201, ident=7)
    s.state(slow["worker"], "gil", start, start + 30, tid=201)
    f = found(s)["straggler"]
    assert "fetching its inputs 0.02 s first" in f["evidence"] and "waiting for the GIL 50%" in f["evidence"], f


def test_tasks_whose_samples_show_no_code_of_the_users_give_an_empty_profile():
    """Compute samples in library code only: the profile is empty, not a failed analysis."""
    s = gil_bound_tasks(False)
    s.samples = [smp for smp in s.samples if smp["tid"] != 201]
    for t in (16, 17, 31, 32):
        s.sample("worker-0", t, "dot", "/venv/lib/python3.11/site-packages/numpy/core/numeric.py", tid=201,
                 name="Dask-Default-Threads-0", ident=7)
    result = analyze(s.tables(), META)
    assert result.tables["compute_profile"].empty and "hot-function" not in found(s)


def test_a_busy_threads_gil_waits_are_the_gil_findings_not_saturations_too():
    """b-0 waits for the thread a-0 holds, and a-0's thread waits for the GIL most of that time: those
    seconds are task-gil's, and worker-saturation counts only the rest."""
    s = Scenario()
    s.graph(0, 1, ["a-0", "b-0"])
    s.task("a-0", "worker-0", 2, 3, 4, 54, 55, 56, thread=7)
    s.task("b-0", "worker-0", 2, 3, 54, 64, 65, 66, thread=7)
    s.told("a-0", 57, 58)
    s.told("b-0", 67, 68)
    s.sample("worker-0", 10, "crunch", "/home/me/flow.py", tid=201, ident=7)
    s.state("worker-0", "gil", 5, 50, tid=201)
    f = found(s)
    assert "task-gil" in f
    assert f.get("worker-saturation", {"seconds": 0})["seconds"] + f["task-gil"]["seconds"] <= \
        analyze(s.tables(), META).summary["session_s"] + 1e-9


def test_cpu_starvation_says_when_the_cpus_went_to_work_outside_the_cluster():
    s = short_session(Scenario())
    s.state("scheduler", "runnable", 36, 44)
    summary = analyze(s.tables(), META | {"cpus": 2}).summary
    starved = next(f for f in summary["findings"] if f["id"].startswith("cpu-"))
    assert "other work" not in starved["title"], "no /proc figures: nothing said of other work"
    from daskprobe.analyzers.findings import findings
    tables = s.tables() | {"cpu_samples": None}
    for used, outside in ((0.01, True), (0.2, False)):  # the cluster's CPU over the makespan, of 2 CPUs
        summary["cpu_check"] = {"scheduler": {"proc_s": used}}
        starved = next(f for f in findings(summary, tables, META | {"cpus": 2}) if f["id"].startswith("cpu-"))
        assert ("other work" in starved["title"]) == outside, (used, starved)


def test_fewer_threads_is_advised_only_where_the_tasks_outnumbered_the_cpus():
    """The scheduler waits 8 ms for a CPU: with 3 tasks computing at once for 20 ms on 2 CPUs that is too
    many busy threads; with 2 at a time the CPUs went to Dask's own work."""
    import pandas as pd
    from daskprobe.analyzers.findings import findings
    s = short_session(Scenario())
    s.state("scheduler", "runnable", 36, 44)
    summary = analyze(s.tables(), META | {"cpus": 2}).summary
    summary["cpu_check"] = {"scheduler": {"proc_s": 0.2}}

    def ids(at_once: int) -> dict:
        spans = pd.DataFrame({"compute_start_ns": [30_000_000] * at_once, "compute_stop_ns": [50_000_000] * at_once})
        return {f["id"]: f for f in findings(summary, s.tables() | {"cpu_samples": None, "tasks": spans},
                                             META | {"cpus": 2})}
    assert "cpu-starvation" in ids(3) and "cpu-contention" not in ids(3)
    assert "cpu-starvation" not in ids(2)
    assert "Dask's own" in ids(2)["cpu-contention"]["title"]


def test_cpus_busy_with_threads_python_never_saw_in_a_worker_are_a_librarys_pool():
    """The scheduler waits 8 ms for a CPU while 2 tasks compute on 2 CPUs. The eBPF samples meanwhile: the
    task thread twice, and five of a worker's threads that no Python thread state names (BLAS's pool) ->
    library-threads; were those Dask's own Python threads of that worker, cpu-contention."""
    import pandas as pd
    from daskprobe.analyzers.findings import findings
    s = short_session(Scenario())
    s.state("scheduler", "runnable", 36, 44)
    a = analyze(s.tables(), META | {"cpus": 2})
    a.summary["cpu_check"] = {"scheduler": {"proc_s": 0.2}}
    spans = a.tables["tasks"].assign(compute_start_ns=30 * MS, compute_stop_ns=50 * MS)  # both at once
    ebpf = pd.DataFrame({"t_ns": [t * MS for t in range(37, 44)], "pid": 200,
                         "tid": [201, 250, 251, 250, 201, 251, 250], "source": "ebpf"})

    def ids(python_idents, environ=None) -> dict:
        threads = pd.DataFrame({"pid": 200, "tid": [200, 201, 250, 251], "ident": [1, 7, *python_idents]})
        t = s.tables() | a.tables | {"samples": ebpf, "tasks": spans, "threads": threads,
                                     "attempt_threads": pd.DataFrame({"tid": [201]})}
        meta = META | {"cpus": 2} | ({"cluster": {"worker_environ": environ}} if environ is not None else {})
        return {f["id"]: f for f in findings(a.summary, t, meta)}
    native = ids([None, None])
    assert "library-threads" in native and "cpu-contention" not in native
    assert "71% were worker threads Python never saw" in native["library-threads"]["evidence"]
    assert "OPENBLAS_NUM_THREADS" in native["library-threads"]["advice"]
    dasks = ids([2, 3])
    assert "cpu-contention" in dasks and "library-threads" not in dasks
    # the workers had one BLAS and OpenMP thread already (Dask's default): not told to set what they had
    ones = ids([None, None], {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                              "MALLOC_TRIM_THRESHOLD_": "65536"})["library-threads"]
    assert "set to 1" not in ones["advice"] and "another library's pool" in ones["advice"]
    assert "the workers started with OMP_NUM_THREADS=1" in ones["evidence"]
    # a user's environment that gave OpenMP four: that one is named, the others not
    four = ids([None, None], {"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    advice = four["library-threads"]["advice"]
    assert "(OMP_NUM_THREADS set to 1" in advice and "OPENBLAS_NUM_THREADS" not in advice


def test_an_event_loop_a_little_idle_with_no_code_of_the_users_is_no_finding():
    """Idle 10 of the 55 ms (18%): blocked loops without the user's code in their samples need a quarter."""
    assert "event-loop-blocked" not in found(worker_loop_runs(DASK_LOOP, active=False, stop=50))
    assert "event-loop-blocked" in found(worker_loop_runs(DASK_LOOP, active=False))  # 36 of 55 ms


def test_a_stragglers_advice_quotes_its_saving_and_a_hot_functions_has_none():
    """The straggler's advice is a change the what-if model replays (the key at its prefix's median);
    a faster function is not, and gets the reason instead of a number."""
    f = found(fan_out([2, 2, 2, 2, 2, 2, 2, 60]))["straggler"]
    assert f["what_if"] == {"at_median": ["x-7"]}
    # x-7 ends the path 58 ms over its prefix's 2 ms median: at the median the job ends 58 ms sooner
    assert f["saving"]["saving_s"] == pytest.approx(0.058) and f["saving"]["measured_s"] == pytest.approx(0.080)
    assert f["saving"]["makespan_s"] == pytest.approx(0.022)
    s = gil_bound_tasks(False)
    for t in (16, 17, 18, 19, 21, 22, 31, 32, 33, 34, 36, 37):
        s.sample("worker-0", t, "crunch", "/home/me/flow.py", tid=201, name="Dask-Default-Threads-0", ident=7)
    hot = found(s)["hot-function"]
    assert hot["what_if"] is None and set(hot["saving"]) == {"not_modelled"}
