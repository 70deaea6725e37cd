"""The what-if model on hand-made runs whose replay can be worked out by hand (times in ms).

The runs' costs, as the model reads them: every message is on the wire 1 ms; a worker takes 3 ms
from a compute's end to its task-finished, and to start a task, 1 ms from the later of its
compute-task's arrival and the end of the compute before it on its thread; the graph takes
the scheduler 9 ms (its last byte at 11, the first dispatch at 20); the scheduler's own time per
task is unknown (no thread states, no proc): 0."""

import numpy as np
import pandas as pd
import pytest

from daskprobe.analyzers.whatif import Changes, NotModelled, predict
from daskprobe.analyzers.whatif.capture import _graph_service
from daskprobe.tracer.commands.whatif_verb import changes, render

from scenario import META, Scenario, analyze, two_task_chain

MS = 1e-3
ONE = META | {"cluster": {"threads": 1}}  # one thread per worker


def tables(s: Scenario, workers: int = 2) -> dict:
    t = s.tables()
    t["processes"] = t["processes"][~t["processes"].name.isin([f"worker-{i}" for i in range(workers, 2)])]
    return t | analyze(t, META).tables


def fan_in() -> Scenario:
    """x-0..x-3 (10 ms each) one after the other on worker-0's one thread, then s-0 of all four."""
    s = Scenario()
    s.graph(10, 11, ["s-0"])
    for i in range(4):
        s.task(f"x-{i}", "worker-0", 20, 21, 22 + 10 * i, 32 + 10 * i, 35 + 10 * i, 36 + 10 * i)
    s.task("s-0", "worker-0", 70, 71, 72, 82, 85, 86, deps=[f"x-{i}" for i in range(4)])
    s.told("s-0", 90, 91)
    return s


def test_a_chain_replays_by_hand_and_adds_the_delay_once_per_message():
    t = tables(two_task_chain(Scenario()))
    p = predict(t, ONE, Changes(delay_ms=5))
    # graph: up 0-1, scheduler 1-10; a-0: wire 10-11, worker 11-12, compute 12-22, worker 22-25, wire 25-26;
    # b-1 (on a-0's worker): wire 26-27, worker 27-28, compute 28-38, worker 38-41, wire 41-42; told 42-43
    assert p["replay_s"] == pytest.approx(43 * MS)
    assert p["measured_s"] == pytest.approx(56 * MS)  # graph's first byte (10) to told's last (66)
    # six messages on the path, each 5 ms later
    assert p["makespan_s"] == pytest.approx(73 * MS)
    assert p["scaled_s"] == pytest.approx(73 * 56 / 43 * MS)  # scaled by measured / replayed
    assert p["offset_s"] == pytest.approx(86 * MS)


def test_a_chain_gains_nothing_from_a_second_worker():
    t = tables(two_task_chain(Scenario()), workers=1)
    p = predict(t, ONE, Changes(workers=2))
    assert p["makespan_s"] == pytest.approx(43 * MS) and p["scaled_s"] == pytest.approx(56 * MS)


def test_a_fan_in_on_two_workers_by_hand():
    t = tables(fan_in(), workers=1)
    same = predict(t, ONE, Changes())
    # Measured: x-0 and s-0 start 1 ms after they reach the worker, x-1..x-3 as the task before ends.
    # 4 x-tasks of one group on 1 thread are root-ish (more than 2 per thread): the scheduler sends 2
    # (ceil(1.1 x 1) slots), then one per task-finished. Thread: x-0 12-22, x-1 22-32, x-2 32-42,
    # x-3 42-52; x-3's finish leaves at 55, in at 56; s-0 out 56, in 57, computes 58-68, its finish in at
    # 72; told 73.
    assert same["replay_s"] == pytest.approx(73 * MS)
    assert same["scaled_s"] == pytest.approx(81 * MS)  # the run's own
    two = predict(t, ONE, Changes(workers=2))
    # 2 threads: no longer root-ish (4 is not more than 2 x 2); round robin then least occupied:
    # x-0, x-2 on worker-0 (12-22, 22-32) and x-1, x-3 on worker-1 (11-21, 21-31); x-2's finish in at 36;
    # s-0 to worker-0 (a tie, broken by order): in at 37, fetches x-1 and x-3 from worker-1 (request
    # 37-38, reply 38-39), computes 40-50, its finish in at 54, told at 55.
    assert two["makespan_s"] == pytest.approx(55 * MS)
    assert two["scaled_s"] == pytest.approx(55 * 81 / 73 * MS)
    # the path: s-0 <- x-2 <- the task that held its thread, x-0: three computes
    assert two["split_s"]["compute"] == pytest.approx(30 * MS)
    assert sum(two["split_s"].values()) == pytest.approx(two["makespan_s"])


