"""Benchmark: fuzz the decoder, from a capture to tables, with random messages.

    python -m daskprobe.experiments.fuzz_decode --inputs 1M

Each input is one message a peer could send: random bytes, random msgpack
values, or Dask ops (compute-task, task-finished, update-graph, ...) whose
fields hold random values. They are written as the proxy writes captures, in
batches, decoded into the messages, attempts and graphs tables and written
against their schemas, as a run's tables stage does. Every input must end up as at least one row (decoded, or
`undecodable` with its error); any exception is a failure and is printed with
the input that caused it. Prints inputs, seconds, rows by kind and failures.
(tests/unit/test_decode.py runs a few hundred such inputs under hypothesis.)
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
import time
from pathlib import Path

import msgpack

from ..probes.proxy_capture import CaptureWriter, read_capture
from ..probes.rundir import RunDir
from ..tracer.decode import tables
from ..tracer.decode.messages import messages_table
from ..tracer.bench.workloads import count

OPS = ["compute-task", "task-finished", "task-erred", "update-graph", "free-keys", "steal-request", "reschedule",
       "key-in-memory", "heartbeat_worker", "register-worker"]
FIELDS = ["key", "keys", "run_id", "startstops", "who_has", "stimulus_id", "now", "time", "nbytes", "thread"]
ANCHOR = {"monotonic_ns": 0, "wall_ns": 1_800_000_000 * 10**9}
PROCS = tables.processes_table({"processes": [
    {"name": n, "role": r, "pid": p, "listen": None, "contact": None, "command": []}
    for n, r, p in (("scheduler", "scheduler", 10), ("client", "client", 9), ("worker-0", "worker", 11))]})


def value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(10 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([0, 1, -1, 2**63 - 1, -2**63, 2**64 - 1, rng.randrange(-2**31, 2**31)])
    if kind == 2:
        return rng.choice([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e308, rng.random() * 2e9])
    if kind == 3:
        return rng.choice(["", "x", "compute-task-1.5", "t--inf", "a" * rng.randrange(100)])
    if kind == 4:
        return rng.randbytes(rng.randrange(12))
    if kind == 5:
        return rng.random() < 0.5
    if kind in (6, 7):
        return [value(rng, depth + 1) for _ in range(rng.randrange(5))]
    keys = [rng.choice(FIELDS + ["op", "action", "start", "stop", "as-list", "__Set__"]) for _ in range(rng.randrange(5))]
    return {k: value(rng, depth + 1) for k in keys}


def message(rng: random.Random) -> bytes:
    """One frame 0: random bytes, a random value, or a Dask op with random fields."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(40))
    if kind == 1:
        return msgpack.packb(value(rng), use_bin_type=True)
    op = {"op": rng.choice(OPS), **{f: value(rng) for f in rng.sample(FIELDS, rng.randrange(len(FIELDS)))}}
    return msgpack.packb([op] if kind == 3 else op, use_bin_type=True)


def decode_batch(frames: list[bytes], path: Path) -> dict:
    with open(path, "wb") as f:
        w = CaptureWriter(io.BufferedWriter(f, 1 << 22))
        w.open(1, 0, "scheduler", 9)
        w.open(2, 0, "scheduler", 11)
        for i, frame in enumerate(frames):
            w.message(1 + i % 2, i % 2, 1_000 * i, None, frame0=frame)
        w.f.flush()
    cap = read_capture(path)
    msgs, events = messages_table(cap, tables.connections_table(cap, PROCS), jobs=1)
    run = RunDir(path.parent)  # written as the tables stage writes them: checked against their schemas
    (run / "tables").mkdir(exist_ok=True)
    run.write_table("messages", msgs)
    run.write_table("attempts", tables.task_tables(events, msgs, ANCHOR))
    run.write_table("graphs", tables.graphs_table(events["graphs"], msgs))
    missing = set(range(len(frames))) - set(msgs.msg_id)
    if missing:
        raise AssertionError(f"{len(missing)} inputs left no row, e.g. {frames[min(missing)]!r}")
    return msgs.op.where(msgs.op == "undecodable", "decoded").value_counts().to_dict()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", default="1M")
    p.add_argument("--batch", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    n, rng, rows, failures = count(args.inputs), random.Random(args.seed), {}, 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for first in range(0, n, args.batch):
            frames = [message(rng) for _ in range(min(args.batch, n - first))]
            try:
                for k, v in decode_batch(frames, Path(tmp) / "proxy.bin").items():
                    rows[k] = rows.get(k, 0) + v
            except Exception as e:  # a crash of the decoder: the benchmark's failure
                failures += 1
                print(f"batch from input {first}: {type(e).__name__}: {e}", file=sys.stderr)
            print(f"{min(first + args.batch, n):,} inputs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    print(f"inputs: {n:,}; seconds: {time.perf_counter() - start:.1f}; rows: {rows}; failed batches: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
