"""A slow pure-Python UDF: a groupby-apply on a dask dataframe whose function
walks each group's rows in Python.

`sessionize` is the user's own function: it loops over rows with iterrows,
so nearly all the compute is in it. Twin (PLANT=0): the same answer from
pandas' built-in groupby aggregations.

cause: a slow pure-Python UDF
expect: hot-function
options: --workers 2 --threads 1
"""

import os

import dask
import pandas as pd
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"


def sessionize(group: pd.DataFrame) -> pd.Series:
    visits, last, total = 0, None, 0.0
    for _, row in group.iterrows():
        if last is None or (row["timestamp"] - last).total_seconds() > 60:
            visits += 1
        last = row["timestamp"]
        total += row["x"] * row["y"]
    return pd.Series({"visits": visits, "total": total})


if __name__ == "__main__":
    with Client() as client:
        df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-09", freq="6s", partition_freq="1D",
                                      seed=1).reset_index()
        df["xy"] = df.x * df.y
        if PLANT:
            out = df.groupby("name").apply(sessionize, meta={"visits": "i8", "total": "f8"})
        else:
            out = df.groupby("name").agg({"timestamp": "count", "xy": "sum"})
        print(out.compute().head())
