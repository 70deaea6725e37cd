"""Task graphs named as in "Runtime vs Scheduler: Analyzing Dask's Overheads".

    python -m daskprobe.experiments.workloads merge-10K
    python -m daskprobe.experiments.workloads merge_slow-1K-0.01

Runs the graph on the cluster at DASK_SCHEDULER_ADDRESS, checks its result,
and prints one JSON line: {"graph", "tasks", "makespan_s"}, where makespan_s
is the client's wall time from compute() to the result in hand.
"""

from __future__ import annotations

import json
import re
import sys
import time

from dask import delayed

SUFFIX = {"": 1, "K": 1_000, "M": 1_000_000}


def count(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KM]?)", text)
    if not m:
        raise ValueError(f"not a task count: {text!r} (e.g. 500, 10K, 1M)")
    return int(m.group(1)) * SUFFIX[m.group(2)]


def noop(i):
    return i


def sleep_for(i, seconds):
    time.sleep(seconds)
    return i


def merge(*parts):
    return len(parts)


def merge_graph(n: int):
    """merge-N: N independent no-op tasks, then one task that takes them all."""
    return delayed(merge)(*[delayed(noop)(i, dask_key_name=f"noop-{i}") for i in range(n)]), n, n + 1


def merge_slow_graph(n: int, seconds: float):
    """merge_slow-N-T: N tasks that each sleep T seconds, then one merge."""
    parts = [delayed(sleep_for)(i, seconds, dask_key_name=f"slow-{i}") for i in range(n)]
    return delayed(merge)(*parts), n, n + 1


def build(name: str):
    """(graph, expected result, number of tasks) for a graph name."""
    kind, *params = name.split("-")
    if kind == "merge" and len(params) == 1:
        return merge_graph(count(params[0]))
    if kind == "merge_slow" and len(params) == 2:
        return merge_slow_graph(count(params[0]), float(params[1]))
    raise ValueError(f"unknown graph {name!r}; known: merge-N, merge_slow-N-T")


def main(name: str) -> int:
    from distributed import Client

    graph, expected, tasks = build(name)
    with Client() as client:
        start = time.perf_counter()
        result = client.compute(graph).result()
        makespan = time.perf_counter() - start
    if result != expected:
        print(f"{name}: wrong result {result!r}, expected {expected!r}", file=sys.stderr)
        return 1
    print(json.dumps({"graph": name, "tasks": tasks, "makespan_s": makespan}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
