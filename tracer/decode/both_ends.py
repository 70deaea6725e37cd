"""The messages of an attached cluster as every host's tap saw them, made one capture. A
connection between two hosts is recorded at both of its ends (by the recorder's tap and by the
agents'; a bridge between them may see it too): it is kept once, decoded from the view that
saw most of it, and each of its messages takes its first byte from the sender's host and its
last byte from the receiver's, so that the time between them is the time it was on the wire.

Before that the hosts' clocks are set by the same messages: none arrives before it left, so on
each link the quickest message each way bounds the offset between its two hosts, as NTP's
exchanges do, and far tighter than the round trips through Dask's comms that the agents were
first placed with (those stay in run.json as `rtt_offset_ns`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ...probes.proxy_capture import Capture, read_capture
from ...probes.rundir import RunDir
from ...probes.schema import HOST_PID
from ...probes.sockets import host_of

CONN_BASE = 1 << 24  # host k's connections: k·CONN_BASE + its tap's number
MATCH_WINDOW_NS = 1_000_000_000  # where two views of a stream may start apart, once on one clock
ALIGN_CHECK = 64  # messages compared to tell where two views of a stream line up
TIMES = {"messages": ("t_first_ns", "t_last_ns"), "connections": ("opened_ns", "closed_ns"),
         "malformed": ("t_ns",), "lost": ("t_ns",), "skipped": ("t_ns",), "gaps": ("t_ns",), "drops": ("t_ns",)}


@dataclasses.dataclass
class View:
    """One host's capture: `hosts` its addresses (the recorder's: those of its members)."""

    hosts: set[str]
    name: str
    cap: Capture
    streams: dict = dataclasses.field(default_factory=dict)  # (conn, direction) -> its messages' rows

    def stream(self, conn: int, direction: int) -> pd.DataFrame:
        """The messages one way on a connection, in order (looked up once for all of them: a run
        may have thousands of connections)."""
        if not self.streams:
            self.streams = self.cap.messages.groupby(["conn", "direction"]).indices
        return self.cap.messages.iloc[self.streams.get((conn, direction), [])]


def merged(run: RunDir, local: Capture, procs: pd.DataFrame, hosts: dict) -> Capture:
    """One capture of the recorder's tap and its agents' (run.json `hosts`: their numbers and clock
    offsets, which this sets anew from the messages where it can)."""
    views = [View(set(procs.listen[procs.host == "local"].dropna().map(host_of)), "local", local)]
    for host, h in sorted(hosts.items(), key=lambda x: x[1]["number"]):
        path = run / "hosts" / host / "captures" / "tap.bin"
        if path.exists():
            views.append(View({host}, host, _renumbered(read_capture(path), h)))
    if len(views) == 1:
        return local
    groups = _groups(views)
    for name, clock in clocks(_quickest(views, groups)).items():
        for v in views:
            if v.name == name:
                _shift(v.cap, clock["correction"])
        if name in hosts:
            h = hosts[name]
            h.setdefault("rtt_offset_ns", h["offset_ns"])
            h.update(offset_ns=h["offset_ns"] + clock["correction"], uncertainty_ns=clock["uncertainty"],
                     clock_from="messages", clock_stamps_set_aside=clock["set_aside"])
    return _one(views, groups)


def _renumbered(cap: Capture, host: dict) -> Capture:
    """Another host's capture on the run's clock (its round-trip offset), its connection numbers
    and pids the run's."""
    base = host["number"]
    for table in TIMES:
        df = getattr(cap, table)
        if "conn" in df:
            df["conn"] = df.conn.astype("int64") + base * CONN_BASE
        if table == "connections" and "peer_pid" in df:
            df["peer_pid"] = df.peer_pid.where(df.peer_pid < 0, df.peer_pid + base * HOST_PID)
    _shift(cap, host["offset_ns"])
    return cap


def _shift(cap: Capture, ns: int) -> None:
    for table, cols in TIMES.items():
        df = getattr(cap, table)
        for c in cols:
            if c in df:
                df[c] = df[c] + ns


def _groups(views: list[View]) -> list[dict[int, int]]:
    """Connections seen by more than one view: view index -> its conn number there."""
    seen: dict[tuple, dict[int, int]] = {}
    for k, v in enumerate(views):
        c = v.cap.connections
        if c.empty:
            continue
        for conn, listen, peer in zip(c.conn, c.listen, c.peer_addr):
            seen.setdefault((listen, peer), {}).setdefault(k, conn)
    return [g for g in seen.values() if len(g) > 1]


