"""The tables stage: decode a run's captures into parquet tables (processes,
connections, messages, attempts, graphs, and the sampling probes' tables).

Times are CLOCK_MONOTONIC nanoseconds (the run's clock). Message times are
when the proxy saw the first and the last byte of the message.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pandas as pd

from ...probes import ebpf_tables, local_scheduler, procfs, pyspy
from ...probes.proxy_capture import Capture, losses, read_capture, read_status
from ...probes.rundir import RunDir
from ...probes.schema import HOST_PID, MONO, TABLES
from ...probes.sockets import host_of, listen_of
from ..capture.attached import FOLLOW_S
from .attempts import attempts_table, clock_table, prefixes, undo_scheduler_delay
from .both_ends import merged
from .forked import beside
from .messages import messages_table
from ...probes.wire import key_str


def build(run: RunDir) -> dict:
    meta = run.meta()
    procs = processes_table(meta)
    run.write_table("processes", procs)
    hosts = meta.get("hosts", {})
    cap = _with_agents(run, procs, hosts)
    conns = connections_table(cap, procs, hosts)
    run.write_table("connections", conns)
    with beside(lambda: probe_tables(run, procs, conns)) as probes_done:  # the samplers' tables meanwhile
        msgs, events = messages_table(cap, conns)
        cap.data = b""  # the raw capture: no longer needed, and as large as the file
        run.write_table("messages", msgs)
        attempts = task_tables(events, msgs, meta["clock_anchor"])
        run.write_table("attempts", attempts)
        run.write_table("graphs", graphs_table(events["graphs"], msgs))
        run.write_table("task_stream", task_stream_table(run, procs, meta["clock_anchor"]))
        local_bad = local_tables(run)
    probed = probes_done()
    probed["malformed_lines"] |= local_bad
    if probed["failed"]:
        run.update_meta(skipped_per_process=probed["failed"])
    run.update_meta(events_lost=probed["events_lost"])
    if probed["unread_files"]:
        run.update_meta(unread_files=probed["unread_files"])
        from ..capture.say import say
        say(f"{len(probed['unread_files'])} mapped files were not read (root reads no file a cluster's user may "
            "have planted): their native frames are unnamed; which and why in run.json unread_files")
    stats = {"messages": int(msgs.msg_id.nunique()), "ops": len(msgs), "dispatches": len(attempts),
             "malformed_streams": len(cap.malformed), "undecodable_messages": int(msgs.error.notna().sum()),
             "torn_bytes": cap.torn_bytes, "lost_connections": len(cap.lost),
             "arrived_before_sent": _arrived_before_sent(msgs), "malformed_lines": probed["malformed_lines"]}
    recorder = {run.tap_capture: "tap", run.comm_capture: "comm"}.get(run.messages_capture, "proxy")
    lost = losses(cap, read_status(run.messages_capture))
    run.update_meta(capture=stats, lost={recorder: lost} if lost else {})
    _tell(stats)
    return stats


def _with_agents(run: RunDir, procs: pd.DataFrame, hosts: dict) -> Capture:
    """The recorder's capture with the agents' taps, the hosts' clocks set by them (run.json's
    `hosts` updated); if merging them fails, this host's capture alone, and the reason said: the
    run's own messages are not lost to another host's."""
    if not hosts:
        return read_capture(run.messages_capture)
    try:
        cap = merged(run, read_capture(run.messages_capture), procs, hosts)
    except Exception as e:
        from ..capture.say import say
        run.update_meta(both_ends_error=f"{type(e).__name__}: {e}")
        say(f"the agents' messages could not be merged ({type(e).__name__}: {e}): this host's only")
        return read_capture(run.messages_capture)
    run.update_meta(hosts=hosts)
    return cap


def local_tables(run: RunDir) -> dict:
    """Tables local_jobs and local_tasks, from the client hook's captures of Dask's local schedulers;
    the malformed lines left out of each (captures/NAME: how many)."""
    bad = Counter()
    jobs, tasks = local_scheduler.read_local(local_scheduler.files(run / "captures"), bad)
    run.write_table("local_jobs", jobs.assign(host="local"))  # the command runs on daskprobe's host
    run.write_table("local_tasks", tasks.assign(prefix=prefixes(tasks.key.astype("str")), host="local"))
    return {f"captures/{name}": n for name, n in bad.items() if n}


def _arrived_before_sent(msgs: pd.DataFrame) -> int:
    one = msgs[msgs.both_ends].drop_duplicates("msg_id")
    return int((one.t_last_ns < one.t_first_ns).sum())


def _tell(stats: dict) -> None:
    from ..capture.say import say
    if stats["undecodable_messages"]:
        say(f"{stats['undecodable_messages']} messages could not be decoded: rows with op 'undecodable' and "
            "their error in tables/messages.parquet; the rest is decoded")
    if stats["lost_connections"]:
        say(f"{stats['lost_connections']} connections were lost before the proxy could serve them "
            "(see logs/proxy.log)")
    if stats["arrived_before_sent"]:
        say(f"{stats['arrived_before_sent']} messages seen at both ends arrived before they left, on the hosts' "
            "clocks as set (run.json hosts: offsets and uncertainties): their wire times are below zero")
    if stats["malformed_streams"]:
        say(f"{stats['malformed_streams']} connections sent bytes that are not Dask's framing; forwarded unparsed")
    if stats["malformed_lines"]:
        say("malformed lines (torn or corrupted) left out of the captures: "
            + ", ".join(f"{n} of {name}" for name, n in stats["malformed_lines"].items()))


def probe_tables(run: RunDir, procs: pd.DataFrame, conns: pd.DataFrame) -> dict:
    """Tables of the sampling probes, this host's and those its agents read back from others;
    rows carry the name and host of their process. Returns (for run.json) what the eBPF agent
    or the Python sampler could not probe, per process ("failed"), the malformed lines left out of each capture
    ("malformed_lines": its path in the run directory: how many), the mapped files
    daskprobe-unwind did not read ("unread_files": "PATH: why", another host's prefixed by it), and the
    events the eBPF agents lost ("events_lost": {"ebpf": how many}, {} if none)."""
    tables, failed, malformed, unread = _captured(run / "captures", "local", conns)
    lost = ebpf_tables.events_lost(run / "captures")
    for number, host, offset, timens in _agent_hosts(run):
        lost += ebpf_tables.events_lost(run / "hosts" / host / "captures")
        theirs, their_failed, their_malformed, their_unread = _captured(
            run / "hosts" / host / "captures", host, conns.iloc[:0], _after(tables["frames"].frame_id),
            _after(tables["stacks"].stack_id))
        for name, df in theirs.items():
            moved = _moved(name, df, number * HOST_PID, offset, timens)
            tables[name] = pd.concat([tables[name], moved], ignore_index=True)
        failed += [f"{host} {f}" for f in their_failed]
        unread += [f"{host} {f}" for f in their_unread]
        malformed |= {f"hosts/{host}/{k}": n for k, n in their_malformed.items()}
    named = procs.dropna(subset=["pid"]).drop_duplicates("pid", keep="last").set_index("pid")
    for name, df in tables.items():
        if "pid" in df:
            df["process"] = df.pid.map(named.name)
        run.write_table(name, df)
    return {"failed": failed, "malformed_lines": malformed, "unread_files": unread,
            "events_lost": {"ebpf": lost} if lost else {}}


def _captured(cap, host: str, conns: pd.DataFrame, frame_base: int = 0,
              stack_base: int = 0) -> tuple[dict, list[str], dict, list[str]]:
    """The tables of one host's captures directory, each row with its host, frame and stack ids from
    the bases on; what its eBPF agent or Python sampler could not probe, per process; the malformed lines left out of
    its captures (captures/NAME: how many, where any); the mapped files not read ("PATH: why")."""
    bad = Counter()
    samples, stacks, frames = pyspy.read_samples(cap / pyspy.CAPTURE, bad)
    samples["source"], frames["kind"] = "pyspy", "python"
    frames["frame_id"] += frame_base
    stacks["frame_ids"] = [[i + frame_base for i in ids] for ids in stacks.frame_ids]
    stacks["stack_id"] += stack_base
    samples["stack_id"] += stack_base
    unread = []
    native = ebpf_tables.read_cpu(cap / "ebpf_cpu.tsv", frame_base=_after(frames.frame_id, frame_base),
                                  stack_base=_after(stacks.stack_id, stack_base), unread=unread)
    samples, stacks, frames = (pd.concat([a, b], ignore_index=True) for a, b in zip((samples, stacks, frames), native))
    events = ebpf_tables.read_events(cap / ebpf_tables.EVENTS)
    tables = {"samples": samples, "stacks": stacks, "frames": frames,
              "gil_waits": ebpf_tables.read_gil(events),
              "offcpu": ebpf_tables.read_offcpu(events),
              "short_waits": ebpf_tables.read_small(cap / "ebpf_small.tsv"),
              "tcp": ebpf_tables.read_tcp(events, conns),
              "proc": procfs.read_proc(cap / procfs.CAPTURE, bad),
              "thread_names": procfs.read_thread_names(cap / procfs.THREADS, bad)}
    for df in tables.values():
        df["host"] = host  # the capture's: a pid none of the run's processes has ran there too
    status = ebpf_tables.read_status(cap / ebpf_tables.STATUS)
    failed = [f"pid {r.pid}: {r.what}" for r in status[status.status == "E"].itertuples()]
    return (tables, failed + pyspy.not_sampled(cap / pyspy.CAPTURE),
            {f"captures/{name}": n for name, n in bad.items() if n}, sorted(set(unread)))


def with_host(df: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """A table of processes' or threads' rows, with the host each ran on, by its pid (else tid): the
    run's pids and tids carry their host's number (HOST_PID); null for one that is none of the run's."""
    names = {0: "local"} | {h["number"]: host for host, h in meta.get("hosts", {}).items()}
    df["host"] = ((df["pid"] if "pid" in df else df["tid"]) // HOST_PID).map(names)
    return df


def _after(ids: pd.Series, base: int = 0) -> int:
    """The first id past these, base if none: a capture's ids may have gaps (a frame's line malformed),
    so the next capture's ids start past the largest, not at the count."""
    return int(ids.max()) + 1 if len(ids) else base


BPF_TABLES = {"gil_waits", "offcpu", "tcp"}  # stamped by BPF


def _agent_hosts(run: RunDir) -> list[tuple[int, str, int, int]]:
    """(number, host, clock offset, time namespace offset; ns) of each host whose agent's captures
    were read back."""
    return sorted((h["number"], host, h["offset_ns"], h.get("timens_ns", 0))
                  for host, h in run.meta().get("hosts", {}).items())


def _moved(name: str, df: pd.DataFrame, pid_base: int, offset_ns: int, timens_ns: int) -> pd.DataFrame:
    """Another host's rows on the run's clock and in the run's pid and tid space. Its monotonic
    times (per the schema; 0 stays 'none') plus the offset; BPF's also plus the agent's time
    namespace offset, as BPF stamps with the kernel's clock."""
    for c in ("pid", "tid"):  # a thread id is a pid too: the main thread's stays its process's
        if c in df:
            df[c] += pid_base
    bpf = (df.source == "ebpf").to_numpy() if "source" in df else np.full(len(df), name in BPF_TABLES)
    shift = np.where(bpf, offset_ns + timens_ns, offset_ns)
    for c in TABLES[name].columns:
        if c.unit == MONO and c.name in df:
            df[c.name] = df[c.name].where(df[c.name] == 0, df[c.name] + shift)
    return df


def processes_table(meta: dict) -> pd.DataFrame:
    rows = [{"pid": p["pid"], "name": p["name"], "role": p["role"], "listen": p["listen"],
             "contact": p["contact"], "command": " ".join(map(str, p["command"])), "host": p.get("host", "local"),
             "found_ns": p.get("found_ns"), "left_ns": p.get("left_ns")}
            for p in meta.get("processes", [])]
    df = pd.DataFrame(rows, columns=["pid", "name", "role", "listen", "contact", "command", "host", "found_ns",
                                     "left_ns"])
    versions = meta.get("versions", {}).get("cluster", {})
    df["python"] = np.where(df.role.isin(["scheduler", "worker", "nanny"]), versions.get("python"), None)
    df["distributed"] = np.where(df.role.isin(["worker", "nanny"]) | ((df.role == "scheduler") & (
        meta.get("cluster", {}).get("server_cmd") is None)), versions.get("distributed"), None)
    return df


def connections_table(cap: Capture, procs: pd.DataFrame, hosts: dict | None = None) -> pd.DataFrame:
    """Each connection with both ends named. The accepting end is the process
    the proxy fronts; the connecting end is found by pid (on another host, from its agent's
    sockets; else by its host, _member_elsewhere). A connecting pid that
    is not a cluster process is the user's command (or a child of it): client."""
    c = cap.connections.copy()
    if c.empty:
        return pd.DataFrame(columns=TABLES["connections"].names)
    # from another host: the process whose socket it is there, as that host's agent last saw it
    theirs = {addr: h["number"] * HOST_PID + pid
              for h in (hosts or {}).values() for addr, pid in h.get("sockets", {}).items()}
    c["peer_pid"] = c.peer_pid.where(c.peer_pid >= 0, c.peer_addr.map(theirs).fillna(-1).astype("int64"))
    by_pid = procs.dropna(subset=["pid"]).drop_duplicates("pid", keep="last").set_index("pid")
    by_name = procs.set_index("name")
    known = c.peer_pid.isin(by_pid.index)
    away = _member_elsewhere(c.peer_addr, c.opened_ns, procs)
    c["peer"] = np.where(known, c.peer_pid.map(by_pid.name), away.fillna("client"))
    # workers sharing a process (run --workers-per-process) each connect from their own loopback address
    own = _member_at(c.peer_addr.astype(str).map(host_of), c.opened_ns, procs[procs.listen.notna()],
                     procs.listen.dropna().map(host_of))
    mine = known & own.notna()
    c["peer"] = np.where(mine, own, c.peer)
    c["peer_role"] = np.where(known, np.where(mine, own.map(dict(zip(procs.name, procs.role))),
                                              c.peer_pid.map(by_pid.role)), away.map(by_name.role).fillna("client"))
    c["upstream_name"] = _listener(c.listen, c.opened_ns, procs).fillna(c.label)
    c["upstream_role"] = c.label.map(by_name.role)
    bad = cap.malformed.groupby("conn").size()
    c["malformed"] = c.conn.map(bad).fillna(0).astype(int)
    return c.drop(columns="label")


def _member_elsewhere(peer_addr: pd.Series, opened_ns: pd.Series, procs: pd.DataFrame) -> pd.Series:
    """For each connection from another host, the member that opened it: the one member listening
    on that host while it opened. None where there is none, or several: those count as clients."""
    away = procs[(procs.host != "local") & procs.listen.notna()]
    return _member_at(peer_addr.astype(str).map(host_of), opened_ns, away, away.listen.map(host_of))


def _listener(listen: pd.Series, opened_ns: pd.Series, procs: pd.DataFrame) -> pd.Series:
    """For each connection, the member listening at its address when it opened: a worker that
    restarted at the same port is told from its predecessor, which a tap's label per port is not
    until it is told (every FOLLOW_S here, every STREAM_S on an agent's host)."""
    members = procs[procs.listen.notna()]
    return _member_at(listen.astype(str), opened_ns, members, members.listen)


def _member_at(where: pd.Series, opened_ns: pd.Series, members: pd.DataFrame, there: pd.Series) -> pd.Series:
    """For each connection (at `where`, opened then), the one member at `there` while it opened: from
    FOLLOW_S before daskprobe found it to when it saw it gone (a restart's two processes are told
    apart but for those seconds). None where there is none, or several."""
    at, opened = where.to_numpy(), opened_ns.to_numpy("int64")
    names, count = np.full(len(at), None, dtype=object), np.zeros(len(at), dtype=int)
    for m, place in zip(members.itertuples(), there):
        since = -np.inf if pd.isna(m.found_ns) else m.found_ns - FOLLOW_S * 1e9
        hit = (at == place) & (opened >= since) & (pd.isna(m.left_ns) or opened <= m.left_ns)
        names[hit], count[hit] = m.name, count[hit] + 1
    return pd.Series(np.where(count == 1, names, None), index=where.index, dtype=object)


def task_tables(ev: dict, msgs: pd.DataFrame, anchor: dict) -> pd.DataFrame:
    """Attempts, their startstops taken back to the run's clock."""
    first = msgs.drop_duplicates("msg_id").set_index("msg_id")
    return undo_scheduler_delay(attempts_table(ev, msgs, anchor), clock_table(ev["clock"], first), anchor)


def graphs_table(graphs: pd.DataFrame, msgs: pd.DataFrame) -> pd.DataFrame:
    """One row per update-graph: who sent it, its first and last byte at the proxy, the keys it asks for."""
    first = msgs.drop_duplicates("msg_id").set_index("msg_id")
    g = first.reindex(graphs.message.to_numpy())[["src", "src_role", "t_first_ns", "t_last_ns", "msg_bytes"]]
    g = g.rename_axis("msg_id").reset_index().assign(keys=graphs["keys"].to_numpy())
    return g.assign(graph_id=np.arange(len(g)))


def task_stream_table(run: RunDir, procs: pd.DataFrame, anchor: dict) -> pd.DataFrame:
    """Dask's task stream, a row per span of a task, its workers by their members' names."""
    lines = run.task_stream.read_text().splitlines() if run.task_stream.exists() else []
    tasks = [json.loads(line) for line in lines[:-1]] + _whole(lines[-1:])  # a kill may tear the last
    names = dict(zip(procs.listen, procs.name))
    rows = [(key_str(_tuples(t["key"])), names.get(listen_of(t["worker"]), t["worker"]), t.get("thread"),
             s.get("action"), s.get("start"), s.get("stop"), t.get("nbytes"), t.get("status"))
            for t in tasks if isinstance(t, dict) and "key" in t and "worker" in t
            for s in t.get("startstops", []) if isinstance(s, dict)]
    df = pd.DataFrame(rows, columns=["key", "worker", "thread", "action", "start", "stop", "nbytes", "status"])
    offset_s = anchor["wall_ns"] / 1e9 - anchor["monotonic_ns"] / 1e9
    for c in ("start", "stop"):
        df[f"{c}_ns"] = ((pd.to_numeric(df.pop(c), errors="coerce") - offset_s) * 1e9).round().astype("Int64")
    df = df.dropna(subset=["start_ns", "stop_ns"]).astype({"start_ns": "int64", "stop_ns": "int64"})
    return df.assign(prefix=prefixes(df.key)).reindex(columns=TABLES["task_stream"].names)


def _tuples(key):
    """A key as it was before JSON: a list is a tuple."""
    return tuple(map(_tuples, key)) if isinstance(key, list) else key


def _whole(lines: list[str]) -> list:
    try:
        return [json.loads(line) for line in lines]
    except json.JSONDecodeError:
        return []
