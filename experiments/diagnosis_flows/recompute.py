"""Recomputation: an expensive cleaned frame used by three separate computes
without persist, so each compute parses and filters the raw data again.

Twin (PLANT=0): the three results computed together with one dask.compute,
which runs the cleaning once.

cause: recomputation
expect: recomputed
options: --workers 2 --threads 1
"""

import os

import dask
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"


def parse(part):
    part = part.copy()
    part["label"] = part["name"].str.upper().str.slice(0, 3) + part["id"].astype(str)
    part["score"] = (part.x * 1000).round().astype(int) % 97
    return part[part.score > 10]


if __name__ == "__main__":
    with Client() as client:
        raw = dask.datasets.timeseries(start="2000-01-01", end="2000-01-31", freq="1s", partition_freq="1D",
                                       seed=3)
        clean = raw.map_partitions(parse)
        outputs = (clean.score.mean(), clean.label.nunique(), clean.groupby("name").x.sum())
        if PLANT:
            print([o.compute() for o in outputs][:2])
        else:
            print(dask.compute(*outputs)[:2])
