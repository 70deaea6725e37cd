"""Client think time: pandas work on the client between computations.

After each compute the script post-processes the result with pandas on the
client (a pivot, rolling windows, a merge with a lookup table), while the
cluster sits idle. Twin (PLANT=0): the same computations, the client's
post-processing skipped.

cause: client think time
expect: client
options: --workers 2 --threads 1
"""

import os

import dask
import numpy as np
import pandas as pd
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"


def report(hourly: pd.DataFrame) -> pd.DataFrame:
    """The analyst's post-processing: a few seconds of pandas on the client."""
    rng = np.random.default_rng(0)
    wide = pd.DataFrame(rng.standard_normal((300_000, 20)), columns=[f"c{i}" for i in range(20)])
    wide["key"] = rng.integers(0, 5000, len(wide))
    rolled = wide.groupby("key").rolling(50, min_periods=1).mean()
    lookup = pd.DataFrame({"key": np.arange(5000), "weight": rng.random(5000)})
    return rolled.reset_index().merge(lookup, on="key").describe().join(hourly.describe(), rsuffix="_h")


if __name__ == "__main__":
    with Client() as client:
        df = dask.datasets.timeseries(start="2000-01-01", end="2000-01-11", freq="5s", partition_freq="1D",
                                      seed=2)
        for column in ("x", "y", "id"):
            hourly = df[column].resample("1h").mean().compute().to_frame()
            if PLANT:
                print(report(hourly).shape)
