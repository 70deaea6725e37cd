"""Write trace.pftrace (Perfetto TrackEvent protobuf, streamed) from a run's tables.

Tracks: one process track per scheduler, worker and client (real pids);
under them, a track per thread with its CPU samples and, for a worker thread,
its compute slices (GIL waits and off-CPU time on child tracks), a send and a receive track per
connection direction (each message's send joined to its receive by a flow
arrow), scheduler dispatch slices per worker, and counters (tasks in flight
per worker, messages per second). All event names are interned.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np
import pandas as pd
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from ..analyzers.thread_state import attempt_threads
from ..probes.rundir import RunDir, open_new
from ..probes.schema import TABLES
from . import proto_wire as W

SEQ = 1
SEQ_HEAD = W.T.seq + W.varint(SEQ)
BEGIN, END, COUNTER = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END, pb.TrackEvent.TYPE_COUNTER
RATE_BIN_NS = 100_000_000
THREAD_COLUMNS = TABLES["threads"].names  # a threads table of an older run has no ident


class _Tracks:
    """Track descriptors, written as soon as a track is first needed."""

    def __init__(self, out: "_Writer"):
        self.out, self.uuids, self.next = out, {}, itertools.count(1)

    def get(self, key, name: str, parent=None, pid=None, counter=False, thread=None) -> int:
        """The uuid of the track for key. pid makes a process track; thread=(pid, tid)
        a thread track, on which the UI shows that thread's CPU samples."""
        if key not in self.uuids:
            uuid = self.uuids[key] = next(self.next)
            d = pb.TrackDescriptor(uuid=uuid, name=name)
            if parent is not None:
                d.parent_uuid = parent
            if pid is not None:
                d.process.pid, d.process.process_name = int(pid), name
            if counter:
                d.counter.SetInParent()
            if thread is not None:
                d.thread.pid, d.thread.tid, d.thread.thread_name = int(thread[0]), int(thread[1]), name
            self.out.descriptor(d)
        return self.uuids[key]


