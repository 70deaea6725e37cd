"""What daskprobe can run besides the user's own: the paper's variants of
scheduler and worker (`run --scheduler random`, `--worker zero`), many workers
in one process (`--workers-per-process`), and the built-in demo workload.

A variant is a preload file given to Dask by path (the cluster's interpreter,
`--python`, may not have daskprobe installed) and the Dask config it needs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    help: str
    preload: str | None = None  # module of this package, loaded by Dask from its file
    config: dict = field(default_factory=dict)  # wins over the user's: random with stealing is not random

    def preload_files(self) -> list[Path]:
        if self.preload is None:
            return []
        return [Path(importlib.util.find_spec(f"daskprobe.tracer.variants.{self.preload}").origin)]


SCHEDULERS = {
    "ws": Variant("Dask's own policy (work stealing, root-task queuing)"),
    "random": Variant("each ready task to a uniformly random worker; work stealing and queuing off "
                      "(the paper's random scheduler)", "random_scheduler",
                      {"distributed.scheduler.work-stealing": "False",
                       "distributed.scheduler.worker-saturation": "inf"}),
}
WORKERS = {
    "normal": Variant("Dask's worker"),
    "zero": Variant("every task completes at once with a placeholder result, so only runtime overhead "
                    "remains (the paper's zero worker)", "zero_worker"),
}
DEMO_MODULE = "daskprobe.tracer.variants.demo"  # run as `python -m`: 1,000 tasks and a sum
MAX_PROCESSES = 256  # worker processes at most (~70 MB each): beyond, --workers-per-process


def worker_host() -> Path:
    """The script that runs many workers in one process (--workers-per-process), run by path."""
    return Path(importlib.util.find_spec("daskprobe.tracer.variants.worker_host").origin)

