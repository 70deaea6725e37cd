"""The scheduler's load by op: the messages it received and sent, each op's rate, and the CPU its handler
took, from the scheduler's on-CPU samples (what `daskprobe bench` reports against worker count).

An on-CPU sample is charged to the op whose handler its stack is in: the frame that Dask's dispatcher
(Server.handle_stream for a batched stream, Server._handle_comm for an rpc) called. What a handler does is
its op's, transitions and the messages it sends included. A sample in a dispatcher but no handler (reading,
unpacking) or in none (the event loop, periodic callbacks, comms) is charged to the rows OUTSIDE names.
Administrative ops (heartbeats, keep-alives, registration, the comms' handshakes) are marked as such: the
2017 benchmarks found the scheduler "swamped with administrative messages" at hundreds of workers.
A reply is counted under the op it answers ("reply:heartbeat_worker")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .whole_run import scheduler_cpu

DISPATCHERS = ("Server.handle_stream", "Server._handle_comm")
HANDLER_CLASSES = ("Scheduler.", "SchedulerState.", "Server.", "ServerNode.")
DISPATCHING = "(reading and dispatching messages)"  # in a dispatcher, in no op's handler
OUTSIDE = "(outside any message: event loop, comms, periodic callbacks)"
ADMINISTRATIVE = {"heartbeat_worker", "heartbeat-client", "keep-alive", "handshake", "identity", "register-worker",
                  "unregister", "remove-worker", "worker-status-change", "log-event", "close-stream",
                  "subscribe-topic", "register-client", "close-client", "stream-start", "adjust-heartbeat-interval"}
# ops whose handler's name is neither the op's (dashes as underscores) nor handle_ and that
ALIASES = {"add_worker": "register-worker", "add_client": "register-client", "log_worker_event": "log-event",
           "remove_worker": "unregister"}
COLUMNS = ["op", "administrative", "received", "sent", "per_s", "cpu_s", "cpu_per_msg_s"]


def scheduler_messages(messages: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """The scheduler's messages in the window, a reply named after what it answers."""
    m = messages[((messages.src == "scheduler") | (messages.dst == "scheduler"))
                 & (messages.t_first_ns >= window[0]) & (messages.t_first_ns <= window[1])]
    asked = messages.drop_duplicates("msg_id").set_index("msg_id").op
    reply = m.op == "reply"
    op = m.op.where(~reply, "reply:" + m.reply_to.map(asked).fillna("?").astype(str))
    return m.assign(op=op)


def handler_op(frames: list[str], ops: set[str]) -> str:
    """The op whose handler a stack (leaf first, functions qualified) is in; DISPATCHING or OUTSIDE."""
    at = next((i for i, f in enumerate(frames) if f in DISPATCHERS), None)
    if at is None:
        return OUTSIDE
    # the handler: the first of the scheduler's methods the dispatcher called (through a decorator's wrapper)
    called = next((f for f in reversed(frames[:at]) if f.startswith(HANDLER_CLASSES)), None)
    if called is None:
        return DISPATCHING  # reading the comm, unpacking
    callee = called.rsplit(".", 1)[-1]
    name = ALIASES.get(callee) or callee.removeprefix("handle_").replace("_", "-")
    return next((op for op in (name, callee) if op in ops or op in ADMINISTRATIVE), f"{callee} (handler)")


def cpu_by_op(samples: pd.DataFrame, stacks: pd.DataFrame, frames: pd.DataFrame, window: tuple[int, int],
              ops: set[str]) -> pd.Series:
    """Seconds of the scheduler's CPU per op (handler_op), from its on-CPU samples in the window."""
    s = samples[(samples.process == "scheduler") & samples.on_cpu
                & (samples.t_ns >= window[0]) & (samples.t_ns <= window[1])]
    if s.empty:
        return pd.Series(dtype="float64")
    names = frames.set_index("frame_id").function
    frame_ids = stacks.set_index("stack_id").frame_ids
    op = {sid: handler_op([names.get(f, "") for f in frame_ids[sid]], ops) for sid in s.stack_id.unique()}
    return s.weight_s.groupby(s.stack_id.map(op)).sum()


def scheduler_ops(messages: pd.DataFrame, window: tuple[int, int], samples: pd.DataFrame | None = None,
                  stacks: pd.DataFrame | None = None, frames: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per op (COLUMNS): messages received and sent by the scheduler in the window (each op of a
    batch counts), per second, and its handler's CPU (NaN without samples; NaN for an op only sent)."""
    m = scheduler_messages(messages, window)
    seconds = max((window[1] - window[0]) / 1e9, 1e-9)
    df = pd.DataFrame({"received": m[m.dst == "scheduler"].op.value_counts(),
                       "sent": m[m.src == "scheduler"].op.value_counts()}).fillna(0).astype("int64")
    if samples is not None and len(samples):
        cpu = cpu_by_op(samples, stacks, frames, window, set(df.index))
        df = df.reindex(df.index.union(cpu.index), fill_value=0)
        cpu = cpu.reindex(df.index)
        df["cpu_s"] = cpu.fillna(0.0).where((df.received > 0) | cpu.notna())  # an op only sent: no handler
    else:
        df["cpu_s"] = np.nan
    df["per_s"] = (df.received + df.sent) / seconds
    df["cpu_per_msg_s"] = df.cpu_s / df.received.where(df.received > 0)
    df["administrative"] = [o.removeprefix("reply:") in ADMINISTRATIVE for o in df.index]
    df = df.rename_axis("op").reset_index()
    return df.sort_values(["cpu_s", "received"], ascending=False, na_position="last", ignore_index=True)[COLUMNS]


def of_run(run) -> tuple[dict, pd.DataFrame]:
    """A run directory's (a RunDir, tables decoded) scheduler load over its makespan: the totals (LOAD)
    and the rows by op; ({}, no rows) for a run without jobs. CPU in total from /proc, by op from samples."""
    jobs = run.table("jobs", missing_ok=True)
    if jobs.empty or not run.has_table("messages"):
        return {}, pd.DataFrame(columns=COLUMNS)
    window = (int(jobs.start_ns.min()), int(jobs.end_ns.max()))
    sampled = [run.table(n) if run.has_table(n) else None for n in ("cpu_samples", "stacks", "frames")]
    ops = scheduler_ops(run.table("messages"), window, *sampled)
    cpu = scheduler_cpu(run.table("proc", missing_ok=True), window, 1)  # CPU-seconds over the window
    tasks, msgs = int(run.table("attempts", missing_ok=True).key.nunique()), int(ops.received.sum() + ops.sent.sum())
    admin = ops[ops.administrative]
    return {"scheduler_cpu_s": cpu, "scheduler_cpu_per_task_s": cpu / tasks if cpu is not None and tasks else None,
            "scheduler_messages": msgs, "scheduler_cpu_per_msg_s": cpu / msgs if cpu is not None and msgs else None,
            "administrative_msg_share": (admin.received.sum() + admin.sent.sum()) / msgs if msgs else None,
            "administrative_cpu_s": float(admin.cpu_s.sum()) if ops.cpu_s.notna().any() else None}, ops


LOAD = ("scheduler_cpu_s", "scheduler_cpu_per_task_s", "scheduler_messages", "scheduler_cpu_per_msg_s",
        "administrative_msg_share", "administrative_cpu_s")
