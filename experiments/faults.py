"""Benchmark: what a run keeps when something breaks in the middle of it.

    python -m daskprobe.experiments.faults
    python -m daskprobe.experiments.faults --faults kill-worker,full-disk

Each fault hits a `daskprobe run --workers 2 --nanny` of the same workload
(a futures loop of 2 x 100 tasks of 50 ms, about 5 s, computed in two
halves) once its first half is done:

    none           nothing (the baseline the others are compared with)
    kill-worker    SIGKILL of a worker (its nanny restarts it)
    kill-proxy     SIGKILL of the proxy: every connection of the cluster drops
    kill-sampler   SIGKILL of the sampler (Python stacks and /proc)
    kill-ebpf      SIGKILL of the eBPF agent
    full-disk      the run directory's filesystem (a 20 MB tmpfs) fills up
    resets         10,000 connections opened and reset on the scheduler's port
    tap-stalled    a run recorded by the packet tap (no proxy), its tasks returning 4 MiB each:
                   the tap stopped (SIGSTOP) for 2 s while the second half runs, so its
                   64 MiB ring overflows and the kernel drops packets
    tap-ports      no run: the tap watching a cluster's 3 ports among 1,000 (an attach to a
                   large cluster), 100 tasks; its filter once failed past about 510 ports

The agents' faults hit a `daskprobe attach` (as root) to a cluster whose scheduler and one worker
are on this host and one worker on another (a network namespace, its agent sampling it), while a
command runs rounds of 10 tasks of 50 ms on a CPU per worker for about 10 s, then until 12 s after
the fault:

    agent-none     nothing (their baseline)
    agent-stalled  the other host's agent stopped (SIGSTOP) for 45 s (a read times out at 30 s), then continued
    host-cut       the other host's link down for 5 s, then up
    host-joined    a worker joins on a third host (a namespace of its own) during the recording
    host-left      the other host's worker retired (closed): its agent can no longer be asked

For each: what the user's command saw (its exit code, its last line of
stderr), what the run directory holds (finalized, errors, rows of the main
tables), what was lost (rows after the fault, against the same rows of
the `none` run), and whether the run said so: run.json's `lost`, jobs
without a recorded end, the cautions on the terminal. Writes faults.csv in
--out and prints a table. Needs root for full-disk (a tmpfs), kill-ebpf
(the agent) and the tap's faults (a packet socket); without it they are
reported as not injected.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from ..analyzers import summary_json
from ..probes import agent
from ..probes.rundir import RunDir
from ..probes.sockets import split_address
from .netns import in_host, other_hosts

AGENT_FAULTS = ("agent-none", "agent-stalled", "host-cut", "host-joined", "host-left")
FAULTS = ("none", "kill-worker", "kill-proxy", "kill-sampler", "kill-ebpf", "full-disk", "resets", "tap-stalled",
          "tap-ports", *AGENT_FAULTS)
FLOW = """
import os, time
from distributed import Client, as_completed, wait
def work(i, size):
    time.sleep(0.05)
    return i, b"x" * size
with Client() as c:
    for half in range(2):
        if half:
            open({marker!r}, "w").close()
            while not os.path.exists({go!r}):
                time.sleep(0.05)
        futures = [c.submit(work, i, {size}, key=f"work-{{half}}-{{i}}") for i in range(100)]
        if {size}:  # each result fetched as it is done: bytes on the wire all along
            [f.result() for f in as_completed(futures)]
        wait(futures)
        assert sorted(i for i, _ in c.gather(futures)) == list(range(100))
        del futures
"""
STALL_S = 2.0
ATTACH_FLOW = """
import os, time
from distributed import Client, wait
def work(i):
    end = time.perf_counter() + 0.05
    while time.perf_counter() < end:  # on a CPU: each worker's samples show it busy
        pass
    return i
