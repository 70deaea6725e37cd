"""Benchmark: Dask's comm time per backend (tcp, tls, ws, inproc, ucx), from the comm tap's records.

    python -m daskprobe.experiments.comm_backends [--graphs merge-2K,numpy-2K-200] [--repeat 5]
        [--backends tcp,tls,ws,inproc,ucx] [--ucx-python PATH] --out DIR

Each run is one process: a script's own LocalCluster(processes=False, n_workers=2, threads_per_worker=1)
on the backend (inproc is that cluster's default), with probes/comm_tap.py loaded as the scheduler's
preload, computing each graph once (tracer/bench/workloads.py). The same process layout on every
backend: only the comm differs. Runs go backend after backend, in an order reversed every repetition.

Per run and graph, from the tap's records of the messages that began while the graph computed:
- comm time per message: the median of each message's first-to-last byte (how each backend's time is
  taken: probes/comm_tap.py; inproc: the sender's write to the receiver's read, no bytes);
- comm time per MB: the time of the messages of 64 KiB or more over their MB (inproc's sizes are
  dask.sizeof estimates);
- makespan (the client's compute to result) and the process's CPU seconds per task (getrusage: less
  sensitive to a loaded machine than wall time).
Reported: the median over repetitions and the spread (min-max).

UCX needs distributed-ucxx, which pins its own dask: give a Python that has it (--ucx-python, else the
backend is skipped and said so). Its listener binds every interface, so as root its runs go in a
network namespace of their own with only loopback up (unshare); not as root, it is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ..probes.comm_capture import merge
from ..probes.proxy_capture import Capture, read_capture
from ..tracer.capture.cluster import COMM_TAP, tls_env

BACKENDS = ("tcp", "tls", "ws", "inproc", "ucx")
WORKLOADS = Path(__file__).parents[1] / "tracer" / "bench" / "workloads.py"
BULK = 64 << 10  # a message this big or bigger counts for the time per MB
TIMEOUT_S = 600

# Loads the workloads by path: the UCX Python need not have daskprobe. Prints a JSON line per graph.
FLOW = """
import importlib.util, json, resource, sys, time
spec = importlib.util.spec_from_file_location("daskprobe_workloads", sys.argv[1])
w = sys.modules["daskprobe_workloads"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(w)
from distributed import Client, LocalCluster

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

protocol, graphs = sys.argv[2], sys.argv[3].split(",")
kw = {} if protocol == "inproc" else {"protocol": protocol, "host": "127.0.0.1"}
with LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None, **kw) as cluster, \\
        Client(cluster) as client:
    print("ADDRESS", cluster.scheduler_address, flush=True)
    for name in graphs:
        graph = w.build(name)
        tasks = w.tasks_in(graph.collection)
        c0, t0 = cpu(), time.monotonic_ns()
        client.compute(graph.collection).result()
        t1, c1 = time.monotonic_ns(), cpu()
        print("RESULT", json.dumps({"graph": name, "tasks": tasks, "start_ns": t0, "end_ns": t1,
                                    "makespan_s": (t1 - t0) / 1e9, "cpu_s": c1 - c0}), flush=True)