class _Writer:
    """Packets as bytes (proto_wire), flushed in large writes; interned names, frames and stacks
    are sent with the first packet that uses them."""

    def __init__(self, f):
        self.f, self.chunks, self.first = f, [], True
        self.names, self.functions, self.paths, self.mappings, self.frames, self.stacks = ({} for _ in range(6))
        # for speed, beside the interning tables: the run's stack_id -> callstack iid, (function, file) -> frame iid
        self.by_stack, self.frame_iid = {}, {}

    @staticmethod
    def _intern(table: dict, key, new: list, entry) -> int:
        """The iid of key; the first time, entry(iid) goes into this packet's interned data."""
        iid = table.get(key)
        if iid is None:
            iid = table[key] = len(table) + 1
            new.append(entry(iid))
        return iid

    def _packet(self, body: bytes, interned: bool = False) -> None:
        flags = (pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED if self.first else 0) | \
            (pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE if interned else 0)
        self.first = False
        head = SEQ_HEAD + (W.T.flags + W.varint(flags) if flags else b"")
        self.chunks.append(W.sub(W.T.packet, head + body))
        if len(self.chunks) >= 8192:
            self.flush()

    def raw(self, packet: bytes) -> None:
        """A whole packet, encoded elsewhere (it must need no incremental state)."""
        assert not self.first
        self.chunks.append(packet)
        if len(self.chunks) >= 8192:
            self.flush()

    def flush(self) -> None:
        self.f.write(b"".join(self.chunks))
        self.chunks.clear()

    def descriptor(self, d: pb.TrackDescriptor) -> None:
        self._packet(W.sub(W.T.descriptor, d.SerializeToString()))

    def event(self, ts: int, kind: int, track: int, name=None, value=None, flow_out=None, flow_in=None,
              args: dict | None = None) -> None:
        e = W.T.ev_type + W.varint(kind) + W.T.ev_track + W.varint(track)
        new = []
        if name is not None:
            e += W.T.ev_name + W.varint(self._intern(self.names, name, new, lambda i: W.sub(
                W.T.in_event_names, W.T.iid + W.varint(i) + W.sub(W.T.name, name.encode()))))
        if value is not None:
            e += W.double(W.T.ev_value, float(value))
        for f in flow_out or ():  # flows that start at this slice or pass through it
            e += W.fixed64(W.T.ev_flow, f)
        for f in flow_in or ():
            e += W.fixed64(W.T.ev_flow_end, f)
        for k, v in (args or {}).items():
            v = W.T.arg_int + W.varint(int(v) & W.U64) if isinstance(v, (int, np.integer)) \
                else W.sub(W.T.arg_str, str(v).encode())
            e += W.sub(W.T.ev_arg, W.sub(W.T.arg_name, k.encode()) + v)
        interned = W.sub(W.T.interned, b"".join(new)) if new else b""
        self._packet(W.T.ts + W.varint(int(ts)) + interned + W.sub(W.T.track_event, e), name is not None)

    def sample(self, ts: int, pid: int, tid: int, stack_id: int, frames: list[tuple[str, str]]) -> None:
        """A CPU sample; frames are (function, file), root first, of the run's stack stack_id."""
        new, cs = [], self.by_stack.get(stack_id)
        if cs is None:
            cs = self.by_stack[stack_id] = self._callstack(frames, new)
        body = (W.T.sample_pid + W.varint(int(pid)) + W.T.sample_tid + W.varint(int(tid))
                + W.T.sample_stack + W.varint(cs))
        interned = W.sub(W.T.interned, b"".join(new)) if new else b""
        self._packet(W.T.ts + W.varint(int(ts)) + interned + W.sub(W.T.perf_sample, body), True)

    def _callstack(self, frames: list[tuple[str, str]], new: list) -> int:
        ids = [self.frame_iid.get(f) or self._frame(*f, new) for f in frames]
        return self._intern(self.stacks, tuple(ids), new, lambda i: W.sub(
            W.T.in_stacks, W.T.iid + W.varint(i) + b"".join(W.T.stack_frame + W.varint(f) for f in ids)))

    def _frame(self, function: str, path: str, new: list) -> int:
        fn = self._intern(self.functions, function, new, lambda i: W.sub(
            W.T.in_functions, W.T.iid + W.varint(i) + W.sub(W.T.string, function.encode())))
        pth = self._intern(self.paths, path, new, lambda i: W.sub(
            W.T.in_paths, W.T.iid + W.varint(i) + W.sub(W.T.string, path.encode())))
        mp = self._intern(self.mappings, pth, new, lambda i: W.sub(
            W.T.in_mappings, W.T.iid + W.varint(i) + W.T.mapping_path + W.varint(pth)))
        iid = self.frame_iid[(function, path)] = self._intern(self.frames, (fn, mp), new, lambda i: W.sub(
            W.T.in_frames, W.T.iid + W.varint(i) + W.T.frame_function + W.varint(fn)
            + W.T.frame_mapping + W.varint(mp)))
        return iid


def write(run: RunDir) -> None:
    procs, msgs, tasks = run.table("processes"), run.table("messages"), run.table("attempts")
    with open_new(run.trace) as f:
        w = _Writer(f)
        tracks = _Tracks(w)
        proc_track = {r.name: tracks.get(("proc", r.name), r.name, pid=r.pid)
                      for r in procs.itertuples() if pd.notna(r.pid)}
        threads = _Threads(run.table("samples"), run.table("thread_names", missing_ok=True), tracks, proc_track)
        pids = procs.dropna(subset=["pid"]).set_index("name").pid.astype("int64").to_dict()
        flows = _task_flows(tasks, msgs)
        ran_on = attempt_threads(tasks, run.table("threads", missing_ok=True).reindex(columns=THREAD_COLUMNS)).tid
        slices = pd.concat([_compute_slices(tasks.assign(tid=ran_on), tracks, proc_track, threads, pids, flows),
                            _message_slices(msgs, tracks, proc_track, flows),
                            _dispatch_slices(msgs, run.table("graphs"), tracks, proc_track),
                            _gil_slices(run.table("gil_waits"), threads),
                            _offcpu_slices(run.table("offcpu"), threads),
                            _path_slices(run, tracks)], ignore_index=True)
        counters = pd.concat([_in_flight(run, tracks, proc_track), _message_rate(msgs, tracks),
                              _proc_counters(run.table("proc"), tracks, proc_track)], ignore_index=True)
        samples = _cpu_samples(run, threads)
        _emit(w, _no_overlap(slices), counters, samples)


