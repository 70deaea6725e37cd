"""Scripts as Dask users write them, for the attribution benchmark.

    python -m daskprobe.experiments.flows NAME

Each runs its computation ROUNDS times on the cluster at
DASK_SCHEDULER_ADDRESS (a plain Client(), as a user would), the client doing
its own work for THINK seconds between rounds, and each task working
TASK_S seconds longer than it needs to (both from the environment, for the
causes the benchmark injects; 0 by default). Prints one JSON line.

    chain    a 40-task chain of delayed calls
    merge    1,500 tiny tasks and one task that takes them all
    tree     pairwise sums up a binary tree of 1,024 leaves
    etl      a dataframe ETL: timeseries, a join with a small frame, groupby
             aggregates, set_index (a shuffle with hidden computes), one
             dask.compute of several outputs
    futures  a dask.array step, then a futures loop with as_completed that
             resubmits some results, then a reduction tree of futures
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

THINK_S = float(os.environ.get("THINK_S", "0"))
TASK_S = float(os.environ.get("TASK_S", "0"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))


def work(x):
    if TASK_S:
        time.sleep(TASK_S)
    return x


def inc(x):
    return work(x) + 1


def total(*parts):
    return work(len(parts))


def add(a, b):
    return work(a) + b


def chain(client, r: int) -> int:
    from dask import delayed
    x = 0
    for i in range(40):
        x = delayed(inc)(x, dask_key_name=f"step-{r}-{i}")
    return client.compute(x).result()


def merge(client, r: int) -> int:
    from dask import delayed
    parts = [delayed(inc)(i, dask_key_name=f"part-{r}-{i}") for i in range(1500)]
    return client.compute(delayed(total)(*parts, dask_key_name=f"total-{r}")).result()


def tree(client, r: int) -> int:
    from dask import delayed
    level = [delayed(work)(i, dask_key_name=f"leaf-{r}-{i}") for i in range(1024)]
    while len(level) > 1:
        level = [delayed(add)(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return client.compute(level[0]).result()


def etl(client, r: int):
    import dask
    import pandas as pd
    ts = dask.datasets.timeseries(start="2000-01-01", end="2000-01-13", freq="10s", partition_freq="1D",
                                  seed=r).reset_index()
    ts["hour"] = ts.timestamp.dt.hour
    regions = pd.DataFrame({"name": ["Alice", "Bob", "Charlie", "Dan", "Edith", "Frank", "George", "Hannah"],
                            "region": list("NSEWNSEW")})
    big = ts.merge(regions, on="name", how="left").map_partitions(_slow, meta=ts._meta.assign(region="x"))
    by_hour = big.groupby(["region", "hour"]).x.agg(["mean", "std", "count"])
    by_id = big[big.y > 0].set_index("id").x.groupby("id").sum()
    out = dask.compute(by_hour, by_id.nlargest(10), big.x.max())
    return len(out[0])


def _slow(df):
    work(0)
    return df


def futures(client, r: int) -> float:
    import dask.array as da
    from distributed import as_completed
    x = da.random.default_rng(r).random((2000, 2000), chunks=(250, 250))
    m = client.compute((x + x.T).mean(axis=0).sum()).result()
    futs = [client.submit(_step, r, i, pure=False) for i in range(60)]
    ac, done = as_completed(futs), 0
    for f in ac:
        done += 1
        if f.result() % 5 == 0 and done < 90:
            ac.add(client.submit(_step, r, done + 1000, pure=False))
    level = [client.submit(_step, r, i, pure=False) for i in range(32)]
    while len(level) > 1:
        level = [client.submit(add, level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return m + level[0].result()


def _step(r, i):
    rng = np.random.default_rng(i)
    rng.random(50_000).sum()
    return work(i)


FLOWS = {"chain": chain, "merge": merge, "tree": tree, "etl": etl, "futures": futures}


def main(name: str) -> int:
    from distributed import Client
    with Client() as client:
        start = time.perf_counter()
        for r in range(ROUNDS):
            if r:
                _think(THINK_S)
            FLOWS[name](client, r)
        wall = time.perf_counter() - start
    print(json.dumps({"flow": name, "rounds": ROUNDS, "think_s": THINK_S, "task_s": TASK_S, "wall_s": wall}))
    return 0


def _think(seconds: float) -> None:
    """The client's own work between computations: CPU in this process, not waiting on the cluster."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(i * i for i in range(1000))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
