"""Data in the graph: a 200 MB numpy array made on the client and wrapped with
da.from_array, then three computations over it.

Every compute ships the array inside the graph again: the client pickles it,
the scheduler holds it, a worker receives it. Twin (PLANT=0): the same array
generated on the workers by dask.array.

cause: data in the graph
expect: data-in-graph
options: --workers 2 --threads 1
"""

import os

import dask.array as da
import numpy as np
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"
SHAPE = (5000, 5000)  # float64: 200 MB


if __name__ == "__main__":
    with Client() as client:
        if PLANT:
            x = da.from_array(np.random.default_rng(0).standard_normal(SHAPE), chunks=(500, 5000))
        else:
            x = da.random.default_rng(0).standard_normal(SHAPE, chunks=(500, 5000))
        print(float(x.mean().compute()))
        print(float(x.std().compute()))
        print(float(abs(x).max().compute()))