n = 0
def rounds(until):
    global n
    while not until():
        workers = list(c.scheduler_info()["workers"])
        wait([c.submit(work, i, key=f"work-{{n}}-{{w}}-{{i}}", workers=[w], allow_other_workers=True)  # one may leave
              for w in workers for i in range(10)])
        n += len(workers) * 10
with Client() as c:
    start = time.monotonic()
    rounds(lambda: time.monotonic() > start + 10)  # a read of the agents (every 10 s) before the fault
    open({marker!r}, "w").close()
    while not os.path.exists({go!r}):
        time.sleep(0.05)
    c.wait_for_workers({workers}, timeout=120)
    rounds(lambda: os.path.exists({end!r}))
    print(n)
"""
READ_TIMEOUT_S = inspect.signature(agent.ask).parameters["timeout"].default  # a read of an agent fails past it
AGENT_STALL_S = READ_TIMEOUT_S + agent.STREAM_S + 5  # a read starts within STREAM_S, and times out before the end
CUT_S = 5.0
AFTER_S = 12.0  # the command goes on this long after a fault: a read of the agents at least
TABLES = ("messages", "attempts", "samples", "gil_waits", "offcpu", "proc")


def inject(fault: str, run: RunDir, disk: Path | None, go: Path) -> str | None:
    """Do the fault now; None if done, else why it could not be."""
    procs = {p["name"]: p["pid"] for p in run.meta()["processes"]}
    if fault == "tap-stalled":
        if not procs.get("tap"):
            return "the tap is not running"
        os.kill(procs["tap"], signal.SIGSTOP)
        try:
            go.touch()  # the second half runs while it is stopped
            time.sleep(STALL_S)
        finally:
            os.kill(procs["tap"], signal.SIGCONT)
        return None
    target = {"kill-worker": "worker-0", "kill-proxy": "proxy"}.get(fault)
    if fault in ("kill-sampler", "kill-ebpf"):  # probes are named by their kinds: found by their program
        program = {"kill-sampler": "daskprobe-sampler", "kill-ebpf": "ebpf_agent"}[fault]
        found = [r["name"] for r in run.meta()["processes"] if program in " ".join(map(str, r["command"] or []))]
        target = found[0] if found else program
    if target:
        if not procs.get(target):
            return f"{target} is not running"
        try:
            os.kill(procs[target], signal.SIGKILL)
        except OSError as e:
            return f"no: {e}"
    elif fault == "full-disk":
        with open(disk / "filler", "wb", buffering=0) as f:  # unbuffered: closing it flushes nothing
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
    elif fault == "resets":
        host, port = split_address(run.meta()["scheduler_address"])
        for i in range(10_000):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                try:
                    s.connect((host, port))
                except OSError as e:
                    return f"no: connection {i} failed: {e}"
    return None


def run_fault(fault: str, out: Path) -> dict:
    if fault == "tap-ports":
        return tap_ports()
    if fault in AGENT_FAULTS:
        if os.geteuid():
            return {"fault": fault, "injected": "no: network namespaces and attach's agents need root"}
        try:
            with other_hosts(2 if fault == "host-joined" else 1) as hosts:
                return attach_fault(fault, out, hosts)
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            return {"fault": fault, "injected": f"no: no network namespaces here ({getattr(e, 'stderr', '') or e})"}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as cleanup:
        tmp = Path(tmp)
        os.chmod(tmp, 0o1777)  # a root run's command runs as another user, who writes the markers here (sticky: see RunDir.create)
        disk = None
        if fault == "full-disk":
            disk = tmp / "disk"
            disk.mkdir()
            if os.geteuid() or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(disk)]).returncode:
                return {"fault": fault, "injected": "no: mounting a small tmpfs needs root"}
            cleanup.callback(subprocess.run, ["umount", "-l", str(disk)])
        run_dir = (disk or out) / f"run-{fault}"
        shutil.rmtree(run_dir, ignore_errors=True)  # this benchmark's own earlier run
        marker, go = tmp / "marker", tmp / "go"
        flow = tmp / "flow.py"
        flow.write_text(FLOW.format(marker=str(marker), go=str(go), size=4 << 20 if fault == "tap-stalled" else 0))
        os.chmod(flow, 0o644)
        probes = ["--probes", "tap,pyspy,proc,cpu,gil,offcpu"] if fault == "tap-stalled" else []
        cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "2", "--nanny", *probes, "--out",
               str(run_dir), "--", sys.executable, str(flow)]
        err = tmp / "stderr"
        with open(err, "w") as e:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=e)
            deadline = time.monotonic() + 300
            while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            at = time.monotonic_ns()
            try:
                if not marker.exists():
                    why = "no: the run ended or hung before its first half was done"
                else:
                    why = inject(fault, RunDir(run_dir), disk, go) if fault != "none" else None
            finally:
                go.touch()  # the flow's second half goes on whatever happened
            try:
                p.wait(300)
            except subprocess.TimeoutExpired:  # as a user would: Ctrl-C, then kill
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        return {"fault": fault, "injected": "yes" if why is None else why, "exit_code": p.returncode,
                "stderr_tail": _last_line(err), "said": _said(err.read_text(errors="replace"))} | _holds(
            RunDir(run_dir), at, disk)


def attach_fault(fault: str, out: Path, hosts: list) -> dict:
    """An attach to a cluster with a worker on another host (hosts[0]), the fault injected once the
    command's first 10 s are done; the recording's end, and what it kept of that host."""
    from distributed import Client
    (ns, ours, theirs, link), joiner_host = hosts[0], hosts[1] if len(hosts) > 1 else None
    dask = str(Path(sys.executable).with_name("dask"))
    with socket.socket() as s:
        s.bind((ours, 0))
        address = f"tcp://{ours}:{s.getsockname()[1]}"
    worker = [dask, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host"]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as cleanup:
        tmp = Path(tmp)
        os.chmod(tmp, 0o1777)  # the command runs as another user: its markers go here
        log = open(tmp / "cluster.log", "w")
        cluster = [subprocess.Popen([dask, "scheduler", "--host", ours, "--port", address.rsplit(":", 1)[1],
                                     "--no-dashboard"], stdout=log, stderr=log)]
        cleanup.callback(_end, cluster)
        cluster += [subprocess.Popen([*worker, ours], stdout=log, stderr=log),
                    subprocess.Popen(in_host(ns, *worker, theirs), stdout=log, stderr=log)]
        with Client(address, timeout=60) as c:
            c.wait_for_workers(2, timeout=120)
        run_dir = out / f"run-{fault}"
        shutil.rmtree(run_dir, ignore_errors=True)
        marker, go, end = tmp / "marker", tmp / "go", tmp / "end"
        flow = tmp / "flow.py"
        workers = 2 + bool(joiner_host) - (fault == "host-left")  # the command waits for them after the fault
        flow.write_text(ATTACH_FLOW.format(marker=str(marker), go=str(go), end=str(end), workers=workers))
        os.chmod(flow, 0o644)
        err, said = tmp / "stderr", tmp / "stdout"
        with open(err, "w") as e, open(said, "w") as o:
            p = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "attach", address, "--no-trace",
                                  "--out", str(run_dir), "--", sys.executable, str(flow)], stdout=o, stderr=e)
            deadline = time.monotonic() + 300
            while not marker.exists() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            at = time.monotonic_ns()
            why = "no: the command ended or hung before its first 10 s were done" if not marker.exists() else None
            try:
                if why is None:
                    joiner = joiner_host and (joiner_host[0], worker + [joiner_host[2]])
                    why = inject_agent(fault, ns, link, go, joiner, cluster, address, theirs)
            finally:
                go.touch()
                time.sleep(AFTER_S)
                end.touch()
            try:
                p.wait(600)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGINT)
                p.wait(120)
        cleanup.callback(_end_agents, run_dir)
        tasks = said.read_text().strip().splitlines()
        return {"fault": fault, "injected": "yes" if why is None else why, "exit_code": p.returncode,
                "stderr_tail": _last_line(err), "said": _said(err.read_text(errors="replace"))} | _holds(
            RunDir(run_dir), at, None) | _host_holds(RunDir(run_dir), at, int(tasks[-1]) if tasks else None)


def inject_agent(fault: str, ns: str, link: str, go: Path, joiner, cluster: list, address: str,
                 theirs: str) -> str | None:
    """Do the agent's fault now (the command's second part starts with it); None if done."""
    if fault == "agent-stalled":
        pid = _agent_in(ns)
        if pid is None:
            return "no: that host's agent is not running"
        os.kill(pid, signal.SIGSTOP)
        try:
            go.touch()
            time.sleep(AGENT_STALL_S)
        finally:
            os.kill(pid, signal.SIGCONT)
    elif fault == "host-cut":
        subprocess.run(["ip", "link", "set", link, "down"], check=True)
        try:
            go.touch()
            time.sleep(CUT_S)
        finally:
            subprocess.run(["ip", "link", "set", link, "up"], check=True)
    elif fault == "host-joined":
        joiner_ns, cmd = joiner
        cluster.append(subprocess.Popen(in_host(joiner_ns, *cmd), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL))
    elif fault == "host-left":
        from distributed import Client
        with Client(address, timeout=60) as c:
            c.retire_workers([w for w in c.scheduler_info()["workers"] if f"//{theirs}:" in w], close_workers=True)
    return None


def _agent_in(ns: str) -> int | None:
    """The pid of the daskprobe agent in that network namespace."""
    inode = os.stat(f"/run/netns/{ns}").st_ino
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if (b"daskprobe.probes.agent" in Path(f"/proc/{pid}/cmdline").read_bytes()
                    and os.stat(f"/proc/{pid}/ns/net").st_ino == inode):
                return int(pid)
    return None


def _end(procs: list) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _end_agents(run_dir: Path) -> None:
    """An agent not read to the end waits out its lease, then keeps its captures: this benchmark's go now."""
    with contextlib.suppress(OSError, ValueError):
        for host in RunDir(run_dir).meta().get("hosts", {}).values():
            if not host.get("complete") and host.get("agent_pid"):
                with contextlib.suppress(OSError):
                    os.kill(host["agent_pid"], signal.SIGTERM)
                time.sleep(2)
                if str(host.get("dir")).startswith(tempfile.gettempdir() + "/daskprobe-agent-"):
                    shutil.rmtree(host["dir"], ignore_errors=True)


