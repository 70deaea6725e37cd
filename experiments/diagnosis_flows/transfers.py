"""Large transfers between workers: a rechunk from row blocks to column blocks
of a 512 MB array, so every output block gathers a piece of every input.

Twin (PLANT=0): the same column statistics computed on the row blocks as
they are (per-block partial sums, combined), which moves only small results.

cause: large transfers between workers
expect: transfers, network
options: --workers 2 --threads 1
"""

import os

import dask.array as da
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"
N = 8000  # float64 8000 x 8000: 512 MB


if __name__ == "__main__":
    with Client() as client:
        x = da.random.default_rng(0).standard_normal((N, N), chunks=(500, N))
        if PLANT:
            x = x.rechunk((N, 500))  # all-to-all: each column block needs every row block
        centered = x - x.mean(axis=0)
        print(float((centered ** 2).mean(axis=0).max().compute()))
