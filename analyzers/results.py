"""The shape of what the analysis returns, shared by the cluster's (summary.py) and the local
schedulers' (local_summary.py): the result tables and summary.json, its split and its jobs."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .attribution import totals
from .categories import CATEGORIES, UNCATEGORIZED
from .summary_json import FEW_SAMPLES


@dataclass
class Analysis:
    tables: dict  # name -> DataFrame, written to tables/
    summary: dict


def split(attr: pd.DataFrame) -> dict:
    """Seconds per category (every category, 0 where none), their intervals, and the parts."""
    tot = totals(attr).set_index("category").reindex([*CATEGORIES, UNCATEGORIZED])
    tot = tot.fillna({"seconds": 0.0, "lo": 0.0, "hi": 0.0}).reset_index()
    parts = attr.groupby(["kind", "part", "category"]).seconds.sum()
    return {"critical_path_s": {r.category: float(r.seconds) for r in tot.itertuples()},
            "critical_path_interval_s": {r.category: _interval(r) for r in tot.itertuples()},
            "critical_path_parts_s": {f"{k}: {p} [{c}]": float(v) for (k, p, c), v in parts.items()}}


def _interval(r) -> dict:
    samples = None if pd.isna(r.samples) else int(r.samples)
    return {"samples": samples, "lo": float(r.lo), "hi": float(r.hi),
            "few_samples": samples is not None and samples < FEW_SAMPLES}


def job_entries(jobs, tasks, attempts, attr, window, again) -> list[dict]:
    out = []
    for j in jobs.itertuples():
        mine = attr[attr.job == j.job]
        parts = split(mine)
        out.append({"job": int(j.job), "start_s": (j.start_ns - window[0]) / 1e9,
                    "makespan_s": (j.end_ns - j.start_ns) / 1e9, "graphs": int(j.graphs),
                    "graph_bytes": int(j.graph_bytes),
                    "requested": int(j.requested), "tasks": int((tasks.job == j.job).sum()),
                    "dispatches": int((attempts.job == j.job).sum()),
                    # a key never told is null; read back from its table, a null string is NaN
                    "end_key": None if pd.isna(j.end_key) else j.end_key,
                    "complete": bool(j.complete), "untold": int(j.untold),
                    "recomputed": recomputed_keys(again[again.job == j.job]),
                    "critical_path_s": parts["critical_path_s"],
                    "critical_path_interval_s": parts["critical_path_interval_s"],
                    "critical_path_parts_s": parts["critical_path_parts_s"]})
    return out


def recomputed_keys(again: pd.DataFrame) -> dict:
    if again.empty:  # most runs: the grouping below costs more than the rest of this summary key
        return {"keys": 0, "times": 0, "compute_s": 0.0, "by_prefix": {}}
    by = again.groupby("prefix").agg(n_keys=("key", "nunique"), times=("key", "size"), compute_s=("compute_s", "sum"))
    return {"keys": int(again.key.nunique()), "times": len(again), "compute_s": float(again.compute_s.sum()),
            "by_prefix": {p: {"keys": int(r.n_keys), "times": int(r.times), "compute_s": float(r.compute_s)}
                          for p, r in by.sort_values(["times", "compute_s"], ascending=False).iterrows()}}