def _host_holds(run: RunDir, at: int, submitted: int | None) -> dict:
    """What the run kept of the other hosts: each one's entry (read to the end, failed reads, why
    not), its rows, the longest stretch without a sample of its workers' main threads (a hole), and
    their CPU by thread states against their host's /proc (cpu_check: 1.00 is what the kernel counted)."""
    out = {"tasks": submitted}
    with contextlib.suppress(Exception):
        out["tasks_seen"] = int(run.table("attempts").key.str.startswith("work-").sum())
    try:
        hosts = run.meta().get("hosts", {})
    except (OSError, ValueError):
        return out
    out["hosts"] = "; ".join(f"{h}: complete {e.get('complete')}, failed_reads {e.get('failed_reads', 0)}"
                             + (f", {e['error'][:80]}" if e.get("error") else "") for h, e in sorted(hosts.items()))
    with contextlib.suppress(Exception):
        procs, samples = run.table("processes"), run.table("samples")
        remote = procs[(procs.role == "worker") & procs.host.isin(list(hosts))]
        main = samples[samples.pid.isin(remote.pid) & (samples.pid == samples.tid)]
        gaps = main.sort_values("t_ns").groupby("pid").t_ns.diff()
        cpu = summary_json.read(RunDir(run.path))["cpu_check"]
        ratios = [cpu.get(n, {}).get("ratio") for n in remote.name]
        out |= {"remote_cpu_ratio": " ".join(f"{r:.2f}" if r else "-" for r in ratios)}
        out |= {"remote_workers": len(remote), "remote_samples": len(main),
                "remote_samples_after": int((main.t_ns > at).sum()),
                "remote_max_gap_s": round(float(gaps.max()) / 1e9, 3) if gaps.notna().any() else None}
    return out


