"""Memory pressure and spilling: a 2.4 GB array persisted on workers whose
memory target is 600 MB each, then four passes over it.

The benchmark gives each worker a memory target of 5% and a spill threshold
of 6% of its memory limit (on a 24 GB machine with 2 workers: 0.6 and 0.7 GB;
the options below). Persisting 1.2 GB per worker spills half of it to disk,
and every pass reads it back. Twin (PLANT=0): the same four statistics in one
dask.compute over the unpersisted array, which streams through memory.

cause: memory pressure and spilling
expect: spilling
options: --workers 2 --threads 1 --config distributed.worker.memory.target=0.05 --config distributed.worker.memory.spill=0.06
"""

import os

import dask
import dask.array as da
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"
SHAPE = (30_000, 10_000)  # float64: 2.4 GB


if __name__ == "__main__":
    with Client() as client:
        x = da.random.default_rng(0).standard_normal(SHAPE, chunks=(1000, SHAPE[1]))
        stats = (x.mean(), x.std(), abs(x).max(), (x > 2).sum())
        if PLANT:
            x = x.persist()
            stats = (x.mean(), x.std(), abs(x).max(), (x > 2).sum())
            print([float(s.compute()) for s in stats])
        else:
            print([float(s) for s in dask.compute(*stats)])