def warm_start(one_worker: bool = False) -> Scenario:
    """Two workers (or one with two threads) run three 10 ms tasks each in a row, the first after a
    100 ms warm-up (imports): started at 122 though there at 21, the others as the one before ends."""
    s = Scenario()
    keys = [f"{chr(97 + i)}-0" for i in range(6)]  # a group each: none root-ish
    s.graph(10, 11, keys)
    for w in range(2):
        for k in range(3):
            start = 122 + 10 * k
            s.task(keys[3 * w + k], "worker-0" if one_worker else f"worker-{w}", 20, 21, start, start + 10,
                   start + 13, start + 14, thread=w + 1 if one_worker else 1)
            s.told(keys[3 * w + k], start + 15, start + 16)
    return s


def test_a_worker_warms_up_once_whatever_the_keys_it_runs():
    """Replayed: graph 0-1, scheduler 1-10, compute-task 10-11, warm-up and handoff 11-112, then the tasks
    in a row, the last told 6 ms after its compute ends. On one worker (or one thread) one warm-up and six
    tasks: 112 + 60 + 6 = 178 ms, not two warm-ups (278); on four workers each warms up, two run two."""
    two = tables(warm_start())
    assert predict(two, ONE, Changes())["replay_s"] == pytest.approx(148 * MS, abs=1.5 * MS)
    assert predict(two, ONE, Changes(workers=1))["makespan_s"] == pytest.approx(178 * MS, abs=1.5 * MS)
    assert predict(two, ONE, Changes(workers=4))["makespan_s"] == pytest.approx(138 * MS, abs=1.5 * MS)
    threads = tables(warm_start(one_worker=True), workers=1)
    assert predict(threads, META | {"cluster": {"threads": 2}}, Changes(threads=1))["makespan_s"] == \
        pytest.approx(178 * MS, abs=1.5 * MS)


def test_a_graph_whose_tasks_waited_for_a_slot_costs_the_scheduler_what_the_others_did():
    """A futures loop's three submits (last bytes at 0, 1, 2 ms): the first dispatched at 3 ms, the others
    each 0.5 ms after a task-finished freed a slot. Their wait is the slot's, which the replay queues
    itself: each costs the first's 3 ms. Task-finished 8 ms before the dispatches: their own 10 ms."""
    def service(freed_ms):
        ns = _graph_service(pd.Series([0.0, 1e6, 2e6]), pd.Series([3e6, 13e6, 23e6]), np.array(freed_ms) * 1e6)
        return [x / 1e6 for x in ns]
    assert service([12.5, 22.5]) == pytest.approx([3, 3, 3])
    assert service([5, 15]) == pytest.approx([3, 10, 10])


def test_fewer_scheduler_costs_never_cost_time_and_the_split_adds_up():
    t = tables(fan_in(), workers=1)
    out = [predict(t, ONE, Changes(workers=2, bookkeeping=k)) for k in (1.0, 0.0)]
    assert out[1]["makespan_s"] < out[0]["makespan_s"]
    for p in out:
        assert sum(p["split_s"].values()) == pytest.approx(p["makespan_s"])
        assert p["interval_s"][0] <= p["makespan_s"] <= p["interval_s"][1]


