"""Decode a run's captures into parquet tables: processes, connections, messages, tasks.

Times are CLOCK_MONOTONIC nanoseconds (the run's clock). Message times are
when the proxy saw the first and the last byte of the message.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import defaultdict, deque
from concurrent.futures import ProcessPoolExecutor
from operator import itemgetter

import numpy as np
import pandas as pd
import pyarrow as pa
from dask.utils import key_split

from ..probes import ebpf_tables, procfs, pyspy
from . import wire
from ..probes.proxy_capture import Capture, frames_at, read_capture
from ..probes.rundir import RunDir

MESSAGE_COLUMNS = ["msg_id", "conn", "direction", "src", "src_role", "dst", "dst_role", "t_first_ns",
                   "t_last_ns", "op", "key", "n_keys", "msg_bytes", "nframes", "batch_index", "batch_size",
                   "stimulus_id", "reply_to", "error"]
TASK_OPS = {"compute-task", "task-finished", "task-erred", "key-in-memory", "update-graph"}
DECODE_COLUMNS = ("frame0_at", "frame0_len", "at", "framing", "conn", "direction")
PARALLEL_FROM = 200_000  # messages: below this, starting processes costs more than it saves
SPAN_COLUMNS = ["compute_start_ns", "compute_stop_ns", "transfer_start_ns", "transfer_stop_ns"]
CLOCK_OPS = {"heartbeat_worker", "register-worker"}


def build(run: RunDir) -> dict:
    meta = run.meta()
    cap = read_capture(run.proxy_capture)
    procs = processes_table(meta)
    run.write_table("processes", procs)
    conns = connections_table(cap, procs)
    run.write_table("connections", conns)
    msgs, events = messages_table(cap, conns)
    cap.data = b""  # the raw capture: no longer needed, and as large as the file
    run.write_table("messages", msgs)
    tasks = tasks_table(events, msgs, meta["clock_anchor"])
    run.write_table("tasks", tasks)
    probe_tables(run, procs, conns)
    stats = {"messages": int(msgs.msg_id.nunique()), "ops": len(msgs), "tasks": len(tasks),
             "malformed_streams": len(cap.malformed), "undecodable_messages": int(msgs.error.notna().sum()),
             "torn_bytes": cap.torn_bytes, "lost_connections": len(cap.lost)}
    run.update_meta(capture=stats)
    return stats


def probe_tables(run: RunDir, procs: pd.DataFrame, conns: pd.DataFrame) -> None:
    """Tables of the sampling probes; rows carry the name of their process."""
    cap = run / "captures"
    samples, stacks, frames = pyspy.read_samples(cap / pyspy.CAPTURE)
    samples["source"], frames["kind"] = "pyspy", "python"
    native = ebpf_tables.read_cpu(cap / "ebpf_cpu.tsv", frame_base=len(frames), stack_base=len(stacks))
    samples, stacks, frames = (pd.concat([a, b], ignore_index=True) for a, b in zip((samples, stacks, frames), native))
    events = ebpf_tables.read_events(cap / ebpf_tables.EVENTS)
    tables = {"samples": samples, "stacks": stacks, "frames": frames,
              "gil_waits": ebpf_tables.read_gil(events),
              "offcpu": ebpf_tables.read_offcpu(events),
              "short_waits": ebpf_tables.read_small(cap / "ebpf_small.tsv"),
              "tcp": ebpf_tables.read_tcp(events, conns),
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


class _Events:
    """Task-lifecycle facts as row tuples, filled by the decode loop."""

    def __init__(self):
        self.compute = []    # key, message, built_s, deps
        self.finished = []   # key, message, built_s, nbytes, thread, compute start/stop, transfer start/stop
        self.in_memory = []  # key, message
        self.graphs = []     # message, requested keys
        self.erred = []
        self.clock = []      # worker's message, its now, reply message, scheduler's time

    def add(self, op: str, item: dict, key, msg: int) -> None:
        if op == "compute-task":
            who_has = item.get("who_has")
            self.compute.append((key, msg, wire.stimulus_time(item.get("stimulus_id")),
                                 [wire.key_str(k) for k in who_has] if isinstance(who_has, dict) else []))
        elif op == "task-finished":
            self.finished.append((key, msg, wire.stimulus_time(item.get("stimulus_id")), _int(item.get("nbytes")),
                                  _int(item.get("thread")), *_spans(item.get("startstops") or ())))
        elif op == "key-in-memory":
            self.in_memory.append((key, msg))
        elif op == "update-graph":
            self.graphs.append((msg, [wire.key_str(k) for k in wire.keys_of(item)]))
        elif op == "task-erred":
            self.erred.append(key)

    def tables(self) -> dict:
        """As arrow tables, which cross between processes for the cost of their buffers."""
        return {"compute": _arrow(self.compute, EVENT_COLUMNS["compute"]),
                "finished": _arrow(self.finished, EVENT_COLUMNS["finished"]),
                "in_memory": _arrow(self.in_memory, EVENT_COLUMNS["in_memory"]),
                "graphs": self.graphs, "erred": self.erred, "clock": self.clock}


EVENT_COLUMNS = {
    "compute": {"key": pa.string(), "message": pa.int64(), "built_s": pa.float64(), "deps": pa.list_(pa.string())},
    "finished": {"key": pa.string(), "message": pa.int64(), "built_s": pa.float64(), "nbytes": pa.int64(),
                 "thread": pa.int64(), "compute_start_s": pa.float64(), "compute_stop_s": pa.float64(),
                 "transfer_start_s": pa.float64(), "transfer_stop_s": pa.float64()},
    "in_memory": {"key": pa.string(), "message": pa.int64()},
}
OP_TYPES = {"message": pa.int64(), "op": pa.string(), "key": pa.string(), "n_keys": pa.int64(),
            "batch_index": pa.int64(), "batch_size": pa.int64(), "stimulus_id": pa.string(),
            "reply_to": pa.int64(), "error": pa.string()}


def _int(v):
    return v if isinstance(v, int) and -2**63 <= v < 2**63 else None


def _arrow(rows: list[tuple], types: dict) -> pa.Table:
    # Row tuples to columns in arrow's C++, not by transposing in Python (4x faster).
    struct = pa.array(rows, type=pa.struct(list(types.items())))
    return pa.Table.from_struct_array(struct)


def _spans(startstops) -> tuple:
    """(compute start, stop, transfer start, stop), wall seconds, each the union of its kind."""
    out = [None, None, None, None]
    for s in startstops:
        action = s.get("action") if isinstance(s, dict) else None
        if action in ("compute", "transfer"):
            i = 0 if action == "compute" else 2
            start, stop = s.get("start"), s.get("stop")
            if not (isinstance(start, (int, float)) and isinstance(stop, (int, float))):
                continue
            out[i] = start if out[i] is None else min(out[i], start)
            out[i + 1] = stop if out[i + 1] is None else max(out[i + 1], stop)
    return tuple(out)


def messages_table(cap: Capture, conns: pd.DataFrame, jobs: int | None = None) -> tuple[pd.DataFrame, dict]:
    """One row per op (batches expanded), plus the task-lifecycle events.
    Connections are independent (a reply pairs with a request on its own
    connection), so a large capture is decoded by connection in parallel
    processes, each reading the capture file itself."""
    m = cap.messages
    cols = {c: m[c].to_numpy() for c in DECODE_COLUMNS}
    jobs = jobs or min(os.cpu_count() or 1, 4)
    if len(m) < PARALLEL_FROM or jobs == 1 or cap.path is None:
        parts = [_decode(cap.data, np.arange(len(m)), cols)]
    else:
        split = _by_connection(cols["conn"], jobs)
        work = ([cap.path] * len(split), split, [{c: v[idx] for c, v in cols.items()} for idx in split])
        with ProcessPoolExecutor(len(split), mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(pool.map(_decode_file, *work))
    ops = _concat(parts, "ops").sort_values(["message", "batch_index"], kind="stable", ignore_index=True)
    ev = {name: _concat(parts, name).sort_values("message", kind="stable", ignore_index=True)
          for name in EVENT_COLUMNS}
    ev |= {name: sorted((r for p in parts for r in p[name]), key=itemgetter(0)) for name in ("graphs", "clock")}
    ev["erred"] = [k for p in parts for k in p["erred"]]
    return _ops_frame(m, conns, ops), ev


def _concat(parts: list[dict], name: str) -> pd.DataFrame:
    return pa.concat_tables([p[name] for p in parts]).to_pandas()


def _by_connection(conn: np.ndarray, jobs: int) -> list[np.ndarray]:
    """Message indices in `jobs` parts of whole connections, balanced by message count."""
    ids, counts = np.unique(conn, return_counts=True)
    load, parts = [0] * jobs, [[] for _ in range(jobs)]
    for c, n in sorted(zip(ids.tolist(), counts.tolist()), key=lambda x: -x[1]):
        k = load.index(min(load))
        load[k] += n
        parts[k].append(c)
    return [np.flatnonzero(np.isin(conn, p)) for p in parts if p]


def _decode_file(path, index: np.ndarray, cols: dict) -> dict:
    return _decode(path.read_bytes(), index, cols)


def _decode(data: bytes, index: np.ndarray, cols: dict) -> dict:
    """Ops and events of the messages at `index` (message numbers, in time order)."""
    pending = defaultdict(deque)  # (conn, direction) -> requests awaiting a reply
    greeted = set()
    ops = []  # message, op, key, n_keys, batch index, size, stimulus, reply_to, error
    ev = _Events()
    clock_requests = {}
    rows = zip(index.tolist(), *(cols[c].tolist() for c in DECODE_COLUMNS))
    for i, f0, f0_len, at, framing, conn, d in rows:
        try:
            if framing == "current" and f0 >= 0:
                msg = wire.decode_frame0(data[f0:f0 + f0_len])
            else:
                msg = wire.decode(frames_at(data, at), framing)
        except wire.Undecodable as e:
            ops.append((i, "undecodable", None, 0, 0, 1, None, None, str(e)))
            continue
        if wire.is_handshake(msg) and (conn, d) not in greeted:
            greeted.add((conn, d))
            ops.append((i, "handshake", None, 0, 0, 1, None, None, None))
            continue
        items = msg if isinstance(msg, (list, tuple)) else (msg,)
        batched = isinstance(msg, (list, tuple))
        for j, item in enumerate(items):
            if not isinstance(item, dict) or "op" not in item:
                waiting = pending[(conn, 1 - d)]
                reply_to = waiting.popleft() if waiting and not batched else None
                ops.append((i, "reply" if reply_to is not None else "value", None, 0, j, len(items), None,
                            reply_to, None))
                if reply_to in clock_requests and isinstance(item, dict) and isinstance(item.get("time"), float):
                    ev.clock.append((*clock_requests.pop(reply_to), i, item["time"]))
                continue
            op = str(item["op"])
            key = wire.key_str(item["key"]) if "key" in item else None
            if not batched:
                pending[(conn, d)].append(i)
            stim = item.get("stimulus_id")
            n_keys = len(wire.keys_of(item)) if "keys" in item else 0
            ops.append((i, op, key, n_keys or int(key is not None), j, len(items),
                        stim if isinstance(stim, str) else None, None, None))
            if op in TASK_OPS:
                ev.add(op, item, key, i)
            elif op in CLOCK_OPS and isinstance(item.get("now"), float):
                clock_requests[i] = (i, item["now"])
    return {"ops": _arrow(ops, OP_TYPES)} | ev.tables()


def _ops_frame(m: pd.DataFrame, conns: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    per_msg = m.iloc[ops.message.to_numpy("int64")].reset_index(drop=True)
    ends = conns.set_index("conn") if not conns.empty else pd.DataFrame(
        columns=["peer", "peer_role", "upstream_name", "upstream_role"])
    out = {"msg_id": per_msg.msg_id, "conn": per_msg.conn, "direction": per_msg.direction}
    to_up = per_msg.direction.to_numpy() == 0  # peer -> upstream; 1 is upstream -> peer
    end = {c: per_msg.conn.map(ends[c]).fillna("?").to_numpy() for c in
           ("peer", "peer_role", "upstream_name", "upstream_role")}
    out |= {"src": np.where(to_up, end["peer"], end["upstream_name"]),
            "src_role": np.where(to_up, end["peer_role"], end["upstream_role"]),
            "dst": np.where(to_up, end["upstream_name"], end["peer"]),
            "dst_role": np.where(to_up, end["upstream_role"], end["peer_role"])}
    out |= {"t_first_ns": per_msg.t_first_ns, "t_last_ns": per_msg.t_last_ns, "op": ops.op, "key": ops.key,
            "n_keys": ops.n_keys, "msg_bytes": per_msg.msg_bytes, "nframes": per_msg.nframes,
            "batch_index": ops.batch_index, "batch_size": ops.batch_size, "stimulus_id": ops.stimulus_id,
            "reply_to": ops.reply_to.astype("Int64"), "error": ops.error}
    return pd.DataFrame(out, columns=MESSAGE_COLUMNS)


def tasks_table(ev: dict, msgs: pd.DataFrame, anchor: dict) -> pd.DataFrame:
    """One row per task key, joined from its compute-task, task-finished and
    key-in-memory messages; startstops (wall seconds) mapped to the run's clock."""
    first = msgs.drop_duplicates("msg_id").set_index("msg_id")
    offset_s = (anchor["wall_ns"] - anchor["monotonic_ns"]) / 1e9
    to_ns = lambda wall: ((wall.astype("float64") - offset_s) * 1e9).round().astype("Int64").to_numpy()
    at = lambda col, msg: first[col].reindex(msg).to_numpy()
    c = ev["compute"]
    ct = pd.DataFrame({"key": c.key, "compute_sent_ns": at("t_first_ns", c.message),
                       "compute_recv_ns": at("t_last_ns", c.message), "dispatch_built_ns": to_ns(c.built_s),
                       "worker": at("dst", c.message), "deps": c.deps})
    g = ct.groupby("key", sort=False)
    tasks = g.last().assign(attempts=g.size())
    f = ev["finished"]
    tf = pd.DataFrame({"key": f.key, "finished_built_ns": to_ns(f.built_s),
                       "finished_sent_ns": at("t_first_ns", f.message), "finished_recv_ns": at("t_last_ns", f.message),
                       "nbytes": f.nbytes.astype("Int64"), "thread": f.thread.astype("Int64"),
                       **{col: to_ns(f[col.replace("_ns", "_s")]) for col in SPAN_COLUMNS}})
    tasks = tasks.join(tf.groupby("key", sort=False).last(), how="outer")
    k = ev["in_memory"]
    kim = pd.DataFrame({"key": k.key, "in_memory_sent_ns": at("t_first_ns", k.message),
                        "in_memory_ns": at("t_last_ns", k.message)}).groupby("key", sort=False).first()
    tasks = tasks.join(kim, how="left").rename_axis("key").reset_index()
    for col in ("compute_sent_ns", "compute_recv_ns", "finished_sent_ns", "finished_recv_ns", "in_memory_sent_ns",
                "in_memory_ns", *SPAN_COLUMNS):
        tasks[col] = tasks[col].astype("Int64")
    tasks = _undo_scheduler_delay(tasks, _clock(ev["clock"], first), anchor)
    tasks["status"] = np.where(tasks.key.isin(set(ev["erred"])), "erred",
                               np.where(tasks.finished_recv_ns.notna(), "finished", "unfinished"))
    tasks["prefix"] = _prefixes(tasks.key)
    tasks["requested"] = tasks.key.isin({key for _, keys in ev["graphs"] for key in keys})
    return _with_submitted(tasks, first.t_first_ns.reindex([msg for msg, _ in ev["graphs"]]))


