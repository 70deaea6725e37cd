"""Write trace.pftrace (Perfetto TrackEvent protobuf, streamed) from a run's tables.

Tracks: one process track per scheduler, worker and client (the run's pids; one on another
host is named with its host, "worker-3 @ 10.0.0.7", its pid k·2^22 + its pid there);
under them, a track per thread with its CPU samples and, for a worker thread,
its compute slices (GIL waits and off-CPU time on child tracks), a send and a receive track per
connection direction (each message's send joined to its receive by a flow
arrow), scheduler dispatch slices per worker, and counters (tasks in flight
per worker, messages per second).

Sibling tracks never share a name. A thread track has the analysis' name for its thread (the threads
table: Python's name, else one the thread set itself, else its process's and a number; unique within
the process). A process's connection to itself names the end that sends or receives on each of its
tracks.

Each kind of event is a table (slices, counters, samples), which
trace_packets encodes in bulk and writes in time order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..probes.rundir import RunDir, open_whole
from .trace_packets import Tracks, Writer, emit, encode, event_tail
RATE_BIN_NS = 100_000_000
MESSAGE_COLUMNS = ["msg_id", "conn", "direction", "src", "src_role", "dst", "dst_role", "t_first_ns", "t_last_ns",
                   "op", "key", "n_keys", "msg_bytes", "batch_size"]  # not the long stimulus ids


def write(run: RunDir, analysed: Callable[[], object] = lambda: None) -> None:
    """The trace of a run directory. What reads only the decoded tables is built and encoded first;
    `analysed()` returns once the analysis has written its tables (finalize builds the first part
    beside the analysis); then what reads them (threads, critical path, tasks in flight)."""
    procs, msgs, tasks = run.table("processes"), run.table("messages", columns=MESSAGE_COLUMNS), run.table("attempts")
    with open_whole(run.trace) as f:
        w = Writer(f)
        tracks = Tracks(w)
        proc_track = {r.name: tracks.get(("proc", r.name), r.name + ("" if r.host == "local" else f" @ {r.host}"),
                                         pid=r.pid)
                      for r in procs.itertuples() if pd.notna(r.pid)}
        samples = run.table("samples", columns=["t_ns", "pid", "tid", "active", "stack_id", "process"])
        threads = _Threads(tracks, proc_track)
        flows = _task_flows(tasks, msgs)
        decoded = _named(w, [_message_slices(msgs, tracks, proc_track, flows),  # none on an analysed one's track
                             _dispatch_slices(msgs, run.table("graphs"), tracks, proc_track),
                             _gil_slices(run.table("gil_waits"), threads), _offcpu_slices(run.table("offcpu"), threads)])
        counters = pd.concat([_message_rate(msgs, tracks), _proc_counters(run.table("proc"), tracks, proc_track)],
                             ignore_index=True)
        samples, stacks, frames = _cpu_samples(run, samples, threads)
        decoded = encode(decoded, counters, samples, w.stacks(stacks, frames))
        analysed()
        if tasks.empty and run.has_table("local_tasks") and run.has_table("tasks"):
            tasks = run.table("tasks")  # a local scheduler's (analyzers/local.py): attempt_threads indexes them
        pids = procs.dropna(subset=["pid"]).set_index("name").pid.astype("int64").to_dict()
        ran_on = run.table("attempt_threads", missing_ok=True).set_index("attempt").tid.reindex(range(len(tasks)))
        slices = _named(w, [_compute_slices(tasks.assign(tid=ran_on.to_numpy()), tracks, proc_track, threads, pids,
                                            flows), _path_slices(run, tracks)])
        rest = encode(slices, _in_flight(run, tracks, proc_track), samples.iloc[:0], {})
        threads.name(thread_track_names(_threads_table(run), threads.made))
        tracks.unique()
        emit(w, decoded, rest)


def _named(w: Writer, slices: list[pd.DataFrame]) -> pd.DataFrame:
    """Slices of their own tracks, nested, named by iid (cheaper to sort than strings)."""
    slices = _no_overlap(pd.concat(slices, ignore_index=True))
    return slices.assign(name=w.names(slices.name))


def _slices(track, start, end, name, flow_out=None, flow_in=None, args: dict | None = None) -> pd.DataFrame:
    """Slices, each with the encoded tail of its TrackEvent (`extra`). flow_out and flow_in: a flow id
    per slice, or flow ids indexed by their slice's position; args: argument name -> a column of ints
    or strings."""
    n = len(start)
    return pd.DataFrame({"track": track, "start": np.asarray(start, dtype="int64"),
                         "end": np.asarray(end, dtype="int64"), "name": name,
                         "extra": event_tail(n, flow_out, flow_in, args or {})})


class _TaskFlows(NamedTuple):
    """One flow per finished attempt: from its compute-task's arrival through its compute slice to
    its task-finished leaving. Flow ids indexed by the msg_id that starts (ends) them, and by attempt."""
    starts: pd.Series
    ends: pd.Series
    attempt: pd.Series


def _task_flows(attempts: pd.DataFrame, msgs: pd.DataFrame) -> _TaskFlows:
    a = attempts.dropna(subset=["compute_start_ns", "compute_stop_ns", "finished_sent_ns"]).reset_index()
    a = a.astype({"compute_sent_ns": "int64", "finished_sent_ns": "int64"})
    m = msgs.dropna(subset=["key"])[["msg_id", "op", "key", "t_first_ns"]]
    sent = m[m.op == "compute-task"].rename(columns={"msg_id": "start", "t_first_ns": "compute_sent_ns"})
    done = m[m.op.isin(["task-finished", "task-erred"])].rename(columns={"msg_id": "end", "t_first_ns": "finished_sent_ns"})
    a = a.merge(sent[["key", "compute_sent_ns", "start"]], on=["key", "compute_sent_ns"])
    a = a.merge(done[["key", "finished_sent_ns", "end"]], on=["key", "finished_sent_ns"])
    a = a.drop_duplicates("index")
    a["flow"] = int(msgs.msg_id.max() if len(msgs) else 0) + 2 + np.arange(len(a))
    return _TaskFlows(a.set_index("start").flow, a.set_index("end").flow, a.set_index("index").flow)


def _at(flows: pd.Series, rows: pd.Index) -> pd.Series:
    """Flow ids indexed by the position, among rows, of the row each belongs to."""
    pos = rows.get_indexer(flows.index)
    return pd.Series(flows.to_numpy(), index=pos)[pos >= 0]


def _compute_slices(tasks, tracks, proc_track, threads: "_Threads", pids: dict, flows: _TaskFlows) -> pd.DataFrame:
    """Compute spans on the thread track that carries the same thread's samples (Dask names the
    thread by its Python ident, which the sampler reads too), else on a track per ident. A thread
    runs one task at a time, so its spans never overlap there."""
    t = tasks.dropna(subset=["compute_start_ns", "compute_stop_ns"])
    t = t[t.compute_start_ns >= 0]
    if t.empty:
        return _slices([], [], [], [])
    thread = t.thread.fillna(-1)  # a task-finished may not name its thread
    thread_no = thread.groupby(t.worker).rank(method="dense").astype(int) - 1
    track = [threads.track(w, pids[w], tid) if pd.notna(tid) and w in pids
             else tracks.get(("compute", w, th), f"compute (thread {k})", parent=proc_track.get(w))
             for w, th, k, tid in zip(t.worker, thread, thread_no, t.tid)]
    return _slices(track, t.compute_start_ns, t.compute_stop_ns, t.prefix, flow_out=_at(flows.attempt, t.index),
                   args={"key": t.key, "nbytes": t.nbytes.fillna(-1).astype("int64")})


def _message_slices(msgs, tracks, proc_track, task_flows: _TaskFlows) -> pd.DataFrame:
    """A send slice spans the first to last byte at the proxy; the receive
    slice starts at the last byte. Both are observed at the proxy."""
    ops = msgs.groupby("msg_id", sort=False)
    m = ops.first()
    names = _batch_names(msgs).reindex(m.index)
    keys = ops.n_keys.sum()
    ends = ["conn", "direction", "src", "dst"]
    send = _per_key(m, ends, lambda c, d, src, dst: tracks.get(("send", c, d), _conn_track_name("send", c, d, src, dst),
                                                               parent=proc_track.get(src)))
    recv = _per_key(m, ends, lambda c, d, src, dst: tracks.get(("recv", c, d), _conn_track_name("recv", c, d, src, dst),
                                                               parent=proc_track.get(dst)))
    flow = m.index.to_numpy() + 1
    args = {"bytes": m.msg_bytes.astype("int64"), "ops": m.batch_size.astype("int64"), "keys": keys.astype("int64")}
    return pd.concat([
        _slices(send, m.t_first_ns, m.t_last_ns, names.to_numpy(), flow_out=flow,
                flow_in=_at(task_flows.ends, m.index), args=args),
        _slices(recv, m.t_last_ns, m.t_last_ns, names.to_numpy(), flow_in=flow,
                flow_out=_at(task_flows.starts, m.index), args=args),
    ], ignore_index=True)


def _conn_track_name(kind: str, conn, direction, src, dst) -> str:
    """"send → worker-1 (conn 15)" under the sender, "recv ← worker-0 (conn 15)" under the receiver.
    A process's connection to itself (a worker fetching from itself through the proxy) puts both
    directions' send tracks, and both receive tracks, under that one process: they are told apart by
    the end that sends (receives), the one that connected (direction 0, peer -> upstream, carries its
    requests) or the one that listened (direction 1, its replies)."""
    if kind == "send":
        name = f"send → {dst} (conn {conn}"
        end = "from its connecting end" if direction == 0 else "from its listening end"
    else:
        name = f"recv ← {src} (conn {conn}"
        end = "at its listening end" if direction == 0 else "at its connecting end"
    return name + (f", {end})" if src == dst else ")")


def _path_slices(run: RunDir, tracks) -> pd.DataFrame:
    """The critical path of each job on a track of its own: each segment named by its part, with
    its key, process and category (the analysis' attribution), so the path reads left to right."""
    if not run.has_table("critical_path"):
        return _slices([], [], [], [])
    path = run.table("critical_path")
    top = tracks.get(("critical path",), "critical path (daskprobe)")
    track = [tracks.get(("critical path", j), f"critical path, job {j}" if j >= 0 else "client, between jobs",
                        parent=top) for j in path.job]
    return _slices(track, path.start_ns, path.end_ns, path.part.to_numpy(),
                   args={"kind": path.kind, "key": path.key.fillna(""), "process": path.process.fillna("")})


def _batch_names(msgs: pd.DataFrame) -> pd.Series:
    """Per message: its op, or for a batch "batch: op×n, ..." (commonest first)."""
    ops = msgs.groupby("msg_id", sort=False).op
    names = ops.first()
    many = ops.size() > 1  # most messages carry one op: only batches are joined, one by one
    batch = msgs[msgs.msg_id.isin(names.index[many])]
    counts = batch.groupby(["msg_id", "op"], sort=False).size().rename("n").reset_index()
    counts = counts.sort_values(["msg_id", "n"], ascending=[True, False], kind="stable")
    part = (counts.op + "×" + counts.n.astype("str") + ", ").to_numpy(object)
    first = np.flatnonzero(np.r_[True, counts.msg_id.to_numpy()[1:] != counts.msg_id.to_numpy()[:-1]]) \
        if len(counts) else np.zeros(0, np.int64)
    joined = pd.Series(np.add.reduceat(part, first) if len(first) else [], index=counts.msg_id.to_numpy()[first],
                       dtype=object).str[:-2]  # string concatenation per batch, in C
    names[many] = "batch: " + joined.reindex(names.index[many])
    return names


def _dispatch_slices(msgs, graphs, tracks, proc_track) -> pd.DataFrame:
    """Scheduler dispatch: from the last task-finished or graph the scheduler
    received to a compute-task batch leaving it."""
    finished = msgs[(msgs.dst_role == "scheduler") & (msgs.op == "task-finished")].t_last_ns
    out = msgs[(msgs.src_role == "scheduler") & (msgs.op == "compute-task")].drop_duplicates("msg_id")
    if out.empty or (finished.empty and graphs.empty):
        return _slices([], [], [], [])
    triggers = np.sort(np.concatenate([finished.to_numpy(), graphs.t_last_ns.to_numpy()]))
    i = np.searchsorted(triggers, out.t_first_ns.to_numpy(), side="right") - 1
    out, start = out[i >= 0], triggers[i[i >= 0]]
    track = [tracks.get(("dispatch", d), f"dispatch → {d}", parent=proc_track.get("scheduler")) for d in out.dst]
    return _slices(track, start, out.t_first_ns, "dispatch")


def _in_flight(run: RunDir, tracks, proc_track) -> pd.DataFrame:
    """Counters: the tasks each worker holds (table in_flight)."""
    ev = run.table("in_flight", missing_ok=True)
    track = [tracks.get(("inflight", w), "tasks in flight", parent=proc_track.get(w), counter=True) for w in ev.worker]
    return pd.DataFrame({"ts": ev.t_ns, "track": track, "value": ev.tasks})


def _message_rate(msgs, tracks) -> pd.DataFrame:
    m = msgs.drop_duplicates("msg_id")
    if m.empty:
        return pd.DataFrame(columns=["ts", "track", "value"])
    bins = (m.t_first_ns // RATE_BIN_NS) * RATE_BIN_NS
    rate = bins.value_counts().sort_index()
    full = pd.Series(0, index=np.arange(rate.index.min(), rate.index.max() + 2 * RATE_BIN_NS, RATE_BIN_NS))
    full.loc[rate.index] = rate.to_numpy()
    track = tracks.get("rate", "messages/s (all connections)", counter=True)
    return pd.DataFrame({"ts": full.index, "track": track, "value": full.to_numpy() * (1e9 / RATE_BIN_NS)})


def _proc_counters(proc, tracks, proc_track) -> pd.DataFrame:
    """CPU% and RSS per process, from /proc."""
    proc = proc[proc.process.isin(list(proc_track))]
    cpu = [tracks.get(("cpu", n), "CPU %", parent=proc_track[n], counter=True) for n in proc.process]
    rss = [tracks.get(("rss", n), "RSS (MiB)", parent=proc_track[n], counter=True) for n in proc.process]
    return pd.concat([pd.DataFrame({"ts": proc.t_ns, "track": cpu, "value": proc.cpu_percent}),
                      pd.DataFrame({"ts": proc.t_ns, "track": rss, "value": proc.rss_bytes / 2**20})])


class _Threads:
    """Thread tracks, made on first use, with child tracks for the thread's GIL waits and off-CPU time;
    named once every one is made (name(): by thread_track_names, which needs the analysis' threads)."""

    def __init__(self, tracks: Tracks, proc_track: dict):
        self.tracks, self.proc_track = tracks, proc_track
        self.made: dict[tuple[int, int], str] = {}  # (pid, tid) -> its process, of each thread track

    def track(self, process: str, pid: int, tid: int) -> int | None:
        if process not in self.proc_track:
            return None
        self.made.setdefault((int(pid), int(tid)), process)
        return self.tracks.get(("thread", pid, tid), f"thread {tid}", parent=self.proc_track[process],
                               thread=(pid, tid))

    def child(self, kind: str, process: str, pid: int, tid: int) -> int | None:
        parent = self.track(process, pid, tid)
        return None if parent is None else self.tracks.get((kind, pid, tid), kind, parent=parent)

    def name(self, names: dict) -> None:
        for (pid, tid) in self.made:
            self.tracks.rename(self.tracks.uuids[("thread", pid, tid)], names[(pid, tid)])


def _threads_table(run: RunDir) -> pd.DataFrame:
    """The analysis' threads table (pid, tid, name: Python's, else the kernel's); none where the
    analysis failed, whose threads then go by their process and tid (the renderer recomputes nothing)."""
    if run.has_table("threads"):
        return run.table("threads", columns=["pid", "tid", "name"])
    return pd.DataFrame({"pid": [], "tid": [], "name": []})


def thread_track_names(threads: pd.DataFrame, made: dict) -> dict:
    """(pid, tid) -> the name of its track, for each thread of made ((pid, tid) -> its process): the
    analysis' name (threads.name: unique within a process, see thread_state.thread_names), else its
    process's and its tid."""
    given = dict(zip(zip(threads.pid.astype("int64"), threads.tid.astype("int64")), threads.name))
    return {key: given.get(key) or f"{process} thread {key[1]}" for key, process in made.items()}


def _cpu_samples(run: RunDir, s: pd.DataFrame, threads: _Threads) -> tuple[pd.DataFrame, pd.Series, pd.DataFrame]:
    """On-CPU samples (py-spy and eBPF) on thread tracks; the frame ids of the stacks they use, root
    first; and each frame's label and file."""
    s = s[s.active.astype(bool) & s.process.isin(list(threads.proc_track))]
    # py-spy falls back to the pthread id where it cannot read the native one (older Pythons):
    # no thread track can carry it, so those samples stay in the tables only, and are counted.
    native = s.tid.between(0, 2**31 - 1)
    run.update_meta(trace={"samples_without_native_tid": int((~native).sum())})
    s = s[native]
    frames = run.table("frames").set_index("frame_id")
    frames = pd.DataFrame({"label": frames.function + " (" + frames.filename.map(_short) + ")",
                           "path": frames.filename})
    stacks = run.table("stacks").set_index("stack_id").frame_ids.reindex(s.stack_id.unique()).map(lambda f: f[::-1])
    for pid, tid, process in s[["pid", "tid", "process"]].drop_duplicates().itertuples(index=False):
        threads.track(process, pid, tid)
    return pd.DataFrame({"ts": s.t_ns, "pid": s.pid, "tid": s.tid, "stack_id": s.stack_id}), stacks, frames


def _gil_slices(gil: pd.DataFrame, threads: _Threads) -> pd.DataFrame:
    gil = gil[gil.process.isin(list(threads.proc_track))]
    track = _per_key(gil, ["process", "pid", "tid"], lambda *k: threads.child("GIL wait", *k))
    return _slices(track, gil.start_ns, gil.end_ns, "take_gil wait")


def _offcpu_slices(off: pd.DataFrame, threads: _Threads) -> pd.DataFrame:
    """Off-CPU time as 'blocked' (until woken) then 'runnable' (woken, waiting for a CPU)."""
    off = off[off.process.isin(list(threads.proc_track))]
    track = _per_key(off, ["process", "pid", "tid"], lambda *k: threads.child("off-CPU", *k))
    ready = off.out_ns + off.blocked_ns
    blocked = _slices(track, off.out_ns, ready, "blocked")
    return pd.concat([blocked[off.blocked_ns.to_numpy() > 0], _slices(track, ready, off.in_ns, "runnable")],
                     ignore_index=True)


def _per_key(rows: pd.DataFrame, columns: list[str], track) -> np.ndarray:
    """track(*row[columns]) of each row, asked once per distinct value (tracks are few, rows many)."""
    if rows.empty:
        return np.zeros(0, np.int64)
    group = rows.groupby(columns, sort=False, dropna=False).ngroup().to_numpy()  # in order of first appearance
    firsts = rows[columns].drop_duplicates()
    return np.array([track(*k) for k in firsts.itertuples(index=False)], dtype=np.int64)[group]


def _short(path: str) -> str:
    return "/".join(path.split("/")[-2:])


def _no_overlap(s: pd.DataFrame) -> pd.DataFrame:
    """Slices on one track must nest; ours are sequential, so clip each start
    to the previous end (clock noise of a few µs) and give each 1 ns at least."""
    s = s.sort_values(["track", "start", "end"], kind="stable").reset_index(drop=True)
    # end'[i] = max(end[i], start[i] + 1, end'[i-1] + 1) along a track: a running max of (that - i)
    at = s.groupby("track", sort=False).cumcount().to_numpy()
    lowest = np.maximum(s.end.to_numpy(), s.start.to_numpy() + 1) - at
    end = pd.Series(lowest).groupby(s.track.to_numpy(), sort=False).cummax().to_numpy() + at
    before = pd.Series(end).groupby(s.track.to_numpy(), sort=False).shift(1).to_numpy()
    start = np.where(np.isnan(before), s.start, np.fmax(s.start, before)).astype("int64")
    return s.assign(start=start, end=end)


