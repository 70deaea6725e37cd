"""Stragglers: a futures loop over 100 partitions, two of which are 40x the rest.

The partitions' sizes are skewed the way real data is (one customer, one day
holds most of it): 98 tasks take about 50 ms, two take 40 times that, and
the as_completed loop waits for them at the end. Twin (PLANT=0): every
partition the same size.

cause: stragglers
expect: straggler
options: --workers 2 --threads 1
"""

import os

import numpy as np
from distributed import Client, as_completed

PLANT = os.environ.get("PLANT", "1") != "0"
BASE = 400_000  # rows in a typical partition: about 50 ms of sorting


def partition_rows(i):
    return BASE * 40 if PLANT and i in (37, 81) else BASE


def summarize(i, rows):
    x = np.random.default_rng(i).standard_normal(rows)
    x.sort()
    return float(x[rows // 2])


if __name__ == "__main__":
    with Client() as client:
        futures = [client.submit(summarize, i, partition_rows(i)) for i in range(100)]
        medians = []
        for future in as_completed(futures):
            medians.append(future.result())
        print(len(medians), float(np.median(medians)))