def tap_ports() -> dict:
    """The tap on a local cluster's ports among 1,000 watched, while 100 tasks run: did it start, and
    did it see every task (its compute-task and task-finished)?"""
    from distributed import Client, LocalCluster

    from ..probes.proxy import start_tap, stop_proxy
    from ..probes.proxy_capture import read_capture
    from ..probes.wire import decode_frame0, key_str
    if os.geteuid():
        return {"fault": "tap-ports", "injected": "no: a packet socket needs root"}
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        ports = {int(a.rsplit(":", 1)[1]): "worker" for a in cluster.scheduler_info["workers"]}
        ports[int(cluster.scheduler_address.rsplit(":", 1)[1])] = "scheduler"
        ports |= {p: "unused" for p in range(1025, 65535, 60) if p not in ports}
        ports = dict(list(ports.items())[:1000])
        try:
            tap = start_tap(Path(tmp) / "tap.bin", ports, Path(tmp) / "tap.log")
        except RuntimeError as e:
            return {"fault": "tap-ports", "injected": "yes", "stderr_tail": str(e)[-160:], "said": str(e)[-160:]}
        try:
            keys = [f"task-{i}" for i in range(100)]
            client.gather(client.map(lambda x: x + 1, range(100), key=keys))
            time.sleep(0.3)
        finally:
            stop_proxy(tap)
        cap = read_capture(Path(tmp) / "tap.bin")
    seen = {"compute-task": set(), "task-finished": set()}
    for at in cap.messages["at"]:
        msg = decode_frame0(f) if (f := cap.frames(at).get(0)) is not None else None
        for op in msg if isinstance(msg, (list, tuple)) else [msg]:
            if isinstance(op, dict) and op.get("op") in seen and "key" in op:
                seen[op["op"]].add(key_str(op["key"]))
    return {"fault": "tap-ports", "injected": "yes", "ports": len(ports),
            "tasks_seen": min(len(seen[k] & set(keys)) for k in seen), "tasks": len(keys),
            "said": "nothing to say: it started and saw every task" if all(set(keys) <= v for v in seen.values())
            else "tasks missing"}