def test_what_is_not_modelled_is_refused():
    t = tables(two_task_chain(Scenario()))
    with pytest.raises(NotModelled, match="rsds is not modelled"):
        predict(t, ONE, Changes(runtime="rsds"))
    with pytest.raises(NotModelled, match="server-cmd"):
        predict(t, META | {"cluster": {"server_cmd": "rsds-scheduler"}}, Changes())


def test_a_sweep_is_every_combination_and_renders():
    class Args:
        workers, threads, delay_ms, network, decisions, bookkeeping, scheduler = [1, 2], [1, 2], None, [0.0], None, \
            None, None
        gil, runtime = "0", None
    made = changes(Args)
    assert len(made) == 4 and all(c.network == 0.0 and not c.gil for c in made)
    t = tables(two_task_chain(Scenario()))
    text = render([predict(t, ONE, c, samples=2) for c in made])
    assert "workers=1, threads=1, network=0.0, gil=0" in text and "measured makespan 0.056 s" in text


def test_a_graph_sent_after_a_result_follows_that_result_in_the_replay():
    """A futures loop on a worker with 2 threads: c-2 runs 30 ms beside a-0; the client sends b-1 3 ms
    after a-0 is told, while c-2 is still running (one job). With 5 ms links all after the first graph
    moves with a-0's telling."""
    s = Scenario()
    s.graph(10, 11, ["a-0", "c-2"])
    s.task("a-0", "worker-0", 20, 21, 22, 32, 35, 36)
    s.task("c-2", "worker-0", 20, 21, 22, 52, 55, 56, thread=2)
    s.told("a-0", 37, 38)
    s.graph(41, 42, ["b-1"])  # 3 ms after the telling
    s.task("b-1", "worker-0", 45, 46, 47, 57, 60, 61)
    s.told("c-2", 57, 58)
    s.told("b-1", 62, 63)
    t = tables(s, workers=1)
    t["tasks"]["key"] = t["tasks"].key.astype("str")  # as read from parquet
    p = predict(t, META | {"cluster": {"threads": 2}}, Changes(delay_ms=5))
    assert p["measured_s"] == pytest.approx(53 * MS)
    # unchanged: graph 0-1, scheduler to 10; a-0 out 10, in 11, computes 12-22, its finish out 25, in 26,
    # told 27; the client 3 ms, graph 30-31, scheduler 3 ms, b-1 out 34, in 35, computes 36-46, finish
    # out 49, in 50, told 51 (c-2 is told at 47)
    assert p["replay_s"] == pytest.approx(51 * MS)
    # 5 ms more on each of: graph, compute-task, task-finished, told, twice
    assert p["makespan_s"] == pytest.approx(91 * MS)


def test_two_threads_handed_their_tasks_at_once_are_one_handoff_of_the_loop():
    """a-0 and b-1 reach a worker of 2 threads together and start together 1 ms later: its one event
    loop handed both in that 1 ms. At one thread b-1 starts as a-0 ends, with no second handoff: the
    makespan grows by its compute alone (10 ms), not also by its wait for the loop."""
    s = Scenario()
    s.graph(10, 11, ["a-0", "b-1"])
    s.task("a-0", "worker-0", 20, 21, 22, 32, 35, 36)
    s.task("b-1", "worker-0", 20, 21, 22, 32, 35, 36, thread=2)
    s.told("a-0", 37, 38)
    s.told("b-1", 37, 38)
    t = tables(s, workers=1)
    meta = META | {"cluster": {"threads": 2}}
    two, one = predict(t, meta, Changes()), predict(t, meta, Changes(threads=1))
    assert two["makespan_s"] == pytest.approx(two["replay_s"])
    assert one["makespan_s"] - two["makespan_s"] == pytest.approx(10 * MS)