"""


def run_backend(python: str, protocol: str, graphs: list[str], work: Path,
                config: dict[str, str] | None = None) -> tuple[list[dict], Capture]:
    """One run: its graphs' rows (as FLOW prints them) and what the comm tap recorded (its files merged).
    `config`: more environment (Dask's config as DASK_* variables)."""
    comm = work / f"comm-{protocol}-{time.monotonic_ns()}"
    comm.mkdir(mode=0o700)
    env = dict(os.environ, DASKPROBE_COMM_TAP_DIR=str(comm), DASK_DISTRIBUTED__SCHEDULER__PRELOAD=str(COMM_TAP),
               DASKPROBE_CAPTURE_RECORDS=str(COMM_TAP.with_name("capture_records.py")), **(config or {}))
    if protocol == "tls":
        certs = work / f"tls-{time.monotonic_ns()}"
        certs.mkdir(mode=0o700)
        env |= tls_env(certs, None)
    command = [python, "-c", FLOW, str(WORKLOADS), "ucxx" if protocol == "ucx" else protocol, ",".join(graphs)]
    if protocol == "ucx":  # UCX listens on every interface: a network of its own, loopback only
        command = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]
    p = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if p.returncode:
        raise RuntimeError(f"{protocol}: exit {p.returncode}: {p.stderr[-2000:]}")
    rows = [json.loads(line.split(" ", 1)[1]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    said = merge(comm, comm / "merged.bin", os.geteuid(), {})
    if said:
        raise RuntimeError(f"{protocol}: the comm tap lost records: {said}")
    return rows, read_capture(comm / "merged.bin")


def comm_figures(row: dict, messages: pd.DataFrame) -> dict:
    """A graph's comm figures from the messages that began while it computed."""
    m = messages[(messages.t_first_ns >= row["start_ns"]) & (messages.t_first_ns <= row["end_ns"])]
    took = (m.t_last_ns - m.t_first_ns).to_numpy("int64")
    bulk = m.msg_bytes.to_numpy("int64") >= BULK
    mb = m.msg_bytes.to_numpy("int64")[bulk].sum() / 1e6
    return {"messages": len(m), "us_per_message": float(np.median(took)) / 1e3 if len(m) else np.nan,
            "bulk_messages": int(bulk.sum()), "bulk_mb": mb,
            "ms_per_mb": took[bulk].sum() / 1e6 / mb if mb else np.nan,
            "cpu_ms_per_task": row["cpu_s"] * 1e3 / row["tasks"]}


def orders(backends: list[str], repeat: int) -> list[list[str]]:
    """The backends' order in each repetition: as given, then reversed, alternately."""
    return [backends if i % 2 == 0 else backends[::-1] for i in range(repeat)]


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Median and min-max over repetitions, per graph and backend."""
    figures = ["makespan_s", "cpu_ms_per_task", "messages", "us_per_message", "ms_per_mb", "bulk_mb"]
    g = runs.groupby(["graph", "backend"], sort=False)[figures]
    out = g.median().add_suffix("_median").join(g.min().add_suffix("_min")).join(g.max().add_suffix("_max"))
    return out.join(g.size().rename("runs")).reset_index()


def table_text(summary: pd.DataFrame) -> str:
    """One line per graph and backend: median [min-max] of each figure."""
    cols = [("makespan_s", "makespan s", "{:.3f}"), ("cpu_ms_per_task", "CPU ms/task", "{:.3f}"),
            ("us_per_message", "comm us/msg", "{:.0f}"), ("ms_per_mb", "comm ms/MB", "{:.2f}"),
            ("messages", "messages", "{:.0f}")]
    lines = ["| graph | backend | runs | " + " | ".join(c[1] for c in cols) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for r in summary.itertuples():
        cells = []
        for key, _, fmt in cols:
            med, lo, hi = (getattr(r, f"{key}_{s}") for s in ("median", "min", "max"))
            cells.append("-" if pd.isna(med) else f"{fmt.format(med)} [{fmt.format(lo)}-{fmt.format(hi)}]")
        lines.append(f"| {r.graph} | {r.backend} | {r.runs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _usable(backends: list[str], ucx_python: str | None) -> tuple[list[str], list[str]]:
    """The backends that can run here, and why the others cannot."""
    skipped = []
    if "ucx" in backends:
        why = "no --ucx-python (a Python with distributed-ucxx)" if not ucx_python else \
            "needs root for a network namespace (UCX listens on every interface)" if os.geteuid() else \
            "no unshare" if not shutil.which("unshare") else None
        if why:
            skipped.append(f"ucx: {why}")
            backends = [b for b in backends if b != "ucx"]
    return backends, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", default="merge-2K,numpy-2K-200")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--python", default=sys.executable, help="the Python of every backend but ucx")
    ap.add_argument("--ucx-python", default=os.environ.get("DASKPROBE_UCX_PYTHON"),
                    help="a Python with distributed-ucxx (default $DASKPROBE_UCX_PYTHON)")
    ap.add_argument("--out", required=True, help="directory for runs.csv, summary.csv and table.md")
    args = ap.parse_args(argv)
    graphs = args.graphs.split(",")
    backends, skipped = _usable([b for b in args.backends.split(",") if b], args.ucx_python)
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"unknown backends {sorted(unknown)}; known: {', '.join(BACKENDS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work, rows = Path(tempfile.mkdtemp(prefix="daskprobe-comm-backends-")), []
    try:
        for rep, order in enumerate(orders(backends, args.repeat)):
            for backend in order:
                python = args.ucx_python if backend == "ucx" else args.python
                results, capture = run_backend(python, backend, graphs, work)
                for r in results:
                    rows.append({"repeat": rep, "backend": backend, **r, **comm_figures(r, capture.messages)})
                print(f"repeat {rep} {backend}: " + ", ".join(f"{r['graph']} {r['makespan_s']:.2f} s" for r in results),
                      file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    runs = pd.DataFrame(rows)
    summary = summarize(runs)
    runs.to_csv(out / "runs.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    text = table_text(summary) + "".join(f"\n\nnot run: {s}" for s in skipped)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
