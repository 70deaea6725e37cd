"""A benchmark's runs, one after another with a progress bar, kept as runs.csv and summarized
into results.csv (the shape of finalize_latency and startup)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import Progress
from rich.table import Table


def run_all(out: Path, plan: list[tuple[str, Callable[[], dict]]],
            summarize: Callable[[pd.DataFrame], pd.DataFrame]) -> pd.DataFrame:
    """Each (label, run) of `plan` in order (the caller interleaves what it compares: a slow spell
    of the machine then hits every side); one row per run in runs.csv, the summary in results.csv."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        bar = progress.add_task("runs", total=len(plan))
        for label, run in plan:
            progress.update(bar, description=label)
            rows.append(run())
            progress.advance(bar)
    runs = pd.DataFrame(rows)
    runs.to_csv(out / "runs.csv", index=False)
    summary = summarize(runs)
    summary.to_csv(out / "results.csv", index=False)
    return summary


def show(df: pd.DataFrame, tables: list[tuple[str, list[str]]]) -> None:
    """`df` as rich tables, each (title, columns) of them one (a terminal is narrow); floats to 2
    decimals, `_s` dropped from the columns' names."""
    for title, cols in tables:
        t = Table(title=title)
        for col in cols:
            t.add_column(col.removesuffix("_s"))
        for r in df[cols].itertuples(index=False):
            t.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r))
        Console().print(t)
