"""What-if: predict a run's makespan under other settings, from the run's own tables.

The captured jobs are replayed in a discrete-event model of the Dask runtime
(replay.py): the same keys and dependencies, each task's compute as measured,
results of the measured sizes, the scheduler's and the workers' per-task costs
and the links' latency and bandwidth as measured (capture.py, costs.py), the
batched sends, the worker threads and the machine's cores. A change (Changes)
alters the model; predict.py replays the run unchanged and changed, with
resampled durations, and scales the change by how well the unchanged replay
matched the run (docs/whatif.md).
"""

from .predict import Changes, NotModelled, predict, sweep

__all__ = ["Changes", "NotModelled", "predict", "sweep"]
