"""Decode a run's captures into parquet tables: processes, connections, messages, tasks.

Times are CLOCK_MONOTONIC nanoseconds (the run's clock). Message times are
when the proxy saw the first and the last byte of the message.
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pandas as pd
from dask.utils import key_split

from daskprobe.probes import ebpf_tables, procfs, pyspy
from daskprobe.tracer import wire
from daskprobe.tracer.capture import Capture, read_capture
from daskprobe.tracer.rundir import RunDir

MESSAGE_COLUMNS = ["msg_id", "conn", "direction", "src", "src_role", "dst", "dst_role", "t_first_ns",
                   "t_last_ns", "op", "key", "n_keys", "msg_bytes", "nframes", "batch_index", "batch_size",
                   "stimulus_id", "reply_to", "error"]
TASK_OPS = {"compute-task", "task-finished", "task-erred", "key-in-memory", "update-graph"}
CLOCK_OPS = {"heartbeat_worker", "register-worker"}


def build(run: RunDir) -> dict:
    meta = run.meta()
    cap = read_capture(run.proxy_capture)
    procs = processes_table(meta)
    run.write_table("processes", procs)
    conns = connections_table(cap, procs)
    run.write_table("connections", conns)
    msgs, events = messages_table(cap, conns)
    run.write_table("messages", msgs)
    tasks = tasks_table(events, meta["clock_anchor"])
    run.write_table("tasks", tasks)
    probe_tables(run, procs, conns)
    stats = {"messages": int(msgs.msg_id.nunique()), "ops": len(msgs), "tasks": len(tasks),
             "malformed_streams": len(cap.malformed), "undecodable_messages": int(msgs.error.notna().sum()),
             "torn_bytes": cap.torn_bytes}
    run.update_meta(capture=stats)
    return stats


def probe_tables(run: RunDir, procs: pd.DataFrame, conns: pd.DataFrame) -> None:
    """Tables of the sampling probes; rows carry the name of their process."""
    cap = run / "captures"
    samples, stacks, frames = pyspy.read_samples(cap / pyspy.CAPTURE)
    samples["source"], frames["kind"] = "pyspy", "python"
    native = ebpf_tables.read_cpu(cap / "ebpf_cpu.tsv", frame_base=len(frames), stack_base=len(stacks))
    samples, stacks, frames = (pd.concat([a, b], ignore_index=True) for a, b in zip((samples, stacks, frames), native))
    tables = {"samples": samples, "stacks": stacks, "frames": frames,
              "gil_waits": ebpf_tables.read_gil(cap / "gil.tsv"),
              "offcpu": ebpf_tables.read_offcpu(cap / "offcpu.tsv"),
              "short_waits": ebpf_tables.read_small(cap / "ebpf_small.tsv"),
              "tcp": ebpf_tables.read_tcp(cap / "tcp.tsv", conns),
              "proc": procfs.read_proc(cap / procfs.CAPTURE)}
    names = procs.dropna(subset=["pid"]).set_index("pid").name
    for name, df in tables.items():
        if "pid" in df:
            df["process"] = df.pid.map(names)
        run.write_table(name, df)
    status = ebpf_tables.read_status(cap / "ebpf_status.tsv")
    failed = status[status.status == "E"]
    if not failed.empty:
        run.update_meta(skipped_per_process=[f"pid {r.pid}: {r.what}" for r in failed.itertuples()])


def processes_table(meta: dict) -> pd.DataFrame:
    rows = [{"pid": p["pid"], "name": p["name"], "role": p["role"], "listen": p["listen"],
             "contact": p["contact"], "command": " ".join(map(str, p["command"]))}
            for p in meta.get("processes", [])]
    df = pd.DataFrame(rows, columns=["pid", "name", "role", "listen", "contact", "command"])
    versions = meta.get("versions", {}).get("cluster", {})
    df["python"] = np.where(df.role.isin(["scheduler", "worker", "nanny"]), versions.get("python"), None)
    df["distributed"] = np.where(df.role.isin(["worker", "nanny"]) | ((df.role == "scheduler") & (
        meta.get("cluster", {}).get("server_cmd") is None)), versions.get("distributed"), None)
    return df


def connections_table(cap: Capture, procs: pd.DataFrame) -> pd.DataFrame:
    """Each connection with both ends named. The accepting end is the process
    the proxy fronts; the connecting end is found by pid. A connecting pid that
    is not a cluster process is the user's command (or a child of it): client."""
    c = cap.connections.copy()
    if c.empty:
        return pd.DataFrame(columns=["conn", "peer", "peer_role", "upstream_name", "upstream_role"])
    by_pid = procs.dropna(subset=["pid"]).set_index("pid")
    by_name = procs.set_index("name")
    known = c.peer_pid.isin(by_pid.index)
    c["peer"] = np.where(known, c.peer_pid.map(by_pid.name), "client")
    c["peer_role"] = np.where(known, c.peer_pid.map(by_pid.role), "client")
    c["upstream_name"] = c.label
    c["upstream_role"] = c.label.map(by_name.role)
    bad = cap.malformed.groupby("conn").size()
    c["malformed"] = c.conn.map(bad).fillna(0).astype(int)
    return c.drop(columns="label")


