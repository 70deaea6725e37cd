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

from ..probes.rundir import RunDir
from ..probes.sockets import split_address

FAULTS = ("none", "kill-worker", "kill-proxy", "kill-sampler", "kill-ebpf", "full-disk", "resets", "tap-stalled",
          "tap-ports")
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
        cmd = [sys.executable, "-m", "daskprobe.tracer.cli", "run", "--workers", "2", "--nanny", *probes, "--out",
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


def tap_ports() -> dict:
    """The tap on a local cluster's ports among 1,000 watched, while 100 tasks run: did it start, and
    did it see every task (its compute-task and task-finished)?"""
    from distributed import Client, LocalCluster

    from ..probes.proxy import start_tap, stop_proxy
    from ..probes.proxy_capture import read_capture
    from ..tracer.wire import decode_frame0, key_str
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
        b = subprocess.run([sys.executable, "-m", "daskprobe.tracer.cli", "build", str(run.path)],
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
    (its second half): 1.0 is nothing lost."""
    base = df[df.fault == "none"]
    for name in TABLES:
        after = pd.to_numeric(df.get(f"{name}_after"), errors="coerce")
        ref = after[df.fault == "none"].iloc[0] if len(base) else None
        df[f"{name}_kept"] = after / ref if ref else None
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
    for f in (["none"] if "none" not in faults else []) + faults:
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