def _last_line(err: Path) -> str:
    lines = [ln for ln in err.read_text(errors="replace").splitlines() if ln.strip()]
    daskprobe = [ln for ln in lines if ln.startswith("daskprobe:") and "run directory" not in ln]
    return (daskprobe or lines or [""])[-1][:160]


def _said(text: str) -> str:
    """What the terminal said was lost or cut: its cautions and the probes that stopped early."""
    text = " ".join(text.split())  # the summary's lines are wrapped
    said = [s.strip() for s in text.replace("caution:", "\ncaution:").replace("daskprobe:", "\ndaskprobe:").split("\n")
            if s.startswith("caution:") or "stopped early" in s]
    return " | ".join(said)[:400]


def _holds(run: RunDir, at: int, disk: Path | None) -> dict:
    if disk:  # free the disk, then decode what was written, as a user would
        (disk / "filler").unlink(missing_ok=True)
        b = subprocess.run([sys.executable, "-m", "daskprobe.tracer.commands", "build", str(run.path)],
                           capture_output=True, text=True, timeout=600)
        built = {"build_said": _said(b.stderr)}
    else:
        built = {}
    try:
        meta = run.meta()
    except (OSError, ValueError) as e:
        return {"run_json": f"unreadable: {e}"}
    out = built | {"finalized": meta.get("finalized"), "partial": meta.get("partial"),
           "errors": json.dumps(meta.get("finalize_errors", {}) | meta.get("probe_errors", {}))[:160],
           "lost": json.dumps(meta.get("lost") or {})}
    with contextlib.suppress(Exception):
        jobs = run.table("jobs")
        out |= {"jobs": len(jobs), "jobs_incomplete": int((~jobs.complete).sum())}
    for name in TABLES:
        try:
            t = run.table(name)
            time_col = next(c for c in ("t_first_ns", "compute_sent_ns", "t_ns", "start_ns", "out_ns") if c in t)
        except Exception:  # missing or unreadable: that is what this benchmark reports
            out[f"{name}_rows"], out[f"{name}_after"] = None, None
            continue
        out[f"{name}_rows"], out[f"{name}_after"] = len(t), int((t[time_col] > at).sum())
    return out


