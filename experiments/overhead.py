"""Benchmark: what measuring costs, as makespan ratios on real clusters.

    python -m daskprobe.experiments.overhead                               # what `run` costs, no options
    python -m daskprobe.experiments.overhead --compare none:proxy --wire   # then each probe's: the proxy's
    python -m daskprobe.experiments.overhead --compare tap:default         # the samplers' beside the tap

For each graph (default merge-10K and 1,000 tasks of 10 ms, on 2 workers x 1
thread with worker-saturation=inf) the two --probes settings A:B run in
alternating ABBA order so drift hits both alike; reported is the median of
the per-pair ratios B/A, with a bootstrap 90% interval of that median. When
B captures /proc, each probe's own CPU use is reported too (median CPU
seconds per run of daskprobe, proxy, sampler, agent). Each run also records
the CPU time the hypervisor took meanwhile (steal, from /proc/stat), since
on a shared VM that is noise no pairing removes. While the session ran
(the cluster at work), each measuring process's CPU and their share of the
cluster's are reported too. --sample-rate sets the Python sampler's rate in
both settings, --cpu-hz the eBPF sampler's. --wire adds: round-trip time of
a small Dask-framed message and throughput of one 256 MiB frame, through
the proxy and over a direct loopback socket. --bpf-time (root) has the kernel
count each BPF program's run time (kernel.bpf_stats_enabled, on for the whole
benchmark): time spent in the processes the programs trace or interrupt, the
cluster's mostly, which no measuring process's CPU shows. --pool DIR... runs
nothing and summarizes the pairs of earlier runs together (the pair they ran,
unless --compare says which). --compare none:none (A/A) measures the bench
itself: its ratio's distance from 1 is what pairing leaves on this machine.
A run with a probe skipped (no root, say) stops the benchmark.

Writes results.json and results.csv in --out and prints tables.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from ..analyzers import summary_json
from ..probes import ebpf_format
from ..probes.proxy import Route, start_proxy, stop_proxy
from ..probes.rundir import RunDir
from ..tracer.capture.cluster import free_port

SATURATION = "distributed.scheduler.worker-saturation=inf"
STEAL_TITLE = "CPU seconds the hypervisor took per run, all CPUs (steal in /proc/stat)"


def steal_s() -> float:
    """CPU seconds the hypervisor gave elsewhere since boot, summed over CPUs
    (steal in /proc/stat): on a shared VM, the noise no repetition removes."""
    return int(Path("/proc/stat").read_text().split(maxsplit=9)[8]) / os.sysconf("SC_CLK_TCK")


def run_cluster(probes: str, out: Path, command: list[str], run_args: list[str] = ()) -> dict:
    """`daskprobe run` of `command` on this benchmark's cluster (2 workers x 1 thread,
    worker-saturation=inf): the last line the command printed (JSON), and steal_s. A probe that was
    skipped fails the run: its setting would be measured as what it is not."""
    cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "2", "--threads", "1",
           "--config", SATURATION, "--probes", probes, *run_args, "--out", str(out), "--", *command]
    stolen = steal_s()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} with --probes {probes} failed:\n{p.stderr[-3000:]}")
    if skipped := RunDir(out).meta().get("skipped"):
        raise RuntimeError(f"--probes {probes}: skipped {skipped} (run directory {out})")
    return json.loads(p.stdout.strip().splitlines()[-1]) | {"steal_s": steal_s() - stolen}


def run_once(graph: str, probes: str, out: Path, run_args: list[str]) -> dict:
    got = run_cluster(probes, out, [sys.executable, "-m", "daskprobe.tracer.bench.workloads", graph], run_args)
    row = {"makespan_s": got["makespan_s"], "steal_s": got["steal_s"]}
    proc = out / "tables" / "proc.parquet"
    if proc.exists():  # the last cumulative CPU reading of each measuring process
        cpu = pd.read_parquet(proc).dropna(subset=["process"]).groupby("process").cpu_s.max()
        row |= {f"cpu_s[{name}]": float(v) for name, v in cpu.items() if name.startswith(("probe:", "proxy", "daskprobe"))}
        row |= session_cpu(out) | bpf_time(out)
    return row


def bpf_time(run: Path) -> dict:
    """With --bpf-time: the seconds each BPF program ran in the run (the kernel's count), as
    `bpf_s[name]`, and the cluster's CPU seconds over the whole run (its processes' /proc readings)."""
    path = run / "captures" / ebpf_format.PROGRAMS
    if not path.exists():
        return {}
    programs = pd.read_csv(path, sep="\t", names=["name", "runs", "ns"]).groupby("name").ns.sum() / 1e9
    proc = pd.read_parquet(run / "tables" / "proc.parquet").dropna(subset=["process"])
    roles = pd.read_parquet(run / "tables" / "processes.parquet").set_index("name").role
    used = proc.groupby("process").cpu_s.agg(lambda c: c.max() - c.min())
    cluster = used[used.index.map(roles).isin(["scheduler", "worker", "nanny", "client"])].sum()
    return {f"bpf_s[{name}]": float(v) for name, v in programs.items()} | {"run_cluster_cpu_s": float(cluster)}


def session_cpu(run: Path) -> dict:
    """CPU seconds each process used while the session ran (summary.json's window, the cluster at
    work): its cumulative /proc readings interpolated at the window's ends. Measuring processes
    (daskprobe, proxy, probes) each as `session_cpu_s[name]`, the cluster's (scheduler, workers,
    nannies, client) summed, and the measuring share of the cluster's."""
    window = summary_json.read(RunDir(run)).get("session_window_ns")
    if not window:  # no messages recorded (no proxy or tap): no session to measure within
        return {}
    start, end = window
    proc = pd.read_parquet(run / "tables" / "proc.parquet").dropna(subset=["process"]).sort_values("t_ns")
    roles = pd.read_parquet(run / "tables" / "processes.parquet").set_index("name").role
    used = {name: float(np.diff(np.interp([start, end], g.t_ns, g.cpu_s))[0]) for name, g in proc.groupby("process")}
    measuring = {n: v for n, v in used.items() if roles.get(n) in ("probe", "proxy")}
    cluster = sum(v for n, v in used.items() if roles.get(n) in ("scheduler", "worker", "nanny", "client"))
    return {**{f"session_cpu_s[{n}]": v for n, v in measuring.items()}, "session_cluster_cpu_s": cluster,
            "measuring_share": sum(measuring.values()) / cluster if cluster else np.nan}