def _slices(track, start, end, name, flow_out=None, flow_in=None, args=None) -> pd.DataFrame:
    n = len(start)
    return pd.DataFrame({"track": track, "start": np.asarray(start, dtype="int64"),
                         "end": np.asarray(end, dtype="int64"), "name": name,
                         "flow_out": flow_out if flow_out is not None else [None] * n,
                         "flow_in": flow_in if flow_in is not None else [None] * n,
                         "args": args if args is not None else [None] * n})


class _TaskFlows(NamedTuple):
    """One flow per finished attempt: from its compute-task's arrival through its compute slice to
    its task-finished leaving. starts/ends: msg_id -> flow ids; attempt: attempts row -> flow id."""
    starts: dict
    ends: dict
    attempt: dict


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
    return _TaskFlows(a.groupby("start").flow.agg(list).to_dict(), a.groupby("end").flow.agg(list).to_dict(),
                      dict(zip(a["index"], a.flow)))


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
    args = [{"key": k, "nbytes": int(b) if pd.notna(b) else -1} for k, b in zip(t.key, t.nbytes)]
    through = [[f] if (f := flows.attempt.get(i)) is not None else None for i in t.index]
    return _slices(track, t.compute_start_ns, t.compute_stop_ns, t.prefix, flow_out=through, args=args)


def _message_slices(msgs, tracks, proc_track, task_flows: _TaskFlows) -> pd.DataFrame:
    """A send slice spans the first to last byte at the proxy; the receive
    slice starts at the last byte. Both are observed at the proxy."""
    ops = msgs.groupby("msg_id", sort=False)
    m = ops.first()
    names = _batch_names(msgs).reindex(m.index)
    keys = ops.n_keys.sum()
    send = [tracks.get(("send", c, d), f"send → {dst} (conn {c})", parent=proc_track.get(src))
            for c, d, src, dst in zip(m.conn, m.direction, m.src, m.dst)]
    recv = [tracks.get(("recv", c, d), f"recv ← {src} (conn {c})", parent=proc_track.get(dst))
            for c, d, src, dst in zip(m.conn, m.direction, m.src, m.dst)]
    flow = (m.index.to_numpy() + 1).tolist()
    args = [{"bytes": int(b), "ops": int(n), "keys": int(k)}
            for b, n, k in zip(m.msg_bytes, m.batch_size, keys)]
    return pd.concat([
        _slices(send, m.t_first_ns, m.t_last_ns, names.to_numpy(), flow_out=[[f] for f in flow],
                flow_in=[task_flows.ends.get(i) for i in m.index], args=args),
        _slices(recv, m.t_last_ns, m.t_last_ns, names.to_numpy(), flow_in=[[f] for f in flow],
                flow_out=[task_flows.starts.get(i) for i in m.index], args=args),
    ], ignore_index=True)