def test_a_finding_quotes_what_its_advice_would_save():
    from daskprobe.analyzers.whatif.advice import quote
    t = tables(fan_in(), workers=1)
    out = quote([{"id": "worker-saturation", "what_if": {"workers": 2}}, {"id": "hot-function", "what_if": None}],
                t, ONE, samples=2)
    # twice the workers: the fan-in by hand above, 73 ms replayed unchanged and 55 ms on two workers; the
    # saving is their difference, taken off the measured 81 ms
    s = out[0]["saving"]
    assert s["change"] == "2 worker(s)" and s["saving_s"] == pytest.approx(18 * MS)
    assert s["measured_s"] == pytest.approx(81 * MS) and s["makespan_s"] == pytest.approx(63 * MS)
    assert s["interval_s"][0] <= s["makespan_s"] <= s["interval_s"][1]
    # a faster function is not a change the model replays: why, and no number
    assert set(out[1]["saving"]) == {"not_modelled"} and "faster" in out[1]["saving"]["not_modelled"]


def test_advice_that_changes_nothing_saves_nothing_and_is_not_ranked():
    """A chain gains nothing from a second worker: the saving is 0 exactly (both replays use the same
    durations), though the model's replay of the run is 13 ms off it; it is not among the top predictions."""
    from daskprobe.analyzers.whatif.advice import quote, top
    out = quote([{"id": "worker-saturation", "what_if": {"workers": 2}}], tables(two_task_chain(Scenario()),
                                                                               workers=1), ONE, samples=3)
    s = out[0]["saving"]
    assert s["saving_s"] == 0 and s["makespan_s"] == pytest.approx(56 * MS) and s["replay_error"] < -0.2
    assert top(out) == []


def test_the_top_predictions_are_the_largest_savings_of_at_least_five_percent():
    from daskprobe.analyzers.whatif.advice import top
    found = [{"id": i, "saving": {"saving_s": v, "measured_s": 10.0}} for i, v in (("a", 0.4), ("b", 3.0), ("c", 0.6))]
    found.append({"id": "d", "saving": {"not_modelled": "why"}})
    assert [f["id"] for f in top(found)] == ["b", "c"]  # a: 4% of the makespan


def test_a_local_schedulers_findings_have_no_number():
    from daskprobe.analyzers.whatif.advice import quote
    (f,) = quote([{"id": "local-gil", "what_if": None}], {}, ONE, local=True)
    assert set(f["saving"]) == {"not_modelled"}


def test_root_tasks_wait_for_a_slot_unless_the_scheduler_is_random():
    """4 tasks of 1 ms, shorter than a round trip to the scheduler: Dask's queuing costs time here."""
    s = Scenario()
    s.graph(10, 11, ["s-0"])
    for i in range(4):
        s.task(f"x-{i}", "worker-0", 20, 21, 22 + i, 23 + i, 26 + i, 27 + i)
    s.task("s-0", "worker-0", 40, 41, 42, 43, 46, 47, deps=[f"x-{i}" for i in range(4)])
    s.told("s-0", 48, 49)
    t = tables(s, workers=1)
    ws, random = (predict(t, ONE, Changes(scheduler=p)) for p in ("ws", "random"))
    # ws: x-0, x-1 out at 10 (2 slots), in 11, compute 12-13 and 13-14, finishes out 16 and 18 (batched), in
    # 17 and 19; x-2 out 17, computes 18-19, in 23; x-3 out 22 (the stream sent at 17), computes 23-24,
    # in 28; s-0 out 28, computes 30-31, in 35, told 36
    assert ws["replay_s"] == pytest.approx(36 * MS)
    # random: all four out at 10, compute 12-16 back to back; x-3's finish in at 21; s-0 computes 23-24,
    # in 28, told 29
    assert random["makespan_s"] == pytest.approx(29 * MS)