def messages_table(cap: Capture, conns: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """One row per op (batches expanded), plus the task-lifecycle events."""
    ends = {r.conn: ((r.peer, r.peer_role), (r.upstream_name, r.upstream_role)) for r in conns.itertuples()}
    pending = defaultdict(deque)  # (conn, direction) -> requests awaiting a reply
    greeted = set()
    rows, events = [], []
    clock_requests = {}  # msg_id -> (worker, its "now") for heartbeat / register-worker
    for m, frames in zip(cap.messages.itertuples(index=False), cap.kept):
        peer, up = ends.get(m.conn, (("?", "?"), ("?", "?")))
        src, dst = (peer, up) if m.direction == 0 else (up, peer)
        base = (m.msg_id, m.conn, m.direction, *src, *dst, m.t_first_ns, m.t_last_ns)
        tail = (m.msg_bytes, m.nframes)
        try:
            msg = wire.decode(frames, m.framing)
        except wire.Undecodable as e:
            rows.append((*base, "undecodable", None, 0, *tail, 0, 1, None, None, str(e)))
            continue
        if wire.is_handshake(msg) and (m.conn, m.direction) not in greeted:
            greeted.add((m.conn, m.direction))
            rows.append((*base, "handshake", None, 0, *tail, 0, 1, None, None, None))
            continue
        items = wire.ops(msg)
        for i, item in enumerate(items):
            op, key, n_keys, stim, reply_to = _describe(item, m, pending, batched=len(items) > 1 or msg is not item)
            rows.append((*base, op, key, n_keys, *tail, i, len(items), stim, reply_to, None))
            if op in TASK_OPS:
                events.append(_task_event(op, key, item, m, src[0], dst[0]))
            elif op in CLOCK_OPS and isinstance(item.get("now"), float):
                clock_requests[m.msg_id] = (src[0], item["now"])
            elif reply_to in clock_requests and isinstance(item, dict) and isinstance(item.get("time"), float):
                worker, now = clock_requests.pop(reply_to)
                events.append({"op": "clock", "src": worker, "t_last_ns": m.t_last_ns,
                               "now": now, "time": item["time"]})
    return pd.DataFrame(rows, columns=MESSAGE_COLUMNS), events


def _describe(item, m, pending, batched: bool):
    """op, key, number of keys, stimulus_id and the request answered, for one op.
    Pooled RPC connections carry request/reply pairs without ids: a message
    with no op answers the oldest unanswered request from the other side."""
    if not isinstance(item, dict) or "op" not in item:
        waiting = pending[(m.conn, 1 - m.direction)]
        if waiting and not batched:
            return "reply", None, 0, None, waiting.popleft()
        return "value", None, 0, None, None
    op = str(item["op"])
    key = wire.key_str(item["key"]) if "key" in item else None
    n_keys = len(wire.keys_of(item)) or int(key is not None)
    if not batched:
        pending[(m.conn, m.direction)].append(m.msg_id)
    stim = item.get("stimulus_id")
    return op, key, n_keys, stim if isinstance(stim, str) else None, None


def _task_event(op: str, key, item: dict, m, src: str, dst: str) -> dict:
    ev = {"op": op, "key": key, "t_first_ns": m.t_first_ns, "t_last_ns": m.t_last_ns, "src": src, "dst": dst,
          "built_s": wire.stimulus_time(item.get("stimulus_id"))}
    if op == "compute-task":
        who_has = item.get("who_has")
        ev["deps"] = [wire.key_str(k) for k in who_has] if isinstance(who_has, dict) else []
    if op == "update-graph":
        ev["keys"] = [wire.key_str(k) for k in wire.keys_of(item)]
    if op == "task-finished":
        ev["nbytes"] = item.get("nbytes")
        ev["thread"] = item.get("thread")
        ev["startstops"] = item.get("startstops") or ()
    return ev


def tasks_table(events: list[dict], anchor: dict) -> pd.DataFrame:
    """One row per task key, joined from its compute-task, task-finished and
    key-in-memory messages; startstops (wall seconds) mapped to the run's clock."""
    ev = pd.DataFrame(events, columns=["op", "key", "t_first_ns", "t_last_ns", "src", "dst",
                                       "nbytes", "thread", "startstops", "now", "time", "keys", "deps",
                                       "built_s"])
    ev["t_first_ns"] = ev.t_first_ns.astype("Int64")
    ev["t_last_ns"] = ev.t_last_ns.astype("Int64")
    offset_s = (anchor["wall_ns"] - anchor["monotonic_ns"]) / 1e9
    ev["built_ns"] = ((ev.built_s - offset_s) * 1e9).round().astype("Int64")
    ct = ev[ev.op == "compute-task"].groupby("key")
    tasks = pd.DataFrame({"compute_sent_ns": ct.t_first_ns.last(), "compute_recv_ns": ct.t_last_ns.last(),
                          "dispatch_built_ns": ct.built_ns.last(), "worker": ct.dst.last(),
                          "attempts": ct.size(), "deps": ct.deps.last()})
    tf = ev[ev.op == "task-finished"].groupby("key").last()
    tasks = tasks.join(pd.DataFrame({"finished_built_ns": tf.built_ns, "finished_sent_ns": tf.t_first_ns,
                                     "finished_recv_ns": tf.t_last_ns, "nbytes": tf.nbytes,
                                     "thread": tf.thread}), how="outer")
    tasks = tasks.join(_startstops(tf.startstops, anchor), how="left")
    kim = ev[ev.op == "key-in-memory"].groupby("key")
    kim = pd.DataFrame({"in_memory_sent_ns": kim.t_first_ns.first(), "in_memory_ns": kim.t_last_ns.first()})
    erred = set(ev[ev.op == "task-erred"].key)
    tasks = tasks.join(kim, how="left").reset_index(names="key")
    tasks = _undo_scheduler_delay(tasks, ev[ev.op == "clock"], anchor)
    tasks["status"] = np.where(tasks.key.isin(erred), "erred",
                               np.where(tasks.finished_recv_ns.notna(), "finished", "unfinished"))
    tasks["prefix"] = tasks.key.map(key_split)
    requested = {k for keys in ev[ev.op == "update-graph"]["keys"] for k in keys}
    tasks["requested"] = tasks.key.isin(requested)
    for col in ("nbytes", "thread"):
        tasks[col] = tasks[col].astype("Int64")
    return _with_submitted(tasks, ev[ev.op == "update-graph"].t_first_ns)


def _undo_scheduler_delay(tasks: pd.DataFrame, clock: pd.DataFrame, anchor: dict) -> pd.DataFrame:
    """Workers add `scheduler_delay` to startstops: their estimate of the
    scheduler's clock offset, remade at each heartbeat as
    reply.time - (request.now + end) / 2, where `end` is when the worker read
    the reply. Both times travel on the wire; the proxy sees the reply a little
    before the worker reads it, so the wire estimate is an upper bound. Within
    one heartbeat epoch the delay is constant: take the wire estimate, clamped
    so that every compute span lies between its compute-task arriving and its
    task-finished leaving. On one host the true offset is zero, so what is
    taken off is exactly the worker's own error."""
    tasks["scheduler_delay_ns"] = 0
    if clock.empty or tasks.compute_stop_ns.isna().all():
        return tasks
    offset_s = (anchor["wall_ns"] - anchor["monotonic_ns"]) / 1e9
    steps = clock.assign(delay_ns=((clock.time - (clock.now + clock.t_last_ns / 1e9 + offset_s) / 2) * 1e9)
                         .round().astype("int64"), epoch=np.arange(len(clock)))
    steps = steps.rename(columns={"src": "worker", "t_last_ns": "finished_sent_ns"}).sort_values("finished_sent_ns")
    steps["finished_sent_ns"] = steps.finished_sent_ns.astype("int64")
    t = tasks[tasks.compute_stop_ns.notna()].reset_index().sort_values("finished_sent_ns")
    t["finished_sent_ns"] = t.finished_sent_ns.astype("int64")
    t = pd.merge_asof(t, steps[["worker", "finished_sent_ns", "delay_ns", "epoch"]], on="finished_sent_ns",
                      by="worker", direction="backward")
    t["delay_ns"], t["epoch"] = t.delay_ns.fillna(0), t.epoch.fillna(-1)
    g = t.groupby(["worker", "epoch"])
    lo = g.apply(lambda e: (e.compute_stop_ns - e.finished_sent_ns).max(), include_groups=False)
    hi = g.apply(lambda e: (e.compute_start_ns - e.compute_recv_ns).min(), include_groups=False)
    wire = g.delay_ns.first()
    chosen = np.where(lo <= hi, np.clip(wire, lo, hi), lo).astype("int64")
    t["delay_ns"] = pd.Series(chosen, index=wire.index).reindex(
        pd.MultiIndex.from_frame(t[["worker", "epoch"]])).to_numpy()
    delay = t.set_index("index").delay_ns.reindex(tasks.index, fill_value=0).astype("int64")
    for col in ("compute_start_ns", "compute_stop_ns", "transfer_start_ns", "transfer_stop_ns"):
        tasks[col] = tasks[col] - delay
    tasks["scheduler_delay_ns"] = delay
    return tasks


def _startstops(startstops: pd.Series, anchor: dict) -> pd.DataFrame:
    offset = anchor["wall_ns"] - anchor["monotonic_ns"]
    rows = {}
    for key, spans in startstops.items():
        row = {}
        for s in spans:
            kind = {"compute": "compute", "transfer": "transfer"}.get(s.get("action"))
            if kind:
                start, stop = int(s["start"] * 1e9) - offset, int(s["stop"] * 1e9) - offset
                row[f"{kind}_start_ns"] = min(row.get(f"{kind}_start_ns", start), start)
                row[f"{kind}_stop_ns"] = max(row.get(f"{kind}_stop_ns", stop), stop)
        rows[key] = row
    cols = ["compute_start_ns", "compute_stop_ns", "transfer_start_ns", "transfer_stop_ns"]
    return pd.DataFrame.from_dict(rows, orient="index", columns=cols).astype("Int64")


def _with_submitted(tasks: pd.DataFrame, graphs: pd.Series) -> pd.DataFrame:
    """A task's submission is the client's last update-graph before its first
    dispatch: graphs are pickled, so which graph holds a key is not visible."""
    tasks["submitted_ns"] = pd.array([pd.NA] * len(tasks), dtype="Int64")
    if graphs.empty or tasks.empty:
        return tasks
    g = np.sort(graphs.to_numpy())
    sent = tasks.compute_sent_ns.to_numpy(dtype="float64", na_value=np.nan)
    idx = np.searchsorted(g, sent, side="right") - 1
    ok = (idx >= 0) & ~np.isnan(sent)
    tasks.loc[ok, "submitted_ns"] = g[idx[ok]]
    return tasks
