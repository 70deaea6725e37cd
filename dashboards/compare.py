"""`daskprobe compare RUN_DIR...`: runs side by side, grouped by one dimension
(workers, scheduler, server, worker-mode), as compare.csv, speedups.csv, differences.csv
(the session split), prefix_differences.csv (each prefix's compute and critical path) and compare.html.

A run's graph is identified by its command; speedups are per graph against
the baseline value of the dimension, summarized by their geometric mean as in
the paper's Table II.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..analyzers.categories import CATEGORIES, UNCATEGORIZED
from .html_report import COLOURS, layout, page_html, section
from ..probes.rundir import RunDir


def run_row(run: RunDir) -> dict:
    meta, summary = run.meta(), json.loads((run / "summary.json").read_text())
    cluster, config = meta.get("cluster", {}), meta.get("config", {})
    tasks = summary.get("tasks") or np.nan
    sched_cpu = summary.get("cpu_by_category_s", {}).get("scheduler", {})
    row = {"run": str(run.path), "graph": " ".join(map(str, meta.get("command", []))),
           "workers": cluster.get("workers"), "threads": cluster.get("threads"),
           "server": cluster.get("server_cmd") or "dask",
           "scheduler": cluster.get("scheduler") or _policy(config), "worker-mode": cluster.get("worker", "normal"),
           "makespan_s": summary.get("makespan_s"), "tasks": summary.get("tasks"), "aot_s": summary.get("aot_s"),
           "scheduler_cpu_per_task_s": summary.get("scheduler_cpu_per_task_s")}
    for cat in (*CATEGORIES, UNCATEGORIZED):
        row[f"critical_path_s.{cat}"] = summary.get("critical_path_s", {}).get(cat)
        row[f"scheduler_cpu_per_task_s.{cat}"] = sched_cpu.get(cat, 0.0) / tasks
    return row


def _policy(config: dict) -> str:
    """Runs recorded before --scheduler existed: ws unless stealing was off."""
    return "ws" if str(config.get("distributed.scheduler.work-stealing", "True")) != "False" else "no-stealing"


def speedups(makespans: pd.DataFrame, by: str, baseline, within: tuple[str, ...] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per graph (and group of `within`) and value of `by`: median makespan with `by` = baseline
    / median makespan (above 1: faster than the baseline); then per value of `by` (and group of
    `within`) the geometric mean of that over graphs. Returns (per graph, geometric means)."""
    keys = ["graph", *within]
    med = makespans.groupby([*keys, by]).makespan_s.median().unstack(by)
    if baseline not in med:
        return (pd.DataFrame(columns=[*keys, by, "speedup"]),
                pd.DataFrame(columns=[*within, by, "geometric_mean_speedup", "graphs"]))
    speed = med.rdiv(med[baseline], axis=0).reset_index()
    per_graph = speed.melt(id_vars=keys, var_name=by, value_name="speedup").dropna()
    geo = per_graph.groupby([*within, by]).speedup.agg(
        geometric_mean_speedup=lambda s: float(np.exp(np.log(s).mean())), graphs="size").reset_index()
    return per_graph, geo


def warnings(df: pd.DataFrame, by: str, baseline) -> list[str]:
    """What the reader of a comparison must know: points resting on one run, graphs without a baseline."""
    out = []
    n = df.groupby(["graph", by]).size()
    if (n < 3).any():
        out.append(f"{int((n < 3).sum())} of {len(n)} points rest on fewer than 3 runs: on a shared machine single "
                   "runs of the same command vary by up to 2x; repeat them (daskprobe bench --repeat 3)")
    lacking = sorted(set(df.graph) - set(df[df[by] == baseline].graph))
    if lacking:
        out.append(f"no run with {by} = {baseline} for {len(lacking)} command(s), so no speedup for them: "
                   + "; ".join(lacking[:3]))
    return out


def differences(long: pd.DataFrame, by: str, baseline, item: str) -> pd.DataFrame:
    """Per graph, value of `by` and `item` (a category, a prefix's cost): the median seconds, its difference
    from the baseline's median, and the spread (max - min) of both groups' runs; `noisy` when the spread is
    larger than the difference, or unknown (a single run), so the difference is not measured."""
    g = long.groupby(["graph", item, by]).s.agg(
        median="median", spread=lambda x: x.max() - x.min() if len(x) > 1 else np.nan)  # one run: unknown
    g = g.reset_index()
    base = g[g[by] == baseline].set_index(["graph", item])
    g = g.join(base[["median", "spread"]].rename(columns=lambda c: f"baseline_{c}"), on=["graph", item])
    g["difference_s"] = g["median"] - g.baseline_median
    spread = g[["spread", "baseline_spread"]]
    g["noisy"] = spread.isna().any(axis=1) | (spread.max(axis=1) > g.difference_s.abs())
    return g[(g[by] != baseline) & g.difference_s.notna()].sort_values("difference_s", key=abs, ascending=False)