def test_a_one_thread_workers_waits_for_a_gil_no_task_held_are_replayed_and_gil_0_removes_them():
    """a-0 then b-1 on worker-0's one task thread (tid 201), each waiting 8 of its 10 ms for the GIL: held
    by no task (there is no other), so by a thread beside them. The replay keeps the waits as measured; no
    waits for the GIL saves them, 16 ms."""
    s = Scenario()
    s.graph(10, 11, ["b-1"])
    s.task("a-0", "worker-0", 12, 13, 14, 24, 25, 26, thread=7)
    s.task("b-1", "worker-0", 27, 28, 29, 39, 40, 41, deps=["a-0"], thread=7)
    s.told("b-1", 42, 43)
    for at in (15, 20, 30, 35):
        s.sample("worker-0", at, "crunch", "/home/me/flow.py", tid=201, name="Dask-Default-Threads-0", ident=7)
    s.state("worker-0", "gil", 15, 23, tid=201)
    s.state("worker-0", "gil", 30, 38, tid=201)
    p = predict(tables(s, workers=1), ONE, Changes(gil=False), samples=2)
    assert p["split_s"]["gil_contention"] == 0 and p["saving_s"] == pytest.approx(16 * MS)
    same = predict(tables(s, workers=1), ONE, Changes(), samples=2)
    assert same["split_s"]["gil_contention"] == pytest.approx(16 * MS)


def test_the_terminal_and_the_report_show_the_top_predictions_and_say_what_has_no_number():
    import io
    from rich.console import Console
    from daskprobe.dashboards.html_report import findings_section
    from daskprobe.dashboards.terminal import print_summary
    saved = {"change": "4 worker(s), 1 thread(s) each", "measured_s": 6.7, "makespan_s": 4.1,
             "interval_s": [3.8, 4.5], "saving_s": 2.6}
    found = [{"id": "task-gil", "title": "tasks waited for the GIL", "seconds": 3.0, "share": 0.4, "evidence": "e",
              "advice": "a", "saving": saved},
             {"id": "hot-function", "title": "hot", "seconds": 2.0, "share": 0.3, "evidence": "e", "advice": "a",
              "saving": {"not_modelled": "a faster function"}},
             {"id": "network", "title": "wire", "seconds": 1.0, "share": 0.15, "evidence": "e", "advice": "a",
              "saving": saved | {"makespan_s": 6.6, "saving_s": 0.1}}]  # 1.5% of the makespan: not shown
    out = io.StringIO()
    print_summary({"session_s": 7.0, "makespan_s": 6.7, "tasks": 10, "dispatches": 10, "aot_s": 0.67,
                   "critical_path_s": {"compute": 7.0}, "findings": found}, Console(file=out, width=200))
    table = out.getvalue().split("what the advice would save")[1]
    assert "task-gil" in table and "6.70 -> 4.10" in table and "3.80-4.50" in table and "network" not in table
    page = findings_section({"findings": found})
    assert page.count("&rarr; 4.10 s") == 2  # the table's row and the finding's own line
    assert "no number: a faster function" in page


def test_without_thread_states_more_cores_has_no_number_rather_than_none_saved():
    """The fan-in has no eBPF thread states: the replay has no contention for cores, so twice the cores
    would save 0 there, wrongly. It says why instead."""
    from daskprobe.analyzers.whatif.advice import quote
    (f,) = quote([{"id": "worker-saturation", "what_if": {"cores": 4}}], tables(fan_in(), workers=1), ONE)
    assert set(f["saving"]) == {"not_modelled"} and "thread states" in f["saving"]["not_modelled"]


