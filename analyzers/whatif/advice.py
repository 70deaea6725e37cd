"""What a finding's advice would save: the change it names, replayed (findings.py says the advice; this
module says which change of the model it is)."""

from __future__ import annotations

from .costs import layout
from .predict import Changes, sweep

# finding id -> the change its advice names, from the run's workers and threads
ADVICE = {
    "task-gil": lambda w, th: Changes(workers=w * th, threads=1),  # processes with one thread each
    "gil-contention": lambda w, th: Changes(gil=False),
    "worker-saturation": lambda w, th: Changes(workers=2 * w),
    "scheduler-decisions": lambda w, th: Changes(decisions=0.0),
    "scheduler-bound": lambda w, th: Changes(bookkeeping=0.5, decisions=0.5),
    "network": lambda w, th: Changes(network=0.0),
    "transfers": lambda w, th: Changes(network=0.0),
}


def savings(t: dict, meta: dict, findings: list[dict], samples: int = 5) -> list[dict]:
    """Per finding whose advice the model can replay: its id, the change, and the prediction."""
    workers, threads, _, _ = layout(t, meta)
    asked = [(f["id"], ADVICE[f["id"]](len(workers), threads)) for f in findings if f.get("id") in ADVICE]
    if not asked:
        return []
    out = sweep(t, meta, [c for _, c in asked], samples)
    return [{"id": i, "change": c.text(), "measured_s": p["measured_s"], "makespan_s": p["makespan_s"],
             "interval_s": p["interval_s"], "saving_s": p["measured_s"] - p["makespan_s"]}
            for (i, c), p in zip(asked, out)]
