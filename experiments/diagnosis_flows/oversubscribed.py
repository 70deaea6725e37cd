"""More busy threads than cores: 4 workers x 2 threads of numeric work on a
2-core machine (the benchmark runs it with the options below).

All 32 tasks are submitted at once, so 8 task threads compete for 2 cores:
each task takes four times its CPU time and the scheduler, the workers' event
loops and the client wait for a CPU too. Twin (PLANT=0): the same tasks, the
script keeping at most as many in flight as the machine has cores.

cause: more busy threads than cores
expect: cpu-starvation
options: --workers 4 --threads 2
"""

import os

import numpy as np
from distributed import Client, as_completed

PLANT = os.environ.get("PLANT", "1") != "0"
TASKS = 32


def simulate(seed):
    x = np.random.default_rng(seed).standard_normal((1_500_000,))
    for _ in range(8):
        x = np.sort(np.cumsum(x) % 7.0)
    return float(x.mean())


if __name__ == "__main__":
    with Client() as client:
        if PLANT:
            results = client.gather(client.map(simulate, range(TASKS)))
        else:
            window = os.cpu_count() or 1
            pending, results = iter(range(TASKS)), []
            running = as_completed([client.submit(simulate, next(pending)) for _ in range(window)])
            for done in running:
                results.append(done.result())
                for seed in pending:
                    running.add(client.submit(simulate, seed))
                    break
        print(len(results), sum(results))