def sides(a: str, b: str) -> tuple[str, str]:
    """The labels of settings A and B in the tables: their --probes, told apart when they are the
    same (an A/A run, which measures what the pairing itself leaves: a ratio away from 1 is bias)."""
    return (a, b) if a != b else (f"{a} (A)", f"{b} (B)")


def makespans(graphs: list[str], settings: dict[str, str], repeat: int, out: Path, console: Console,
              run_args: list[str]) -> pd.DataFrame:
    """Runs A and B in ABBA order; `settings`: each side's label (`sides`) and its --probes."""
    rows, pair = [], list(settings)
    for graph in graphs:
        for rep in range(repeat):
            for label in (pair if rep % 2 == 0 else pair[::-1]):
                name = label.replace(",", "+").replace(" (", "-").rstrip(")")
                row = run_once(graph, settings[label], out / f"{graph}-{name}-{rep}", run_args)
                rows.append({"graph": graph, "rep": rep, "probes": label} | row)
                console.log(f"{graph} rep {rep} {label}: {row['makespan_s']:.3f} s")
    return pd.DataFrame(rows)


# --- wire micro-benchmarks ------------------------------------------------

def _frame(payload_len: int) -> bytes:
    header = struct.pack("<QQQ", 16 + payload_len, 1, payload_len)
    return header + b"\x81\xa2op\xa4ping".ljust(payload_len, b"\0")


