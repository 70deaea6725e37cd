"""Read the eBPF agent's captures (see ebpf_agent.py) into tables."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from . import ebpf_format
from .base import missing_binary, native_binary, tsv_rows

SYMBOL = re.compile(r"^(.*?)(?: \[(.*)\])?$")
EVENTS, USTACKS, MAPS = "ebpf_events.bin", "ebpf_ustacks.bin", "ebpf_maps.tsv"
RECORD = ebpf_format.numpy_record_dtype()
NOT_READ = "not read, its frames unnamed: "  # daskprobe-unwind's line for a file it refused (open.rs)


def _unwinder(args: list[str], stdin: str | None = None,
              unread: list[str] | None = None) -> tuple[dict[str, str], str | None]:
    """daskprobe-unwind's answer, {N: frames}, and why it failed (None if it did not). The mapped files
    it did not read ("PATH: why") go into `unread`, else on our stderr."""
    binary = native_binary("daskprobe-unwind")
    if binary is None:
        return {}, missing_binary("daskprobe-unwind")
    done = subprocess.run([binary, *args], input=stdin, capture_output=True, text=True, errors="replace")
    frames = dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)
    if not done.returncode and unread is not None:
        unread += [line.split(NOT_READ, 1)[1] for line in done.stderr.splitlines() if NOT_READ in line]
    elif not done.returncode:
        _tell_not_read(done.stderr)
    # the reason goes into a frame's name: no frame separators in it
    why = re.sub(r"\s*[;\t\n]+\s*", " ", done.stderr.strip()[-200:]) or f"exit code {done.returncode}"
    return frames, (f"daskprobe-unwind failed: {why}" if done.returncode else None)


def _tell_not_read(said: str, most: int = 10) -> None:
    """The mapped files daskprobe-unwind did not read (its checks: open.rs), and why, on our stderr:
    their frames are unnamed. The count, then the first few."""
    files = [line for line in said.splitlines() if NOT_READ in line]
    total = [line for line in said.splitlines() if "mapped files not read" in line]
    for line in total + files[:most] + [f"daskprobe-unwind: ... and {len(files) - most} more"] * (len(files) > most):
        print(line, file=sys.stderr)


def unwind(captures: Path, unread: list[str] | None = None) -> dict[str, str]:
    """Each "@N" -> the frames of the Nth copied user stack, unwound and symbolized by daskprobe-unwind.
    A stack it could not unwind stays a "[not unwound: why]" frame rather than failing the run."""
    if not (captures / USTACKS).exists():
        return {}
    offsets = ",".join(f"{k}={v}" for k, v in ebpf_format.ustack_offsets().items())
    frames, why = _unwinder(["--stacks", str(captures / USTACKS), "--maps", str(captures / MAPS),
                             "--record", str(ebpf_format.USTACK_SIZE), "--offsets", offsets], unread=unread)
    count = (captures / USTACKS).stat().st_size // ebpf_format.USTACK_SIZE
    return {f"@{n}": f"[not unwound: {why}]" if why else frames.get(str(n), "[lost]") for n in range(count)}


def symbolize(captures: Path, rows: pd.DataFrame, unread: list[str] | None = None) -> dict[tuple[int, str], str]:
    """(pid, "#ADDR,...") -> the frames of that stack, symbolized by daskprobe-unwind from the process's
    mappings (those of its first sample's time)."""
    first = rows[rows.user.str.startswith("#")].groupby(["pid", "user"], sort=False).t.min()
    lines = "".join(f"{pid}\t{t}\t{user[1:]}\n" for (pid, user), t in first.items())
    frames, why = _unwinder(["--maps", str(captures / MAPS), "--addresses"], lines, unread)
    return {k: frames.get(str(n), f"[not symbolized: {why or 'no answer for it'}]") for n, k in enumerate(first.index)}


def read_cpu(path: Path, frame_base: int, stack_base: int,
             unread: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(samples, stacks, frames) like pyspy.read_samples, ids starting at the bases; the mapped files
    daskprobe-unwind did not read ("PATH: why", its frames in them unnamed) into `unread`, else on stderr.
    A stack is the kernel frames then the user frames, leaf first."""
    frames, stacks, samples = {}, {}, []
    rows = tsv_rows(path, {"t": "int64", "pid": "int64", "tid": "int64", "cpu": "int64", "user": "str",
                           "kernel": "str"})
    if rows.user.str.startswith("@").any():
        unwound = unwind(path.parent, unread)
        rows["user"] = rows.user.map(lambda u: unwound.get(u, "[lost]") if u.startswith("@") else u)
    if rows.user.str.startswith("#").any():
        named = symbolize(path.parent, rows, unread)
        rows["user"] = [named.get((pid, u), u) for pid, u in zip(rows.pid, rows.user)]
    for t, pid, tid, cpu, user, kernel in rows.itertuples(index=False):
        ids = []
        for kind, part in (("kernel", kernel), ("native", user)):
            for sym in filter(None, part.split(";")):
                ids.append(frames.setdefault((sym, kind), frame_base + len(frames)))
        stack = stacks.setdefault(tuple(ids), stack_base + len(stacks))
        samples.append(("ebpf", int(t), int(pid), int(tid), int(cpu), stack))
    s = pd.DataFrame(samples, columns=["source", "t_ns", "pid", "tid", "cpu", "stack_id"])
    s["active"] = True
    st = pd.DataFrame({"stack_id": list(stacks.values()), "frame_ids": [list(k) for k in stacks]})
    fr = pd.DataFrame([(i, *SYMBOL.match(sym).groups(), 0, kind) for (sym, kind), i in frames.items()],
                      columns=["frame_id", "function", "filename", "line", "kind"])
    fr["filename"] = fr.filename.fillna("[kernel]")
    return s, st, fr


def read_events(path: Path) -> pd.DataFrame:
    """The agent's binary events; a record torn by a kill is dropped."""
    raw = path.read_bytes() if path.exists() else b""
    records = np.frombuffer(raw, RECORD, count=len(raw) // RECORD.itemsize)
    return pd.DataFrame(records["event"][records["ring_len"] == ebpf_format.SIZE])


def _of_kind(events: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The events of a kind, their fields named by ebpf_format.KINDS."""
    number, columns, _ = ebpf_format.KINDS[kind]
    df = events.loc[events.kind == number, list(columns)].rename(columns=columns)
    return df.astype("int64").reset_index(drop=True)


def read_gil(events: pd.DataFrame) -> pd.DataFrame:
    df = _of_kind(events, "gil")
    df["wait_ns"] = df.end_ns - df.start_ns
    return df


def read_offcpu(events: pd.DataFrame) -> pd.DataFrame:
    """Off-CPU intervals. prev_state 0: preempted, runnable the whole time;
    else blocked until the wakeup, then runnable until back on a CPU. An interval still open when
    the captures were read (an agent's) was written then up to that moment, and again later: its
    longest record (the latest in_ns) stands."""
    df = _of_kind(events, "offcpu")
    df = df.sort_values("in_ns", kind="stable").drop_duplicates(["pid", "tid", "out_ns"], keep="last").sort_index()
    df = df.reset_index(drop=True)
    woken = (df.prev_state != 0) & (df.wakeup_ns > 0)
    ready = df.wakeup_ns.where(woken, df.out_ns)
    df["blocked_ns"] = (ready - df.out_ns).where(df.prev_state != 0, 0)
    df["runnable_ns"] = df.in_ns - ready
    return df


def read_small(path: Path) -> pd.DataFrame:
    return tsv_rows(path, {"kind": "str", "pid": "int64", "tid": "int64", "total_ns": "int64", "count": "int64"})


def read_tcp(events: pd.DataFrame, connections: pd.DataFrame) -> pd.DataFrame:
    """Segments received, joined to the proxy's connections by port pair.
    hop 'peer': between the connecting process and the proxy; 'upstream':
    between the proxy and the process it fronts. direction as in messages."""
    df = _of_kind(events, "tcp")
    ports = df.pop("ports").to_numpy()
    df.insert(1, "local_port", ports >> 16)
    df.insert(2, "remote_port", ports & 0xFFFF)
    seq, end, fin, expected, read = _sequence(df.pop("seqs").to_numpy(), df.pop("next").to_numpy())
    keys = {}  # (receiving port, sending port) -> (conn, direction, hop)
    for c in connections.itertuples():
        peer, listen = _port(c.peer_addr), _port(c.listen)
        keys[(listen, peer)], keys[(peer, listen)] = (c.conn, 0, "peer"), (c.conn, 1, "peer")
        local, up = _port(c.upstream_local), _port(c.upstream)
        if local:
            keys[(up, local)], keys[(local, up)] = (c.conn, 0, "upstream"), (c.conn, 1, "upstream")
    joined = [keys.get((a, b), (None, None, None)) for a, b in zip(df.local_port, df.remote_port)]
    df[["conn", "direction", "hop"]] = pd.DataFrame(joined, index=df.index, columns=["conn", "direction", "hop"])
    payload, new = _payload(seq, (end - fin) % 2**32, expected)
    df["payload"] = np.where(read, payload, df.data_len)
    df["unseen"] = _unseen(df[["conn", "direction", "hop", "t_ns"]], end, expected, read)
    df["bytes"] = np.where(read, new, df.data_len) + df.unseen
    return df


def _sequence(seqs: np.ndarray, nxt: np.ndarray):
    """Where the segment's data starts (past a SYN, which takes a sequence number), its end_seq,
    whether it carries a FIN (which takes the last), the socket's rcv_nxt, and whether BPF read
    them (bit 0x100 of nxt; else data_len is all there is)."""
    seqs, nxt = seqs.astype("uint64"), nxt.astype("uint64")
    seq, end = (seqs >> 32).astype("int64"), (seqs & 0xFFFFFFFF).astype("int64")
    syn, fin = ((nxt >> 1) & 1).astype("int64"), (nxt & 1).astype("int64")
    return (seq + syn) % 2**32, end, fin, (nxt >> 32).astype("int64"), (nxt & 0x100) != 0


def _ahead(a, b):
    """a - b in sequence space (it wraps at 2**32)."""
    return (a - b + 2**31) % 2**32 - 2**31


def _payload(seq: np.ndarray, end: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each segment's payload and the part of it past the socket's rcv_nxt, not received before (TCP
    sends a segment again when its acknowledgement is late, and each is probed)."""
    payload = _ahead(end, seq)
    return payload, np.clip(np.minimum(_ahead(end, expected), payload), 0, None)


def _unseen(keys: pd.DataFrame, end: np.ndarray, expected: np.ndarray, read: np.ndarray) -> np.ndarray:
    """Bytes a socket took in between two of its segments here that no probe saw (rare: likely a
    BPF run the kernel skipped, inside another program on the same CPU): how far its rcv_nxt at a
    segment lies past the furthest end of the segments before it on the same connection, direction
    and hop."""
    df = keys.assign(end=end, expected=expected, i=np.arange(len(keys)))[read & keys.conn.notna().to_numpy()]
    out = np.zeros(len(keys), dtype="int64")
    for _, g in df.sort_values("t_ns", kind="stable").groupby(["conn", "direction", "hop"]):
        base = g.expected.iloc[0]
        reached = np.maximum.accumulate(_ahead(g.end.to_numpy(), base))
        gap = _ahead(g.expected.to_numpy()[1:], base) - reached[:-1]
        out[g.i.to_numpy()[1:]] = np.clip(gap, 0, None)
    return out


def _port(addr) -> int | None:
    return int(addr.rsplit(":", 1)[1]) if isinstance(addr, str) and ":" in addr else None


def read_status(path: Path) -> pd.DataFrame:
    return tsv_rows(path, {"status": "str", "pid": "int64", "what": "str"})


STATUS = "ebpf_status.tsv"
_LOST = re.compile(r"(\d+) events lost")  # the agent's line for its ring buffer's losses (ebpf_agent.py)


def events_lost(captures: Path) -> int:
    """Events the eBPF agent of a captures directory lost (its ring buffer was full): 0 if none, or no agent."""
    status = read_status(captures / STATUS)
    found = [int(m.group(1)) for r in status[(status.status == "E") & (status.pid == -1)].itertuples()
             if (m := _LOST.match(r.what))]
    return max(found, default=0)  # the agent's count is cumulative
