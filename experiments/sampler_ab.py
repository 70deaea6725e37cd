"""Benchmark: the Python sampler's own CPU, with daskprobe's CPython reader
and with py-spy's, reading the same cluster at the same moments.

    python -m daskprobe.experiments.sampler_ab --repeat 3
    python -m daskprobe.experiments.sampler_ab --repeat 3 --python /path/to/py3.13-venv/bin/python
    python -m daskprobe.experiments.sampler_ab --repeat 3 --against /path/to/other/daskprobe-sampler

Each repetition runs GRAPH (default merge-10K, 2 workers x 1 thread,
worker-saturation=inf) under `daskprobe run --probes proxy` and attaches two
daskprobe-sampler processes to its scheduler, workers and client: one with
`--reader auto` (ours, for CPython 3.10 to 3.13) and one with `--reader pyspy`.
Both see the same workload, so the difference is the readers'. With --against,
the second is another build of the sampler, with our reader too (a change to
the sampler, against the build before it). With
--python, scheduler, workers and client run under that interpreter (it needs
dask, distributed and numpy). Reported per
reader, median over repetitions: CPU seconds (utime + stime of the sampler,
from /proc/PID/stat), thread samples written, CPU microseconds per thread
sample, process reads dropped for taking over 2 ms, and the share of thread
samples on a CPU (the two should agree).

Writes results.csv in --out and prints a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

from .overhead import SATURATION, print_table
from ..probes.base import CLUSTER_ROLES, SAMPLER_NICE, missing_binary, native_binary
from ..probes import rates
from ..probes.procfs import cpu_s
from ..probes.procs import spawn, stop
from ..probes.rundir import RunDir
from ..tracer.bench import workloads

# (label, binary, --reader) of the two samplers
READERS = (("ours", None, "auto"), ("py-spy's", None, "pyspy"))


def _targets(run: RunDir, cluster: subprocess.Popen, timeout: float = 120) -> list[dict]:
    """The cluster's Python processes, once the client has started (run.json lists it then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and cluster.poll() is None:
        procs = run.meta().get("processes", []) if (run / "run.json").exists() else []
        if any(p["role"] == "client" for p in procs):
            return [p for p in procs if p["role"] in CLUSTER_ROLES - {"proxy"} and p["pid"]]
        time.sleep(0.05)
    raise RuntimeError(f"the run in {run.path} ended or stalled before its client started")


def _used(capture: Path) -> str:
    """The readers that read the processes, per the capture's `A` lines."""
    lines = capture.read_text(errors="replace").splitlines()
    return ";".join(sorted({line.split("\t")[4] for line in lines if line.startswith("A\t")}))


def _count(capture: Path) -> dict:
    lines = capture.read_text(errors="replace").splitlines()
    active = [line.split("\t")[4] == "1" for line in lines if line.startswith("S\t")]
    return {"thread_samples": len(active), "dropped_reads": sum(line[:1] == "L" for line in lines),
            "on_cpu_share": sum(active) / len(active) if active else float("nan")}


def _client(python: str, graph: str) -> list[str]:
    """The workload under `python`: as a module where daskprobe is installed, else as a
    script (-I keeps its folder, whose modules are daskprobe's, off sys.path)."""
    if python == sys.executable:
        return [python, "-m", "daskprobe.tracer.bench.workloads", graph]
    return [python, "-I", workloads.__file__, graph]


def run_once(graph: str, rate: float, out: Path, python: str = sys.executable, readers=READERS) -> list[dict]:
    run = RunDir(out / "run")
    cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "2", "--threads", "1",
           "--config", SATURATION, "--probes", "proxy", "--python", python, "--out", str(run.path), "--",
           *_client(python, graph)]
    cluster = spawn(cmd, out / "run.log")
    samplers = {}
    try:
        targets = _targets(run, cluster)
        for i, (label, binary, reader) in enumerate(readers):
            p = spawn([binary or native_binary("daskprobe-sampler"), "--out", str(out / f"{i}.tsv"), "--rate",
                       str(rate), "--reader", reader], out / f"{i}.log", nice=SAMPLER_NICE, stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE)
            p.stdout.readline()  # "ready"
            p.stdin.write("".join(f"{t['pid']} {t['name']}\n" for t in targets).encode())
            p.stdin.flush()
            samplers[label] = (i, p)
        if cluster.wait(timeout=900) != 0:
            raise RuntimeError(f"{graph} failed: see {out / 'run.log'}")
        return [{"reader": r, "used": _used(out / f"{i}.tsv"), "cpu_s": cpu_s(p.pid)} | _count(out / f"{i}.tsv")
                for r, (i, p) in samplers.items()]
    finally:
        stop([*(p for _, p in samplers.values()), cluster])


def summarize(raw: pd.DataFrame) -> pd.DataFrame:
    raw = raw.assign(cpu_us_per_thread_sample=raw.cpu_s / raw.thread_samples * 1e6)
    cols = ["cpu_s", "thread_samples", "cpu_us_per_thread_sample", "dropped_reads", "on_cpu_share"]
    return raw.groupby(["graph", "python", "reader", "used"])[cols].median().reset_index()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", default="merge-10K")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=rates.SAMPLE_RATE, help="samples per second, both samplers")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the cluster and client")
    ap.add_argument("--against", type=Path, help="another daskprobe-sampler build, to compare with this one")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    readers = READERS if args.against is None else (("this build", None, "auto"), (str(args.against), str(args.against), "auto"))
    if native_binary("daskprobe-sampler") is None:
        ap.error(missing_binary("daskprobe-sampler"))
    out = args.out or Path("runs") / f"bench-sampler-{time.strftime('%Y%m%d-%H%M%S')}"
    console = Console(stderr=True)
    version = subprocess.run([args.python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    rows = []
    for rep in range(args.repeat):
        d = out / f"{args.graph}-{rep}"
        d.mkdir(parents=True, exist_ok=True)
        for row in run_once(args.graph, args.rate, d, args.python, readers):
            rows.append({"graph": args.graph, "python": version, "rep": rep} | row)
            console.log(json.dumps(rows[-1]))
    raw = pd.DataFrame(rows)
    raw.to_csv(out / "results.csv", index=False)
    print_table(f"sampler CPU per reader at {args.rate:g} Hz (median of {args.repeat})", summarize(raw))
    console.log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