def _prefixes(keys: pd.Series) -> pd.Series:
    """dask's key_split per key. A trailing -<digits> never changes it (key_split stops at the
    first word that is not alphabetic), so it runs once per stem, not once per key."""
    stems = keys.astype("str").str.replace(r"-\d+$", "", regex=True)
    unique = stems.unique()
    return stems.map(dict(zip(unique, map(key_split, unique))))


def _clock(clock: list, first: pd.DataFrame) -> pd.DataFrame:
    """Heartbeats: the worker's `now` in its request, the scheduler's `time` in the reply."""
    rows = [(first.src.get(req), first.t_last_ns.get(rep), now, t) for req, now, rep, t in clock]
    return pd.DataFrame(rows, columns=["src", "t_last_ns", "now", "time"])


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
    by = [t.worker, t.epoch]
    lo = (t.compute_stop_ns - t.finished_sent_ns).groupby(by).max()
    hi = (t.compute_start_ns - t.compute_recv_ns).groupby(by).min()
    wire = t.delay_ns.groupby(by).first()
    chosen = np.where(lo <= hi, np.clip(wire, lo, hi), lo).astype("int64")
    t["delay_ns"] = pd.Series(chosen, index=wire.index).reindex(
        pd.MultiIndex.from_frame(t[["worker", "epoch"]])).to_numpy()
    delay = t.set_index("index").delay_ns.reindex(tasks.index, fill_value=0).astype("int64")
    for col in ("compute_start_ns", "compute_stop_ns", "transfer_start_ns", "transfer_stop_ns"):
        tasks[col] = tasks[col] - delay
    tasks["scheduler_delay_ns"] = delay
    return tasks


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
