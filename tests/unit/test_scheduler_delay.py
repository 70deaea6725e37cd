"""Undoing the workers' scheduler_delay: on one host the true clock offset is zero, so every
compute span must end up between its compute-task arriving and its task-finished leaving."""

import numpy as np
import pandas as pd

from daskprobe.tracer.decode.attempts import undo_scheduler_delay

MS = 1_000_000
ANCHOR = {"wall_ns": 0, "monotonic_ns": 0}  # wall = monotonic: the heartbeats' times read as is


def attempts(rows) -> pd.DataFrame:
    """rows: (compute-task arrives, start, stop, task-finished leaves) in ms, start/stop as the worker
    reported them (shifted by its delay estimate)."""
    a = pd.DataFrame([{"worker": "worker-0", "compute_recv_ns": r * MS, "compute_start_ns": s * MS,
                       "compute_stop_ns": e * MS, "finished_sent_ns": f * MS, "transfer_start_ns": pd.NA,
                       "transfer_stop_ns": pd.NA} for r, s, e, f in rows])
    return a.astype({c: "Int64" for c in a.columns if c.endswith("_ns")})


def heartbeat(at_ms: float, delay_ms: float) -> pd.DataFrame:
    """A heartbeat whose reply reached the proxy at `at_ms`, making the worker's estimate `delay_ms`."""
    now = (at_ms - 2) / 1e3
    return pd.DataFrame({"src": ["worker-0"], "t_last_ns": [int(at_ms * MS)], "now": [now],
                         "time": [(now + at_ms / 1e3) / 2 + delay_ms / 1e3]})


def test_a_worker_estimate_is_taken_off_its_spans():
    a = undo_scheduler_delay(attempts([(10, 60, 70, 75), (80, 130, 140, 145)]), heartbeat(5, 50), ANCHOR)
    assert list(a.compute_start_ns // MS) == [10, 80] and (a.scheduler_delay_ns == 50 * MS).all()


def test_a_span_the_epoch_cannot_fit_is_kept_between_its_own_messages():
    # the first task ran 20-30 ms, reported with the new estimate (300 ms); the second 345-350 ms,
    # reported with the old one (0: the worker read the heartbeat late): no one delay fits both
    a = undo_scheduler_delay(attempts([(10, 320, 330, 40), (340, 345, 350, 355)]), heartbeat(5, 300), ANCHOR)
    assert (a.compute_start_ns >= a.compute_recv_ns).all() and (a.compute_stop_ns <= a.finished_sent_ns).all()
    assert np.diff(a.scheduler_delay_ns.to_numpy()).any(), "two delays"