def category_seconds(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per run and category, the seconds of its session split: graph, by, category, s."""
    cols = [c for c in df.columns if c.startswith("critical_path_s.")]
    long = df.melt(id_vars=["graph", by], value_vars=cols, var_name="category", value_name="s").dropna()
    return long.assign(category=long.category.str[len("critical_path_s."):])


PREFIX_COSTS = {"compute_s": "compute", "critical_path_s": "on the critical path"}


def prefix_seconds(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per run and prefix, its compute and its critical-path seconds (table prefixes): graph, by, cost, s.
    Runs analysed before that table existed add nothing."""
    parts = [RunDir(r.run).table("prefixes", missing_ok=True).assign(graph=r.graph, **{by: r[by]})
             for _, r in df.iterrows()]
    p = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if p.empty:
        return pd.DataFrame(columns=["graph", by, "cost", "s"])
    long = p.melt(id_vars=["graph", by, "prefix"], value_vars=list(PREFIX_COSTS), var_name="metric", value_name="s")
    return long.assign(cost=long.prefix + ": " + long.metric.map(PREFIX_COSTS)).drop(columns=["prefix", "metric"])


def _stacked(df: pd.DataFrame, x: pd.Series, prefix: str) -> go.Figure:
    """One bar per run, stacked by category, in the report's colours."""
    cats = [c for c in df.columns if c.startswith(prefix) and df[c].fillna(0).any()]
    return go.Figure([go.Bar(name=c[len(prefix):], x=x, y=df[c], marker_color=COLOURS.get(c[len(prefix):]))
                      for c in cats]).update_layout(barmode="stack")


def compare(run_dirs: list[str], by: str, out: Path, baseline=None) -> tuple[pd.DataFrame, list[str]]:
    df = pd.DataFrame([run_row(RunDir(d)) for d in run_dirs])
    df = df.astype({"workers": "Int64", "threads": "Int64", "tasks": "Int64"}).sort_values([by, "graph"])
    baseline = df[by].iloc[0] if baseline is None else type(df[by].iloc[0])(baseline)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "compare.csv", index=False)
    table = speedups(df, by, baseline)[1]
    table.to_csv(out / "speedups.csv", index=False)
    notes = warnings(df, by, baseline)
    diff = differences(category_seconds(df, by), by, baseline, "category")
    diff.to_csv(out / "differences.csv", index=False)
    by_prefix = differences(prefix_seconds(df, by), by, baseline, "cost")
    by_prefix.to_csv(out / "prefix_differences.csv", index=False)
    x = df[by].astype(str)
    aot = go.Figure(go.Box(x=x, y=df.aot_s, boxpoints="all", text=df.graph))
    per_run = x + " · " + df.run.str.rsplit("/", n=1).str[-1]
    cpu, path = (_stacked(df, per_run, prefix) for prefix in ("scheduler_cpu_per_task_s.", "critical_path_s."))
    sp = go.Figure(go.Bar(x=table[by].astype(str), y=table.geometric_mean_speedup))
    rows = "".join(f"<tr><td>{r[by]}</td><td>{r.geometric_mean_speedup:.3f}</td><td>{r.graphs}</td></tr>"
                   for _, r in table.iterrows())
    sections = [
        "".join(f"<p class='warning'><b>Note</b>: {html.escape(n)}</p>" for n in notes),
        _diff_table(diff.head(20), by, baseline, "category", "What grew, what shrank", "differences.csv"),
        _diff_table(by_prefix.head(20), by, baseline, "cost", "Task prefixes: what grew, what shrank",
                    "prefix_differences.csv"),
        section("Average overhead per task", f"AOT = makespan / tasks, seconds per task, against {by}: each run a "
                "point, the box its median and quartiles.", layout(aot, by, "s / task")),
        section("Where the session went, per run", "Seconds of each run's session by category (its critical "
                f"path and the client's time), runs ordered by {by}.", layout(path, by, "seconds")),
        section("Scheduler CPU per task, by category", "Scheduler CPU seconds per task (samples x their thread's "
                f"on-CPU time / tasks), stacked by category, against {by}; one bar per run.", layout(cpu, by, "s / task")),
        section("Makespan speedup", f"Geometric mean over graphs of (median makespan with {by} = {baseline}) / "
                f"(median makespan), per value of {by}; above 1 is faster.", layout(sp, by, "speedup")),
        f"<section><h2>Speedups (as the paper's Table II)</h2><table><tr><th>{by}</th><th>geometric mean "
        f"speedup</th><th>graphs</th></tr>{rows}</table></section>",
    ]
    (out / "compare.html").write_text(page_html("daskprobe compare", f"by {by}, baseline {baseline}", sections))
    return table, notes


def _diff_table(diff: pd.DataFrame, by: str, baseline, item: str, title: str, csv: str) -> str:
    if diff.empty:
        return ""
    rows = "".join(f"<tr><td>{html.escape(str(r.graph))[:60]}</td><td>{r[by]}</td><td>{html.escape(str(r[item]))}</td>"
                   f"<td>{r.baseline_median:.3f}</td><td>{r['median']:.3f}</td><td>{r.difference_s:+.3f}</td>"
                   f"<td>{_spread(r)}{' (noisy)' if r.noisy else ''}</td></tr>"
                   for _, r in diff.iterrows())
    return (f"<section><h2>{html.escape(title)}</h2><p class='caption'>Per command and {item}, the median "
            f"seconds with {by} = {baseline} and with each other value, their difference, and "
            "the larger spread (max - min over runs) of the two: where the spread exceeds the difference, the "
            f"difference is within run-to-run noise (the 20 largest differences; all in {csv}).</p>"
            f"<table><tr><th>command</th><th>{by}</th><th>{item}</th><th>baseline, s</th><th>median, s</th>"
            f"<th>difference, s</th><th>spread, s</th></tr>{rows}</table></section>")


def _spread(r) -> str:
    both = (r.spread, r.baseline_spread)
    return "unknown (one run)" if any(pd.isna(v) for v in both) else f"{max(both):.3f}"
