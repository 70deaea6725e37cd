"""Micro-tasks: 5,000 delayed calls of a microsecond each, and one sum.

The loop builds one task per record, so Dask's work per task (a millisecond
or so) dwarfs each task's own. Twin (PLANT=0): the same records in 5
batches of 1,000, one delayed call per batch.

cause: micro-tasks
expect: task-overhead, scheduler-bound, graph-materialization, client-graph
options: --workers 2 --threads 1
"""

import os

from dask import delayed
from distributed import Client

PLANT = os.environ.get("PLANT", "1") != "0"
RECORDS = 5_000  # 20,000 took 146 s and 8,000 42 s on this 2-core machine, with no probe


def clean(record):
    return record * 2 + 1


def clean_batch(records):
    return [clean(r) for r in records]


@delayed
def total(*parts):
    return sum(sum(p) if isinstance(p, list) else p for p in parts)


if __name__ == "__main__":
    with Client() as client:
        if PLANT:
            parts = [delayed(clean)(r) for r in range(RECORDS)]
        else:
            parts = [delayed(clean_batch)(range(i, i + 1000)) for i in range(0, RECORDS, 1000)]
        print(total(*parts).compute())