def lost(df: pd.DataFrame) -> pd.DataFrame:
    """Per fault and table, the rows after the fault as a share of the `none` run's rows after its own
    (its second half; agent-none's for the agents' faults): 1.0 is nothing lost."""
    baseline = df.fault.map(lambda f: "agent-none" if f in AGENT_FAULTS else "none")
    for name in TABLES:
        after = pd.to_numeric(df.get(f"{name}_after"), errors="coerce")
        ref = baseline.map(dict(zip(df.fault, after)))
        df[f"{name}_kept"] = after / ref.where(ref > 0)
    return df


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--out", default="runs/faults")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    faults = args.faults.split(",")
    if unknown := set(faults) - set(FAULTS):
        p.error(f"unknown fault(s) {', '.join(sorted(unknown))}; known: {', '.join(FAULTS)}")
    rows = []
    baselines = [b for b, family in (("none", set(FAULTS) - set(AGENT_FAULTS)), ("agent-none", set(AGENT_FAULTS)))
                 if b not in faults and set(faults) & family]
    for f in baselines + faults:
        rows.append(run_fault(f, out))
        pd.DataFrame(rows).to_csv(out / "faults.csv", index=False)  # a later fault's crash keeps these
    df = lost(pd.DataFrame(rows))
    df.to_csv(out / "faults.csv", index=False)
    t = Table(title="what a run keeps when something breaks (rows: total / after the fault; faults.csv has each share kept)")
    for col in ("fault", "injected", "exit", "finalized", *TABLES, "run.json lost", "jobs without an end",
                "what daskprobe said"):
        t.add_column(col, overflow="fold")
    for r in df.to_dict("records"):
        t.add_row(r["fault"], r["injected"], str(r.get("exit_code")), str(r.get("finalized")),
                  *(f"{r.get(f'{n}_rows')} / {r.get(f'{n}_after')}" for n in TABLES), str(r.get("lost", "")),
                  f"{r.get('jobs_incomplete')} of {r.get('jobs')}",
                  " | ".join(str(r[k]) for k in ("said", "build_said") if isinstance(r.get(k), str) and r[k])
                  or str(r.get("stderr_tail", "")))
    Console().print(t)
    if "hosts" in df:
        h = Table(title="the agents' faults: the other hosts (tasks: seen / run; gap: longest without a sample)")
        for col in ("fault", "hosts", "tasks", "remote samples / after", "gap s", "CPU / /proc's"):
            h.add_column(col, overflow="fold")
        for r in df[df.fault.isin(AGENT_FAULTS)].to_dict("records"):
            h.add_row(r["fault"], str(r.get("hosts")), f"{r.get('tasks_seen')} / {r.get('tasks')}",
                      f"{r.get('remote_samples')} / {r.get('remote_samples_after')}", str(r.get("remote_max_gap_s")),
                      str(r.get("remote_cpu_ratio")))
        Console().print(h)
    return 0


if __name__ == "__main__":
    sys.exit(main())
