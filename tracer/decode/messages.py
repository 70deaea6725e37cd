"""Decode the proxy's capture into ops (one row per op, batches expanded) and
the task events the attempts are joined from.

Connections are independent (a reply pairs with a request on its own
connection), so a large capture is decoded by connection in parallel
processes, each reading the capture file itself.
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

from ...probes.proxy_capture import Capture, frames_at
from ...probes.schema import TABLES
from ...probes import wire

MESSAGE_COLUMNS = TABLES["messages"].names
DECODE_COLUMNS = ("frame0_at", "frame0_len", "at", "framing", "conn", "direction")
PARALLEL_FROM = 200_000  # messages: below this, starting processes costs more than it saves
CLOCK_OPS = {"heartbeat_worker", "register-worker"}
# Ops that move a dispatched task off its worker: the scheduler steals it, the
# worker asks for it to go elsewhere, or the scheduler releases it there.
MOVES = {"steal-request": "stolen", "reschedule": "rescheduled", "free-keys": "released"}

EVENT_COLUMNS = {
    "compute": {"key": pa.string(), "message": pa.int64(), "run_id": pa.int64(), "deps": pa.list_(pa.string())},
    "finished": {"key": pa.string(), "message": pa.int64(), "run_id": pa.int64(), "erred": pa.bool_(),
                 "nbytes": pa.int64(), "thread": pa.int64(), "compute_start_s": pa.float64(),
                 "compute_stop_s": pa.float64(), "transfer_start_s": pa.float64(), "transfer_stop_s": pa.float64()},
    "moves": {"key": pa.string(), "message": pa.int64(), "how": pa.string()},
    "graphs": {"message": pa.int64(), "keys": pa.list_(pa.string())},
}
OP_TYPES = {"message": pa.int64(), "op": pa.string(), "key": pa.string(), "n_keys": pa.int64(),
            "batch_index": pa.int64(), "batch_size": pa.int64(), "stimulus_id": pa.string(),
            "reply_to": pa.int64(), "error": pa.string()}


class _Events:
    """Task-lifecycle facts as row tuples, filled by the decode loop."""

    def __init__(self):
        self.rows = {name: [] for name in EVENT_COLUMNS}
        self.clock = []  # worker's message, its now, reply message, scheduler's time

    def add(self, op: str, item: dict, key, msg: int) -> None:
        if op == "compute-task":
            who_has = item.get("who_has")
            self.rows["compute"].append((key, msg, _int(item.get("run_id")),
                                         [wire.key_str(k) for k in who_has] if isinstance(who_has, dict) else []))
        elif op in ("task-finished", "task-erred"):
            self.rows["finished"].append((key, msg, _int(item.get("run_id")), op == "task-erred",
                                          _int(item.get("nbytes")), _int(item.get("thread")),
                                          *_spans(item.get("startstops"))))
        elif op == "free-keys":
            self.rows["moves"].extend((wire.key_str(k), msg, "released") for k in wire.keys_of(item))
        elif op in MOVES:
            self.rows["moves"].append((key, msg, MOVES[op]))
        elif op == "update-graph":
            self.rows["graphs"].append((msg, [wire.key_str(k) for k in wire.keys_of(item)]))

    def mark(self) -> tuple:
        return tuple(len(r) for r in self.rows.values()) + (len(self.clock),)

    def rollback(self, mark: tuple) -> None:
        """Forget what a message that then failed to decode had added."""
        for rows, n in zip(self.rows.values(), mark):
            del rows[n:]
        del self.clock[mark[-1]:]

    def tables(self) -> dict:
        """As arrow tables, which cross between processes for the cost of their buffers."""
        return {name: _arrow(rows, EVENT_COLUMNS[name]) for name, rows in self.rows.items()} | {"clock": self.clock}


EVENT_OPS = {"compute-task", "task-finished", "task-erred", "update-graph", "free-keys", *MOVES}


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63 else None


def _float(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) else None


def _arrow(rows: list[tuple], types: dict) -> pa.Table:
    # Row tuples to columns in arrow's C++, not by transposing in Python (4x faster).
    struct = pa.array(rows, type=pa.struct(list(types.items())))
    return pa.Table.from_struct_array(struct)


def _spans(startstops) -> tuple:
    """(compute start, stop, transfer start, stop), wall seconds, each the union of its kind."""
    out = [None, None, None, None]
    for s in startstops if isinstance(startstops, (list, tuple)) else ():
        action = s.get("action") if isinstance(s, dict) else None
        if action in ("compute", "transfer"):
            i = 0 if action == "compute" else 2
            start, stop = _float(s.get("start")), _float(s.get("stop"))
            if start is None or stop is None:
                continue
            out[i] = start if out[i] is None else min(out[i], start)
            out[i + 1] = stop if out[i + 1] is None else max(out[i + 1], stop)
    return tuple(out)


def messages_table(cap: Capture, conns: pd.DataFrame, jobs: int | None = None) -> tuple[pd.DataFrame, dict]:
    """One row per op (batches expanded), plus the task-lifecycle events."""
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
    ev["clock"] = sorted((r for p in parts for r in p["clock"]), key=itemgetter(0))
    return _ops_frame(m, conns, ops), ev


def _concat(parts: list[dict], name: str) -> pd.DataFrame:
    # nullable integers stay integers: through float64, 2**63-1 would come back as 2**63
    return pa.concat_tables([p[name] for p in parts]).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)


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
        mark = len(ops), ev.mark()
        try:
            msg = wire.decode_frame0(data[f0:f0 + f0_len]) if framing == "current" and f0 >= 0 \
                else wire.decode(frames_at(data, at), framing)
            _ops_of(msg, i, conn, d, greeted, pending, ops, ev, clock_requests)
        except (wire.Undecodable, TypeError, ValueError, RecursionError, OverflowError) as e:
            # Anything a peer can put in a message: recorded with its error, the rest goes on.
            del ops[mark[0]:]
            ev.rollback(mark[1])
            ops.append((i, "undecodable", None, 0, 0, 1, None, None, f"{type(e).__name__}: {e}"[:500]))
    return {"ops": _arrow(ops, OP_TYPES)} | ev.tables()


def _ops_of(msg, i, conn, d, greeted, pending, ops, ev, clock_requests) -> None:
    """Append the ops (and task events) of one decoded message."""
    if wire.is_handshake(msg) and (conn, d) not in greeted:
        greeted.add((conn, d))
        ops.append((i, "handshake", None, 0, 0, 1, None, None, None))
        return
    batched = isinstance(msg, (list, tuple))
    items = msg if batched else (msg,)
    if not items:  # an empty batch is still a message
        ops.append((i, "value", None, 0, 0, 0, None, None, None))
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
        stim = item.get("stimulus_id")
        n_keys = len(wire.keys_of(item)) if "keys" in item else 0
        ops.append((i, op, key, n_keys or int(key is not None), j, len(items),
                    stim if isinstance(stim, str) else None, None, None))
        if not batched:
            pending[(conn, d)].append(i)
        if op in EVENT_OPS:
            ev.add(op, item, key, i)
        elif op in CLOCK_OPS and isinstance(item.get("now"), float):
            clock_requests[i] = (i, item["now"])


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
    out |= {"t_first_ns": per_msg.t_first_ns, "t_last_ns": per_msg.t_last_ns,
            "both_ends": per_msg.both_ends if "both_ends" in per_msg else False, "op": ops.op, "key": ops.key,
            "n_keys": ops.n_keys, "msg_bytes": per_msg.msg_bytes, "nframes": per_msg.nframes,
            "batch_index": ops.batch_index, "batch_size": ops.batch_size, "stimulus_id": ops.stimulus_id,
            "reply_to": ops.reply_to.astype("Int64"), "error": ops.error}
    return pd.DataFrame(out, columns=MESSAGE_COLUMNS)