def _path_slices(run: RunDir, tracks) -> pd.DataFrame:
    """The critical path of each job on a track of its own: each segment named by its part, with
    its key, process and category (the analysis' attribution), so the path reads left to right."""
    if not run.has_table("critical_path"):
        return _slices([], [], [], [])
    path = run.table("critical_path")
    top = tracks.get(("critical path",), "critical path (daskprobe)")
    track = [tracks.get(("critical path", j), f"critical path, job {j}" if j >= 0 else "client, between jobs",
                        parent=top) for j in path.job]
    args = [{"kind": k, "key": key or "", "process": p or ""} for k, key, p in zip(path.kind, path.key, path.process)]
    return _slices(track, path.start_ns, path.end_ns, path.part.to_numpy(), args=args)


def _batch_names(msgs: pd.DataFrame) -> pd.Series:
    """Per message: its op, or for a batch "batch: op×n, ..." (commonest first)."""
    counts = msgs.groupby(["msg_id", "op"], sort=False).size().rename("n").reset_index()
    counts = counts.sort_values(["msg_id", "n"], ascending=[True, False], kind="stable")
    single = counts.groupby("msg_id").op.transform("size").eq(1) & counts.n.eq(1)
    part = counts.op.where(single, counts.op + "×" + counts.n.astype("str"))
    names = part.groupby(counts.msg_id, sort=False).agg(", ".join)
    return names.where(names.index.isin(counts.msg_id[single]), "batch: " + names)


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
    """Thread tracks (named by the Python sampler where it saw the thread, else by the kernel), made on first use,
    with child tracks for the thread's GIL waits and off-CPU time."""

    def __init__(self, samples: pd.DataFrame, comms: pd.DataFrame, tracks: _Tracks, proc_track: dict):
        self.tracks, self.proc_track = tracks, proc_track
        named = samples.dropna(subset=["thread_name"]) if "thread_name" in samples else samples.iloc[:0]
        named = named[named.thread_name != ""]
        self.names = dict(zip(zip(comms.pid, comms.tid), comms.comm)) | dict(zip(zip(named.pid, named.tid),
                                                                                named.thread_name))

    def track(self, process: str, pid: int, tid: int) -> int | None:
        if process not in self.proc_track:
            return None
        name = self.names.get((pid, tid)) or f"thread {tid}"
        return self.tracks.get(("thread", pid, tid), name, parent=self.proc_track[process], thread=(pid, tid))

    def child(self, kind: str, process: str, pid: int, tid: int) -> int | None:
        parent = self.track(process, pid, tid)
        return None if parent is None else self.tracks.get((kind, pid, tid), kind, parent=parent)


def _cpu_samples(run: RunDir, threads: _Threads) -> pd.DataFrame:
    """On-CPU samples (py-spy and eBPF) with their stacks, root first, on thread tracks."""
    s = run.table("samples")
    s = s[s.active.astype(bool) & s.process.isin(list(threads.proc_track))]
    # py-spy falls back to the pthread id where it cannot read the native one (older Pythons):
    # no thread track can carry it, so those samples stay in the tables only, and are counted.
    native = s.tid.between(0, 2**31 - 1)
    run.update_meta(trace={"samples_without_native_tid": int((~native).sum())})
    s = s[native]
    frames = run.table("frames").set_index("frame_id")
    label = (frames.function + " (" + frames.filename.map(_short) + ")").to_dict()
    path = frames.filename.to_dict()
    stacks = {r.stack_id: [(label[i], path[i]) for i in reversed(r.frame_ids)]
              for r in run.table("stacks").itertuples()}
    for pid, tid, process in s[["pid", "tid", "process"]].drop_duplicates().itertuples(index=False):
        threads.track(process, pid, tid)
    return pd.DataFrame({"ts": s.t_ns, "pid": s.pid, "tid": s.tid, "stack_id": s.stack_id,
                         "frames": s.stack_id.map(stacks)})


def _gil_slices(gil: pd.DataFrame, threads: _Threads) -> pd.DataFrame:
    gil = gil[gil.process.isin(list(threads.proc_track))]
    track = [threads.child("GIL wait", *k) for k in zip(gil.process, gil.pid, gil.tid)]
    return _slices(track, gil.start_ns, gil.end_ns, "take_gil wait")


