"""GIL among task threads: pure-Python tasks on one worker with four threads.

Each task scores a batch of records with a pure-Python loop, which holds the
GIL: the four task threads take turns, so the worker runs them one at a time
while Dask believes it runs four. Twin (PLANT=0): the same scoring written
with numpy, which releases the GIL inside its loops.

cause: GIL among task threads
expect: task-gil, gil-contention
options: --workers 1 --threads 4
"""

import os

import numpy as np
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"
N = 1_000_000  # records per batch


def score_python(seed):
    total, x = 0.0, seed
    for i in range(N):
        x = (x * 1103515245 + 12345) % 2147483648
        total += (x % 1000) ** 0.5
    return total


def score_numpy(seed):
    x = np.random.default_rng(seed).integers(0, 1000, N * 4)
    return float(np.sqrt(x).sum())


if __name__ == "__main__":
    with Client() as client:
        score = score_python if PLANT else score_numpy
        futures = client.map(score, range(16))
        print(sum(client.gather(futures)))
