"""Task graphs named as in "Runtime vs Scheduler: Analyzing Dask's Overheads".

    python -m daskprobe.tracer.bench.workloads merge-10K
    python -m daskprobe.tracer.bench.workloads groupby-1-1s-1h

Runs the graph on the cluster at DASK_SCHEDULER_ADDRESS, checks its result,
and prints one JSON line: {"graph", "tasks", "makespan_s", "check"}, where
makespan_s is the client's wall time from compute() to the result in hand and
tasks the size of the graph the client submits (after optimization).

With the zero worker (DASKPROBE_WORKER=zero) every result is a placeholder,
so the check is skipped and "check" says so.
"""

from __future__ import annotations

import inspect
import json
import os
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from dask import delayed

SUFFIX = {"": 1, "K": 1_000, "M": 1_000_000}


def count(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KM]?)", text)
    if not m:
        raise ValueError(f"not a count: {text!r} (e.g. 500, 10K, 1M)")
    return int(m.group(1)) * SUFFIX[m.group(2)]


@dataclass
class Graph:
    collection: Any
    check: Callable[[Any], bool]  # is this the right result?


# --- merge, merge_slow, tree: plain delayed graphs --------------------------

def noop(i):
    return i


def sleep_for(i, seconds):
    time.sleep(seconds)
    return i


def merge(*parts):
    return len(parts)


def add(a, b):
    return a + b


def merge_graph(n: str) -> Graph:
    """merge-N: N independent no-op tasks, then one task that takes them all."""
    n = count(n)
    parts = [delayed(noop)(i, dask_key_name=f"noop-{i}") for i in range(n)]
    return Graph(delayed(merge)(*parts), lambda r: r == n)


def merge_slow_graph(n: str, seconds: str) -> Graph:
    """merge_slow-N-T: N tasks that each sleep T seconds, then one merge."""
    n = count(n)
    parts = [delayed(sleep_for)(i, float(seconds), dask_key_name=f"slow-{i}") for i in range(n)]
    return Graph(delayed(merge)(*parts), lambda r: r == n)