def _cluster(own_ms: float, starved_ms: float) -> tuple[list, dict]:
    """A 100 ms job on two workers whose tasks computed `own_ms` and waited `starved_ms` for a CPU, in a
    cluster whose processes' CPU clocks say each ran 40 ms (scheduler and workers) and whose threads
    waited 60 ms for a CPU each: the machine's rate 0.4, the workers' own work beside the tasks'
    (40 + 60) * 2 - own - starved ms."""
    from types import SimpleNamespace
    ms = 1_000_000
    job = SimpleNamespace(own_ns=np.array([own_ms * ms]), starved_ns=np.array([starved_ms * ms]), measured_ns=100 * ms,
                          gil_ns=np.zeros(1), blocked_ns=np.zeros(1), start_ns=np.zeros(1))
    names = ["scheduler", "worker-0", "worker-1"]
    t = {"processes": pd.DataFrame({"pid": [1, 2, 3], "name": names, "role": ["scheduler", "worker", "worker"],
                                    "host": "local"}),
         "proc": pd.DataFrame({"t_ns": [0, 200 * ms] * 3, "process": np.repeat(names, 2), "cpu_s": [0.0, 0.08] * 3}),
         "thread_states": pd.DataFrame({"pid": [1, 2, 3, 2], "host": "local", "start_ns": [0, 0, 0, 40 * ms],
                                        "end_ns": [60 * ms, 60 * ms, 60 * ms, 90 * ms],
                                        "state": ["runnable", "runnable", "runnable", "blocked"]})}
    return [job], t


def test_no_op_tasks_read_the_machine_s_load_from_the_whole_cluster_s_threads():
    # Tasks that wanted no CPU cannot say how loaded the CPUs were: the runtime's threads can (they ran
    # 120 ms and waited 180: a rate of 0.4, as processor sharing would give 5 threads' worth on 2 cores).
    from daskprobe.analyzers.whatif.predict import _background, _workers_share
    jobs, t = _cluster(own_ms=1, starved_ms=0)
    load, rate = _background(jobs, 2, t, [(0, 100_000_000)])
    assert rate == pytest.approx(0.4) and load == pytest.approx(2 / 0.4 - 0.01)
    # of that load, the workers' own work: (40 + 60) * 2 - 1 ms in 100 ms
    assert _workers_share(jobs, t, [(0, 100_000_000)], load) == pytest.approx(1.99 / load)
    # tasks that did want a CPU say it themselves: half their time waiting, a rate of 0.5
    jobs, t = _cluster(own_ms=50, starved_ms=50)
    assert _background(jobs, 2, t, [(0, 100_000_000)]) == pytest.approx((2 / 0.5 - 1.0, 0.5))


def test_the_load_is_read_while_the_tasks_wanted_a_cpu_not_over_their_pauses():
    # Two tasks of 50 ms each, together in the first half of a 100 ms job, each waiting half of it for a
    # CPU (a rate of 0.5 on 2 cores): 4 threads' worth wanted a CPU while they ran, 2 of them the tasks'.
    # Over the whole job they wanted 1 CPU on average: that would read a load of 3.
    from types import SimpleNamespace
    from daskprobe.analyzers.whatif.predict import _background
    ms = 1_000_000
    job = SimpleNamespace(own_ns=np.array([25, 25]) * ms, starved_ns=np.array([25, 25]) * ms,
                          gil_ns=np.zeros(2), blocked_ns=np.zeros(2), start_ns=np.zeros(2), measured_ns=100 * ms)
    assert _background([job], 2, {}, [(0, 100 * ms)]) == pytest.approx((2.0, 0.5))


def test_the_workers_share_of_the_load_grows_and_shrinks_with_their_count():
    from types import SimpleNamespace
    from daskprobe.analyzers.whatif.predict import _load
    m = SimpleNamespace(background=2.0, workers_share=0.5, costs=SimpleNamespace(workers=["worker-0", "worker-1"]))
    assert _load(m, Changes()) == 2.0
    assert _load(m, Changes(workers=4)) == pytest.approx(3.0)  # the workers' 1 core doubles
    assert _load(m, Changes(workers=1)) == pytest.approx(1.5)
    assert _load(m, Changes(workers=4, load=0)) == 0.0  # a quiet machine: none of it