def _recv_exact(s: socket.socket, n: int, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < n:
        k = s.recv_into(view[got:n])
        if not k:
            raise ConnectionError("peer closed")
        got += k


def _server(sock: socket.socket, reply_len: int) -> None:
    """Echo mode (reply_len 0): read a 64-byte message, send it back. Sink mode:
    read reply_len bytes, then answer one byte."""
    conn, _ = sock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(max(reply_len, 64))
    with conn:
        try:
            while True:
                if reply_len:
                    _recv_exact(conn, reply_len, buf)
                    conn.sendall(b"k")
                else:
                    _recv_exact(conn, 64, buf)
                    conn.sendall(buf[:64])
        except ConnectionError:
            pass


def _endpoint(via_proxy: bool, reply_len: int, tmp: Path):
    sock = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_server, args=(sock, reply_len), daemon=True).start()
    port, proxy = sock.getsockname()[1], None
    if via_proxy:
        listen = free_port()
        proxy = start_proxy(tmp / f"wire-{time.monotonic_ns()}.bin",
                            [Route(f"127.0.0.1:{listen}", f"127.0.0.1:{port}", "worker-0")], tmp / "proxy.log")
        port = listen
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c, proxy


def round_trips(via_proxy: bool, n: int, tmp: Path) -> np.ndarray:
    c, proxy = _endpoint(via_proxy, 0, tmp)
    msg, buf, rtt = _frame(40), bytearray(64), []
    with c:
        for _ in range(n):
            t0 = time.perf_counter_ns()
            c.sendall(msg)
            _recv_exact(c, 64, buf)
            rtt.append(time.perf_counter_ns() - t0)
    if proxy:
        stop_proxy(proxy)
    return np.array(rtt[n // 10:]) / 1e3  # µs, warm-up dropped


def big_frame_seconds(via_proxy: bool, size: int, reps: int, tmp: Path) -> list[float]:
    payload = memoryview(bytes(size))
    header = struct.pack("<QQQQ", 24 + 8, 2, 8, size) + b"\x81\xa2op\xa3big"[:8].ljust(8, b"\0")
    c, proxy = _endpoint(via_proxy, len(header) + size, tmp)
    out = []
    with c:
        for _ in range(reps):
            t0 = time.perf_counter()
            c.sendall(header)
            c.sendall(payload)
            c.recv(1)
            out.append(time.perf_counter() - t0)
    if proxy:
        stop_proxy(proxy)
    return out


def wire(tmp: Path, n_rtt: int, big: int, reps: int) -> dict:
    res = {}
    for label, via in (("direct", False), ("proxy", True)):
        rtt = round_trips(via, n_rtt, tmp)
        secs = big_frame_seconds(via, big, reps, tmp)
        res[label] = {"rtt_p50_us": float(np.percentile(rtt, 50)), "rtt_p99_us": float(np.percentile(rtt, 99)),
                      "big_frame_GiB_per_s": big / statistics.median(secs) / 2**30}
    # Each round trip crosses the proxy twice, once per message.
    res["added_latency_per_message_p50_us"] = (res["proxy"]["rtt_p50_us"] - res["direct"]["rtt_p50_us"]) / 2
    res["added_latency_per_message_p99_us"] = (res["proxy"]["rtt_p99_us"] - res["direct"]["rtt_p99_us"]) / 2
    return res


def summarize(df: pd.DataFrame, pair: tuple[str, str], by: str = "probes") -> pd.DataFrame:
    """Per graph: median makespans, and the median, range and a bootstrap 90% interval of the
    per-pair ratios B/A (the interval says how far the median could move on this machine);
    A and B are values of the column `by`."""
    a, b = pair
    wide = df.pivot_table(index=["graph", "rep"], columns=by, values="makespan_s").reset_index()
    wide["ratio"] = wide[b] / wide[a]
    table = wide.groupby("graph").agg(**{f"{a}_median_s": (a, "median"), f"{b}_median_s": (b, "median")},
                                      ratio_median=("ratio", "median"), ratio_min=("ratio", "min"),
                                      ratio_max=("ratio", "max"), pairs=("ratio", "count"))
    ci = wide.groupby("graph").ratio.apply(bootstrap_median_ci)
    table["ratio_ci90_low"], table["ratio_ci90_high"] = ci.str[0], ci.str[1]
    return table.reset_index()


def bootstrap_median_ci(ratios: pd.Series, draws: int = 10_000) -> tuple[float, float]:
    r = ratios.to_numpy()
    medians = np.median(np.random.default_rng(0).choice(r, (draws, len(r))), axis=1)
    return float(np.percentile(medians, 5)), float(np.percentile(medians, 95))


def pooled(dirs: list[Path]) -> pd.DataFrame:
    """The results of several runs of this benchmark, their pairs numbered apart."""
    sets = [pd.read_csv(d / "results.csv") for d in dirs]
    return pd.concat([df.assign(rep=df.rep + 10_000 * i) for i, df in enumerate(sets)], ignore_index=True)


def pooled_pairs(dirs: list[Path]) -> set[str]:
    """The pairs A:B the sets ran, from their results.json ("B / A")."""
    return {"{1}:{0}".format(*json.loads((d / "results.json").read_text())["compare"].split(" / ")) for d in dirs}


def probe_cpu(df: pd.DataFrame) -> pd.DataFrame:
    """Median CPU seconds per run of each measuring process, per graph and setting."""
    cols = [c for c in df.columns if c.startswith("cpu_s[")]
    if not cols:
        return pd.DataFrame()
    long = df.melt(id_vars=["graph", "probes"], value_vars=cols, var_name="process", value_name="cpu_s").dropna()
    long["process"] = long.process.str[len("cpu_s["):-1]
    return long.groupby(["graph", "probes", "process"]).cpu_s.median().reset_index()


def session_share(df: pd.DataFrame, by: str = "probes") -> pd.DataFrame:
    """Per graph and setting, medians over runs: each measuring process's CPU while the session ran,
    the cluster's, and the measuring share of it (the budget: at most 2%)."""
    cols = [c for c in df.columns if c.startswith("session_cpu_s[")] + ["session_cluster_cpu_s", "measuring_share"]
    if "measuring_share" not in df:
        return pd.DataFrame()
    out = df.dropna(subset=["measuring_share"]).groupby(["graph", by])[cols].median().reset_index()
    return out.rename(columns=lambda c: c.replace("session_cpu_s[", "").rstrip("]") if c.startswith("session_cpu_s[")
                      else c)


def bpf_share(df: pd.DataFrame) -> pd.DataFrame:
    """Per graph, setting and BPF program (and `all` of them), medians over runs: its run time per
    run (ms) and its share of the cluster's CPU over the run. BPF runs in whatever process it
    interrupts or traces: mostly the cluster's, where no measuring process's CPU shows it."""
    cols = [c for c in df.columns if c.startswith("bpf_s[")]
    if not cols:
        return pd.DataFrame()
    runs = df.dropna(subset=["run_cluster_cpu_s"]).assign(**{"bpf_s[all]": lambda d: d[cols].sum(axis=1)})
    long = runs.melt(id_vars=["graph", "probes", "run_cluster_cpu_s"], value_vars=cols + ["bpf_s[all]"],
                     var_name="program", value_name="s").dropna()
    long["program"] = long.program.str[len("bpf_s["):-1].str.removeprefix("tracepoint__")
    long["ms"], long["percent_of_cluster"] = long.s * 1000, 100 * long.s / long.run_cluster_cpu_s
    out = long.groupby(["graph", "probes", "program"], sort=False)[["ms", "percent_of_cluster"]].median()
    return out.reset_index().sort_values(["graph", "probes"], kind="stable", ignore_index=True)


def steal(df: pd.DataFrame, by: str = "probes") -> pd.DataFrame:
    """Median and largest steal per run, per graph and setting (runs recorded before steal was: none)."""
    if "steal_s" not in df:
        return pd.DataFrame()
    return df.dropna(subset=["steal_s"]).groupby(["graph", by]).steal_s.agg(["median", "max"]).reset_index()


def print_table(title: str, df: pd.DataFrame) -> None:
    table = Table(title=title)
    for col in df.columns:
        table.add_column(str(col))
    for r in df.itertuples(index=False):
        table.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r])
    Console().print(table)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", default="merge-10K,merge_slow-1K-0.01")
    ap.add_argument("--compare", help="two --probes settings A:B; reported: B/A (default none:default, what `run` costs "
                    "without options; with --pool, the pair the sets ran)")
    ap.add_argument("--repeat", type=int, default=16, help="pairs per graph, in ABBA order (default 16)")
    ap.add_argument("--wire", action="store_true", help="also the proxy's latency and big-frame throughput")
    ap.add_argument("--round-trips", type=int, default=5000)
    ap.add_argument("--big-frame-mib", type=int, default=256)
    ap.add_argument("--sample-rate", type=float, help="py-spy's rate in both settings (default: daskprobe's)")
    ap.add_argument("--cpu-hz", type=int, help="the eBPF CPU sampler's rate in both settings (default: daskprobe's)")
    ap.add_argument("--bpf-time", action="store_true",
                    help="count BPF programs' run time (kernel.bpf_stats_enabled, root; it adds a little to each run)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--pool", nargs="+", type=Path, metavar="DIR",
                    help="run nothing: summarize the pairs of earlier runs' --out directories together")
    args = ap.parse_args(argv)
    if args.compare is None and args.pool:
        if len(pairs := pooled_pairs(args.pool)) != 1:
            ap.error(f"the sets compared different pairs ({', '.join(sorted(pairs))}): say which with --compare")
        args.compare = pairs.pop()
    args.compare = args.compare or "none:default"
    a, _, b = args.compare.partition(":")
    if not a or not b:
        ap.error("--compare wants two --probes settings A:B, e.g. none:default or none:proxy")
    pair = sides(a, b)
    if args.bpf_time and os.geteuid() != 0:
        ap.error("--bpf-time needs root: it sets kernel.bpf_stats_enabled")
    if args.pool:
        raw = pooled(args.pool)
        print_table(f"makespan ratio {b} / {a}, pooled over {len(args.pool)} sets", summarize(raw, pair))
        if not (stolen := steal(raw)).empty:
            print_table(STEAL_TITLE, stolen)
        return 0
    out = args.out or Path("runs") / f"bench-overhead-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    results = {"compare": f"{b} / {a}", "sample_rate": args.sample_rate}
    if args.wire:
        with tempfile.TemporaryDirectory() as tmp:
            results["wire"] = wire(Path(tmp), args.round_trips, args.big_frame_mib << 20, 5)
    run_args = ["--sample-rate", str(args.sample_rate)] * bool(args.sample_rate) + \
        ["--cpu-hz", str(args.cpu_hz)] * bool(args.cpu_hz)
    was = args.bpf_time and ebpf_format.stats_enabled()
    try:
        if args.bpf_time:
            ebpf_format.stats_enabled(True)
        raw = makespans(args.graphs.split(","), dict(zip(pair, (a, b))), args.repeat, out, console, run_args)
    finally:
        if args.bpf_time:
            ebpf_format.stats_enabled(was)
    summary, cpu, stolen, share = summarize(raw, pair), probe_cpu(raw), steal(raw), session_share(raw)
    in_bpf = bpf_share(raw)
    raw.to_csv(out / "results.csv", index=False)
    results |= {"makespan": summary.to_dict("records"), "probe_cpu_s": cpu.to_dict("records"),
                "session_cpu": share.to_dict("records"), "steal_s": stolen.to_dict("records"),
                "bpf_ms": in_bpf.to_dict("records")}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print_table(f"makespan ratio {b} / {a} (median of ABBA pairs)", summary)
    if not cpu.empty:
        print_table("CPU seconds per run of each measuring process (median)", cpu)
    if not share.empty:
        print_table("CPU seconds while the session ran: each measuring process, the cluster, and the measuring "
                    "share of the cluster's (median over runs; budget 0.02)", share)
    if not in_bpf.empty:
        print_table("milliseconds per run in each BPF program, and as a share of the cluster's CPU over the run "
                    "(median over runs; spent in the processes they trace or interrupt)", in_bpf)
    if not stolen.empty:
        print_table(STEAL_TITLE, stolen)
    if args.wire:
        Console().print_json(json.dumps(results["wire"]))
    console.log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