def _offcpu_slices(off: pd.DataFrame, threads: _Threads) -> pd.DataFrame:
    """Off-CPU time as 'blocked' (until woken) then 'runnable' (woken, waiting for a CPU)."""
    off = off[off.process.isin(list(threads.proc_track))]
    track = [threads.child("off-CPU", *k) for k in zip(off.process, off.pid, off.tid)]
    ready = off.out_ns + off.blocked_ns
    blocked = _slices(track, off.out_ns, ready, "blocked")
    return pd.concat([blocked[off.blocked_ns.to_numpy() > 0], _slices(track, ready, off.in_ns, "runnable")],
                     ignore_index=True)


def _short(path: str) -> str:
    return "/".join(path.split("/")[-2:])


def _no_overlap(s: pd.DataFrame) -> pd.DataFrame:
    """Slices on one track must nest; ours are sequential, so clip each start
    to the previous end (clock noise of a few µs) and give each 1 ns at least."""
    s = s.sort_values(["track", "start", "end"], kind="stable").reset_index(drop=True)
    start, end, track = s.start.to_numpy().copy(), s.end.to_numpy().copy(), s.track.to_numpy()
    for i in range(len(s)):
        if i and track[i] == track[i - 1]:
            start[i] = max(start[i], end[i - 1])
        end[i] = max(end[i], start[i] + 1)
    return s.assign(start=start, end=end)


SAMPLE = -1


def _emit(w: _Writer, slices: pd.DataFrame, counters: pd.DataFrame, samples: pd.DataFrame) -> None:
    # At equal times: ends, then counters and samples, then begins, so adjacent slices do not cross.
    begins = slices.assign(ts=slices.start, order=2, kind=BEGIN)
    ends = slices.assign(ts=slices.end, order=0, kind=END)
    cnt = counters.assign(order=1, kind=COUNTER)
    smp = samples.assign(order=1, kind=SAMPLE, track=0)
    ev = pd.concat([begins, ends, cnt, smp], ignore_index=True).sort_values(["ts", "order"], kind="stable")
    ev["track"] = ev.track.astype("int64")
    ev["packet"] = None  # ends and counters need no interning: encoded together, in bulk
    for kind, extra in ((END, []), (COUNTER, ["value"])):
        mask = (ev.kind == kind).to_numpy()
        if mask.any():
            ev.loc[mask, "packet"] = pd.Series(_bulk(ev[mask], kind, extra), index=ev.index[mask], dtype=object)
    cols = ["kind", "ts", "track", "name", "flow_out", "flow_in", "args", "pid", "tid", "stack_id", "frames", "packet"]
    for kind, ts, track, name, flow_out, flow_in, args, pid, tid, stack_id, frames, packet in zip(
            *(ev[c].tolist() if c in ev else [None] * len(ev) for c in cols)):
        if kind == SAMPLE:
            w.sample(ts, pid, tid, stack_id, frames)
        elif kind == BEGIN:
            w.event(ts, BEGIN, track, name=name, flow_out=flow_out, flow_in=flow_in, args=args)
        else:
            w.raw(packet)
    w.flush()


def _bulk(ev: pd.DataFrame, kind: int, extra: list[str]) -> list[bytes]:
    """Whole packets (no interned data) for track events of one kind, encoded together."""
    te = [W.T.ev_type + W.varint(kind) + W.T.ev_track, W.varints(ev.track.to_numpy("int64"))]
    if extra:  # double_counter_value: 8 bytes, little-endian, as the wire wants
        te += [W.T.ev_value, ev.value.to_numpy("float64").astype("<f8").view(np.uint8).reshape(-1, 8)]
    body = [SEQ_HEAD + W.T.ts, W.varints(ev.ts.to_numpy("int64")), W.T.track_event, W.sized(te), *te]
    return W.rows([W.T.packet, W.sized(body), *body])
