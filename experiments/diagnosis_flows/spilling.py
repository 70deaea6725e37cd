"""Memory pressure and spilling: a 1.2 GB array persisted on workers whose
memory target is 380 MB each, then three passes over it.

The benchmark gives each worker a memory target of 3% and a spill threshold
of 4% of its memory limit (on this 24 GB machine with 2 workers: 0.38 and
0.5 GB; the options below). Persisting 0.6 GB per worker spills part of it
to disk, and every pass reads it back. Twin (PLANT=0): the same three
statistics in one dask.compute over the unpersisted array, which streams
through memory.

cause: memory pressure and spilling
expect: spilling
options: --workers 2 --threads 1 --config distributed.worker.memory.target=0.03 --config distributed.worker.memory.spill=0.04
"""

import os

import dask
import dask.array as da
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"
SHAPE = (15_000, 10_000)  # float64: 1.2 GB


def statistics(x):
    return x.mean(), x.std(), abs(x).max()


if __name__ == "__main__":
    with Client() as client:
        x = da.random.default_rng(0).standard_normal(SHAPE, chunks=(1000, SHAPE[1]))
        if PLANT:
            x = x.persist()
            print([float(s.compute()) for s in statistics(x)])
        else:
            print([float(s) for s in dask.compute(*statistics(x))])