def _ends(views: list[View], group: dict[int, int], direction: int) -> tuple[int | None, int | None]:
    """The views at the sending and the receiving end of a direction of a connection."""
    c = views[next(iter(group))].cap.connections
    row = c[c.conn == group[next(iter(group))]].iloc[0]
    sender, receiver = (row.peer_addr, row.listen) if direction == 0 else (row.listen, row.peer_addr)
    at = {k: views[k].hosts for k in group}
    find = lambda addr: next((k for k, h in at.items() if host_of(addr) in h), None)
    return find(sender), find(receiver)


def align(a_bytes: np.ndarray, a_t: np.ndarray, b_bytes: np.ndarray, b_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(i, j): a[i] and b[j] are the same message. One view may have started later (it joined the
    stream at a message boundary), so the sequences line up at a shift: the one at which their
    sizes agree best, of those that start within MATCH_WINDOW_NS; the closer in time if tied."""
    if not len(a_bytes) or not len(b_bytes):
        return np.array([], int), np.array([], int)
    shifts = [i for i in np.flatnonzero(np.abs(a_t - b_t[0]) < MATCH_WINDOW_NS)] + \
             [-j for j in np.flatnonzero(np.abs(b_t - a_t[0]) < MATCH_WINDOW_NS)]
    best, score = None, (-1.0, 0.0)
    for k in set(shifts):
        i = np.arange(max(k, 0), min(len(a_bytes), len(b_bytes) + k))[:ALIGN_CHECK]
        if not len(i):
            continue
        s = ((a_bytes[i] == b_bytes[i - k]).mean(), -np.median(np.abs(a_t[i] - b_t[i - k])))
        if s > score:
            best, score = k, s
    if best is None or score[0] < 0.9:
        return np.array([], int), np.array([], int)
    i = np.arange(max(best, 0), min(len(a_bytes), len(b_bytes) + best))
    same = a_bytes[i] == b_bytes[i - best]
    return i[same], (i - best)[same]


def _pairs(views: list[View], group: dict[int, int], x: int, y: int, direction: int):
    a, b = views[x].stream(group[x], direction), views[y].stream(group[y], direction)
    i, j = align(a.msg_bytes.to_numpy(), a.t_first_ns.to_numpy(), b.msg_bytes.to_numpy(), b.t_first_ns.to_numpy())
    return a.iloc[i], b.iloc[j]


def _quickest(views: list[View], groups: list[dict[int, int]]) -> dict[tuple[str, str], np.ndarray]:
    """(sending host, receiving host) -> the times from each message's first byte at the one to its
    first byte at the other (ns, on the clocks as they are now)."""
    out: dict[tuple[str, str], list] = {}
    for g in groups:
        for d in (0, 1):
            s, r = _ends(views, g, d)
            if s is None or r is None or s == r:
                continue
            a, b = _pairs(views, g, s, r, d)
            out.setdefault((views[s].name, views[r].name), []).append(b.t_first_ns.to_numpy() - a.t_first_ns.to_numpy())
    return {k: np.concatenate(v) for k, v in out.items() if sum(map(len, v))}


def consistent(xy: np.ndarray, yx: np.ndarray) -> tuple[int, int, int] | None:
    """The quickest time each way on a link, and how many stamps were set aside for it: two one-way
    times cannot sum to less than nothing, so while the two quickest do, the one further below
    the next quickest of its way is a bad stamp (a clock read cut by preemption), and goes; at most
    1% of either way. None if that does not make them sum to zero or more."""
    a, b = np.sort(xy), np.sort(yx)
    i = j = 0
    while a[i] + b[j] < 0:
        below_a = a[i + 1] - a[i] if i + 1 < len(a) else -1
        below_b = b[j + 1] - b[j] if j + 1 < len(b) else -1
        i, j = (i + 1, j) if below_a >= below_b else (i, j + 1)
        if i >= max(1, len(a) // 100) + 1 or j >= max(1, len(b) // 100) + 1 or i == len(a) or j == len(b):
            return None
    return int(a[i]), int(b[j]), i + j


def clocks(times: dict[tuple[str, str], np.ndarray]) -> dict[str, dict]:
    """Each host's correction to its clock and its uncertainty (ns), from the quickest message each
    way on the links between hosts: along a spanning tree from the recorder's host (else the host
    with most links), each correction the midpoint that makes the two ways equally quick; then
    every link's bound held (no message arrives before it left), a host moved for it the less
    certain by as much. The root is not corrected."""
    quickest, links, set_aside = {}, {}, {}
    for (x, y), xy in times.items():
        if (y, x) not in times:
            quickest[x, y] = int(xy.min())  # one way only: a bound, not an estimate
        elif x < y and (both := consistent(xy, times[y, x])):  # each link once
            quickest[x, y], quickest[y, x], set_aside[x, y] = both
            links.setdefault(x, set()).add(y)
            links.setdefault(y, set()).add(x)
    if not links:
        return {}
    root = "local" if "local" in links else max(sorted(links), key=lambda n: len(links[n]))
    c, u, queue = {root: 0.0}, {root: 0.0}, [root]
    while queue:
        x = queue.pop(0)
        for y in sorted(links[x] - c.keys()):
            c[y] = c[x] + (quickest[y, x] - quickest[x, y]) / 2
            u[y] = u[x] + (quickest[x, y] + quickest[y, x]) / 2
            queue.append(y)
    for _ in range(4 * len(c)):  # links off the tree: a cycle of hosts the midpoints disagree on
        bad = [(x, y) for (x, y), d in quickest.items() if x in c and y in c and d + c[y] - c[x] < 0]
        for x, y in bad:
            gap = c[x] - c[y] - quickest[x, y]
            for n, move in ((y, 0 if y == root else (gap if x == root else gap / 2)),
                            (x, 0 if x == root else -(gap if y == root else gap / 2))):
                c[n] += move
                u[n] += abs(move)
        if not bad:
            break
    return {n: {"correction": round(c[n]), "uncertainty": round(u[n]),
                "set_aside": sum(k for (x, y), k in set_aside.items() if n in (x, y))} for n in c if n != root}


def _one(views: list[View], groups: list[dict[int, int]]) -> Capture:
    """Each connection once (from the view with most of its messages), its messages' first bytes
    from the sender's view and last bytes from the receiver's where those saw them."""
    for v in views:
        v.cap.messages["both_ends"] = False
    dropped: dict[int, set[int]] = {k: set() for k in range(len(views))}
    for g in groups:
        counts = {k: len(views[k].stream(conn, 0)) + len(views[k].stream(conn, 1)) for k, conn in g.items()}
        primary = max(g, key=lambda k: (counts[k], -k))
        dropped.update({k: dropped[k] | {conn} for k, conn in g.items() if k != primary})
        c = views[primary].cap.connections
        c.loc[c.conn == g[primary], "peer_pid"] = max(_peer_pid(views[k], conn) for k, conn in g.items())
        for d in (0, 1):
            _take_ends(views, g, primary, d)
    return _concat(views, dropped)


def _peer_pid(v: View, conn: int) -> int:
    c = v.cap.connections
    return int(c.peer_pid[c.conn == conn].max())


def _take_ends(views: list[View], g: dict[int, int], primary: int, d: int) -> None:
    s, r = _ends(views, g, d)
    if s is None or r is None or s == r:
        return
    m = views[primary].cap.messages
    got = {}
    for end, col in ((s, "t_first_ns"), (r, "t_last_ns")):
        if end == primary:
            got[col] = views[primary].stream(g[primary], d).index
        else:
            a, b = _pairs(views, g, primary, end, d)
            m.loc[a.index, col] = b[col].to_numpy()
            got[col] = a.index
    m.loc[got["t_first_ns"].intersection(got["t_last_ns"]), "both_ends"] = True


def _concat(views: list[View], dropped: dict[int, set[int]]) -> Capture:
    parts = {t: [] for t in TIMES}
    data, at = [], 0
    for k, v in enumerate(views):
        for t in TIMES:
            df = getattr(v.cap, t)
            parts[t].append(df[~df.conn.isin(dropped[k])] if "conn" in df else df)
        m = parts["messages"][-1] = parts["messages"][-1].copy()
        m["at"] += at
        m["frame0_at"] = m.frame0_at.where(m.frame0_at < 0, m.frame0_at + at)
        data.append(v.cap.data)
        at += len(v.cap.data)
    tables = {t: pd.concat([p for p in ps if not p.empty] or ps[:1], ignore_index=True) for t, ps in parts.items()}
    m = tables["messages"].drop(columns="msg_id").sort_values("t_first_ns", kind="stable", ignore_index=True)
    m.insert(0, "msg_id", np.arange(len(m)))
    return Capture(messages=m, connections=tables["connections"], malformed=tables["malformed"],
                   lost=tables["lost"], skipped=tables["skipped"], gaps=tables["gaps"], drops=tables["drops"],
                   data=b"".join(data),
                   torn_bytes=sum(v.cap.torn_bytes for v in views))
