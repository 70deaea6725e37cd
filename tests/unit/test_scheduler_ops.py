"""The scheduler's load by op (analyzers/scheduler_ops.py): a sample is charged to the op whose handler
Dask's dispatcher called, replies to the op they answer, administrative ops named as such."""

import pandas as pd

from daskprobe.analyzers.scheduler_ops import DISPATCHING, OUTSIDE, handler_op, scheduler_ops

LOOP = ["Handle._run", "BaseEventLoop._run_once"]


def test_a_sample_is_its_handlers_op():
    ops = {"task-finished", "heartbeat_worker", "register-worker"}
    finished = ["SchedulerState._transition", "Scheduler.stimulus_task_finished", "Scheduler.handle_task_finished",
                "Server.handle_stream", "Scheduler.handle_worker", "Scheduler.add_worker", "Server._handle_comm", *LOOP]
    assert handler_op(finished, ops) == "task-finished", "the innermost dispatcher's handler, not add_worker"
    assert handler_op(["Scheduler.heartbeat_worker", "Server._handle_comm", *LOOP], ops) == "heartbeat_worker"
    wrapped = ["Scheduler.update_graph", "_LogErrors.__call__.<locals>.wrapper", "Server.handle_stream", *LOOP]
    assert handler_op(wrapped, ops | {"update-graph"}) == "update-graph", "through a decorator's wrapper"
    assert handler_op(["read_bytes_rw", "TCP.read", "Server.handle_stream", *LOOP], ops) == DISPATCHING
    assert handler_op(["IOStream.write_to_fd", *LOOP], ops) == OUTSIDE
    assert handler_op(["Scheduler.add_worker", "Server._handle_comm", *LOOP], ops) == "register-worker"


def test_rows_by_op():
    msgs = pd.DataFrame({
        "msg_id": [1, 2, 3, 4, 5], "src": ["worker-0", "scheduler", "worker-1", "scheduler", "worker-0"],
        "dst": ["scheduler", "worker-0", "scheduler", "worker-1", "worker-1"],
        "op": ["heartbeat_worker", "reply", "task-finished", "compute-task", "get_data"],
        "reply_to": pd.array([None, 1, None, None, None], dtype="Int64"),
        "t_first_ns": [10, 20, 30, 40, 50]})
    frames = pd.DataFrame({"frame_id": [0, 1, 2], "function": ["Scheduler.heartbeat_worker", "Server._handle_comm",
                                                               "Handle._run"]})
    stacks = pd.DataFrame({"stack_id": [0, 1], "frame_ids": [[0, 1, 2], [2]]})
    samples = pd.DataFrame({"process": ["scheduler"] * 3 + ["worker-0"], "on_cpu": [True, True, True, True],
                            "t_ns": [15, 25, 35, 35], "stack_id": [0, 0, 1, 0], "weight_s": [0.01, 0.01, 0.5, 9.0]})
    df = scheduler_ops(msgs, (0, 1_000_000_000), samples, stacks, frames).set_index("op")
    assert df.loc["heartbeat_worker", ["received", "sent"]].tolist() == [1, 0]
    assert df.loc["reply:heartbeat_worker", "sent"] == 1 and df.loc["reply:heartbeat_worker", "administrative"]
    assert df.loc["heartbeat_worker", "cpu_s"] == 0.02, "the scheduler's samples only"
    assert df.loc[OUTSIDE, "cpu_s"] == 0.5
    assert df.loc["task-finished", "cpu_s"] == 0 and not df.loc["task-finished", "administrative"]
    assert pd.isna(df.loc["compute-task", "cpu_s"]), "an op only sent has no handler"
    assert "get_data" not in df.index, "not the scheduler's"
    assert df.loc["heartbeat_worker", "per_s"] == 1.0
