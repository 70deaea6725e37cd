"""Benchmark: what recording a running cluster costs, as makespan ratios attached / plain.

    python -m daskprobe.experiments.attach_overhead --repeat 4
    python -m daskprobe.experiments.attach_overhead --graphs merge-10K --probes tap,proc --repeat 3

For each graph a cluster is started the way users start theirs (a LocalCluster
in a process of its own: 2 workers x 1 thread under nannies, worker-saturation
=inf, on loopback), and the graph runs against it again and again: plain, then
under `daskprobe attach ADDRESS -- COMMAND`, in alternating ABBA order so
drift hits both alike. Reported: the median of the per-pair ratios attached /
plain with its range and a bootstrap 90% interval; while each attached
session ran, each measuring process's CPU and their share of the cluster's
(when `proc` is among --probes); the CPU the hypervisor took per run (steal).
Needs root, as attach does. Writes results.csv and results.json in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

from .overhead import STEAL_TITLE, print_table, session_cpu, session_share, steal, steal_s, summarize

SETTINGS = ("plain", "attached")
STANDING = """
import json, sys
import dask
from distributed import LocalCluster
dask.config.set({"distributed.scheduler.worker-saturation": float("inf")})
if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster:
        print(json.dumps({"address": cluster.scheduler_address}), flush=True)
        sys.stdin.read()  # until the benchmark is done with it
"""


def standing_cluster() -> tuple[subprocess.Popen, str]:
    """A cluster that runs before, between and after the recordings: (its process, its address)."""
    p = subprocess.Popen([sys.executable, "-c", STANDING], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"the standing cluster did not start (exit code {p.wait()})")
    return p, json.loads(line)["address"]


def run_once(graph: str, setting: str, address: str, out: Path, probes: str) -> dict:
    workload = [sys.executable, "-m", "daskprobe.tracer.bench.workloads", graph]
    cmd = workload if setting == "plain" else [
        sys.executable, "-m", "daskprobe.tracer.commands", "attach", address, "--probes", probes, "--out", str(out),
        "--", *workload]
    stolen = steal_s()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, DASK_SCHEDULER_ADDRESS=address))
    if p.returncode != 0:
        raise RuntimeError(f"{graph} {setting} failed:\n{p.stderr[-3000:]}")
    row = {"makespan_s": json.loads(p.stdout.strip().splitlines()[-1])["makespan_s"], "steal_s": steal_s() - stolen}
    if setting == "attached" and (out / "tables" / "proc.parquet").exists():
        row |= session_cpu(out)
    return row


def makespans(graphs: list[str], repeat: int, out: Path, probes: str, console: Console) -> pd.DataFrame:
    rows = []
    for graph in graphs:
        cluster, address = standing_cluster()
        try:
            for rep in range(repeat):
                for setting in (SETTINGS if rep % 2 == 0 else SETTINGS[::-1]):
                    row = run_once(graph, setting, address, out / f"{graph}-{setting}-{rep}", probes)
                    rows.append({"graph": graph, "rep": rep, "setting": setting} | row)
                    console.log(f"{graph} rep {rep} {setting}: {row['makespan_s']:.3f} s")
        finally:
            cluster.stdin.close()
            cluster.wait(60)
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    from ..tracer.commands.attach_verb import DEFAULT_PROBES
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="merge-10K,merge_slow-1K-0.01")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--probes", default=DEFAULT_PROBES, help=f"attach's --probes (default {DEFAULT_PROBES})")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    out = args.out or Path("runs") / f"bench-attach-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    raw = makespans(args.graphs.split(","), args.repeat, out, args.probes, console)
    raw.to_csv(out / "results.csv", index=False)
    summary = summarize(raw, SETTINGS, by="setting")
    share, stolen = session_share(raw, by="setting"), steal(raw, by="setting")
    (out / "results.json").write_text(json.dumps({
        "compare": "attached / plain", "probes": args.probes, "makespan": summary.to_dict("records"),
        "session_cpu": share.to_dict("records"), "steal_s": stolen.to_dict("records")}, indent=2))
    print_table("makespan ratio attached / plain (median of ABBA pairs)", summary)
    if not share.empty:
        print_table("CPU seconds while the attached session ran: each measuring process, the cluster, and the "
                    "measuring share of the cluster's (median over runs)", share)
    print_table(STEAL_TITLE, stolen)
    console.log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