def tree_graph(depth: str) -> Graph:
    """tree-N: pairwise sums of 2^N numbers up a binary tree (2^N - 1 tasks)."""
    level = list(range(2 ** int(depth)))
    expected = sum(level)
    while len(level) > 1:
        level = [delayed(add)(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return Graph(level[0], lambda r: r == expected)


# --- numpy, groupby, join, xarray: collections, checked against a local run ---

def against_local(collection) -> Callable[[Any], bool]:
    """The same graph run in this process by Dask's synchronous scheduler."""
    def check(result) -> bool:
        import pandas as pd
        expected = collection.compute(scheduler="sync")
        if isinstance(expected, (pd.Series, pd.DataFrame)):
            return np.allclose(np.asarray(result.sort_index()), np.asarray(expected.sort_index()))
        return bool(np.allclose(result, expected))
    return check


def numpy_graph(n: str, chunk: str) -> Graph:
    """numpy-N-P: an N x N random array in P x P chunks; x + x.T, then a strided mean and a sum."""
    import dask.array as da
    n, chunk = count(n), count(chunk)
    x = da.random.default_rng(0).random((n, n), chunks=(chunk, chunk))
    y = (x + x.T)[::2, n // 2:].mean(axis=1).sum()
    return Graph(y, against_local(y))


def timeseries(days: str, freq: str, partition_freq: str, seed: int):
    import dask.datasets
    start = np.datetime64("2000-01-01")
    return dask.datasets.timeseries(start=str(start), end=str(start + np.timedelta64(int(days), "D")),
                                    freq=freq, partition_freq=partition_freq, seed=seed)


def groupby_graph(days: str, freq: str, partition_freq: str) -> Graph:
    """groupby-D-F-P: D days of dask.datasets.timeseries, a record every F, a partition every P;
    mean of x per name."""
    r = timeseries(days, freq, partition_freq, 0).groupby("name").x.mean()
    return Graph(r, against_local(r))


def join_graph(days: str, freq: str, partition_freq: str) -> Graph:
    """join-D-F-P: two such timeseries joined on their time index, then sum of x * x_right."""
    left, right = timeseries(days, freq, partition_freq, 0), timeseries(days, freq, partition_freq, 1)
    joined = left.join(right[["x"]], rsuffix="_right")
    r = (joined.x * joined.x_right).sum()
    return Graph(r, against_local(r))


def _anomaly(block, climatology):
    return (block.groupby("time.month") - climatology).drop_vars("month")


def xarray_graph(chunk: str) -> Graph:
    """xarray-N: a synthetic 3-D (time, lat, lon) field shaped like xarray's air_temperature,
    made on the workers in N x N chunks in space; monthly climatology, each block's anomaly
    against it, sum."""
    import dask.array as da
    import pandas as pd
    import xarray as xr
    times = pd.date_range("2013-01-01", periods=2920, freq="6h")
    values = da.random.default_rng(0).normal(280, 10, (times.size, 25, 53), chunks=(-1, int(chunk), int(chunk)))
    air = xr.DataArray(values, dims=("time", "lat", "lon"), coords={"time": times}, name="air")
    # Anomalies block by block (time is one chunk): xarray's groupby arithmetic on a
    # dask array would shuffle time into months and grow the graph a hundredfold.
    climatology = air.groupby("time.month").mean("time")
    r = xr.map_blocks(_anomaly, air, args=[climatology], template=air).sum().data
    return Graph(r, against_local(r))


# --- bag: synthetic records --------------------------------------------------

def person(i: int) -> dict:
    rng = random.Random(i)
    return {"id": i, "age": rng.randint(18, 80), "occupation": rng.choice(["a", "b", "c", "d"])}


def bag_graph(n: str, partitions: str) -> Graph:
    """bag-N-P: N synthetic people in P partitions; keep those over 30, pair every one with
    every other (a P x P product), sum the products of their ages."""
    import dask.bag as db
    n = count(n)
    ages = db.from_sequence(range(n), npartitions=int(partitions)).map(person).filter(
        lambda p: p["age"] > 30).pluck("age")
    r = ages.product(ages).map(lambda pair: pair[0] * pair[1]).sum()
    total = sum(a for i in range(n) if (a := person(i)["age"]) > 30)
    return Graph(r, lambda result: result == total * total)


GRAPHS = {
    "merge": merge_graph, "merge_slow": merge_slow_graph, "tree": tree_graph, "numpy": numpy_graph,
    "groupby": groupby_graph, "join": join_graph, "bag": bag_graph, "xarray": xarray_graph,
}
EXAMPLES = "merge-10K, merge_slow-1K-0.01, tree-15, numpy-2K-200, groupby-1-1s-1h, join-1-1s-1h, bag-2K-10, xarray-5"


def check_name(name: str) -> None:
    """Fail on an unknown graph or a wrong number of parameters, without building it."""
    kind, *params = name.split("-")
    if kind not in GRAPHS:
        raise ValueError(f"unknown graph {name!r}; known, for example: {EXAMPLES}")
    try:
        inspect.signature(GRAPHS[kind]).bind(*params)
    except TypeError:
        raise ValueError(f"{name!r}: {GRAPHS[kind].__doc__.split(':')[0]} takes "
                         f"{len(inspect.signature(GRAPHS[kind]).parameters)} parameters; "
                         f"for example: {EXAMPLES}") from None


def build(name: str) -> Graph:
    check_name(name)
    kind, *params = name.split("-")
    try:
        return GRAPHS[kind](*params)
    except ValueError as e:
        raise ValueError(f"bad parameters in {name!r} ({e}); for example: {EXAMPLES}") from None


def tasks_in(collection) -> int:
    from dask.base import collections_to_expr
    return len(collections_to_expr([collection], optimize_graph=True).optimize().__dask_graph__())


def main(name: str) -> int:
    from distributed import Client

    graph = build(name)
    with Client() as client:
        start = time.perf_counter()
        result = client.compute(graph.collection).result()
        makespan = time.perf_counter() - start
    if os.environ.get("DASKPROBE_WORKER") == "zero":
        check = "skipped (zero worker: results are placeholders)"
    elif graph.check(result):
        check = "ok"
    else:
        print(f"{name}: wrong result {result!r}", file=sys.stderr)
        return 1
    print(json.dumps({"graph": name, "tasks": tasks_in(graph.collection), "makespan_s": makespan,
                      "check": check}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
