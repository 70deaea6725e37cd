"""bench.html and speedups.csv: the paper's comparisons from a bench's results table.

Every figure uses the median over repeats of each point's makespan (the
client's wall time from compute() to result, seconds) and only runs whose
status is ok. AOT (average overhead per task) = makespan / tasks.
"""

from __future__ import annotations

import html

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from .compare import speedups
from .html_report import layout, page_html, section

POINT = ["graph", "workers", "scheduler", "worker", "server"]


def medians(results: pd.DataFrame) -> pd.DataFrame:
    ok = results[results.status == "ok"].astype({"makespan_s": float, "aot_s": float, "tasks": float})
    return ok.groupby(POINT, as_index=False).agg(makespan_s=("makespan_s", "median"), makespan_lo=("makespan_s", "min"),
                                                 makespan_hi=("makespan_s", "max"),
                                                 aot_s=("aot_s", "median"), aot_lo=("aot_s", "min"),
                                                 aot_hi=("aot_s", "max"), tasks=("tasks", "median"),
                                                 runs=("makespan_s", "size"))


def random_vs_ws(med: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Speedup of random over ws per graph, workers, worker mode and server (above 1: random
    is faster), and its geometric mean over graphs: the paper's Table II."""
    per_graph, geo = speedups(med, "scheduler", "ws", within=("workers", "worker", "server"))
    return tuple(d[d.scheduler == "random"].drop(columns="scheduler") for d in (per_graph, geo))


def _lines(df: pd.DataFrame, x: str, y: str, by: list[str]) -> go.Figure | None:
    """One line per group, carrying the spread over repeats (columns y_lo to y_hi: min to max) as error bars."""
    if df.empty:
        return None
    fig = go.Figure()
    for key, g in df.sort_values(x).groupby(by):
        label = " ".join(map(str, key if isinstance(key, tuple) else (key,)))
        lo, hi = y.removesuffix("_s") + "_lo", y.removesuffix("_s") + "_hi"
        spread = dict(type="data", symmetric=False, array=g[hi] - g[y], arrayminus=g[y] - g[lo])
        fig.add_trace(go.Scatter(x=g[x], y=g[y], mode="lines+markers", name=label, error_y=spread))
    if x == "workers":  # whole workers only, at the counts that ran
        fig.update_xaxes(tickmode="array", tickvals=sorted(df.workers.unique()))
    return fig


def speedup_figure(speed: pd.DataFrame) -> go.Figure | None:
    if speed.empty:
        return None
    fig = go.Figure([go.Bar(name=f"{w} workers, {m} worker", x=g.graph, y=g.speedup)
                     for (w, m), g in speed.groupby(["workers", "worker"])])
    return fig.add_hline(y=1, line_dash="dot")


def aot_vs_tasks(med: pd.DataFrame) -> go.Figure | None:
    zero = med[med.worker == "zero"].assign(family=lambda d: d.graph.str.split("-").str[0])
    fig = _lines(zero, "tasks", "aot_s", ["family", "scheduler", "workers"])
    return fig and fig.update_xaxes(type="log")


def aot_vs_workers(med: pd.DataFrame) -> go.Figure | None:
    return _lines(med[med.worker == "zero"], "workers", "aot_s", ["graph", "scheduler"])


def strong_scaling(med: pd.DataFrame) -> go.Figure | None:
    normal = med[med.worker == "normal"].copy()
    if normal.workers.nunique() < 2:
        return None
    base = normal.loc[normal.groupby(["graph", "scheduler", "server"]).workers.idxmin()]
    base = base.set_index(["graph", "scheduler", "server"]).makespan_s.rename("base_s")
    normal = normal.join(base, on=["graph", "scheduler", "server"])
    # the spread of a speedup: the baseline's median over the slowest repeat, and over the fastest
    normal = normal.assign(speedup=normal.base_s / normal.makespan_s, speedup_lo=normal.base_s / normal.makespan_hi,
                           speedup_hi=normal.base_s / normal.makespan_lo)
    fig = _lines(normal, "workers", "speedup", ["graph", "scheduler"])
    w = sorted(normal.workers.unique())
    return fig.add_trace(go.Scatter(x=w, y=[v / w[0] for v in w], mode="lines", name="ideal (linear)",
                                    line=dict(dash="dot", color="grey")))


def write_bench_report(results: pd.DataFrame, out: Path) -> pd.DataFrame:
    med = medians(results)
    speed, table = random_vs_ws(med)
    table.to_csv(out / "speedups.csv", index=False)
    rows = "".join(f"<tr><td>{r.workers}</td><td>{r.worker}</td><td>{r.server}</td>"
                   f"<td>{r.geometric_mean_speedup:.3f}</td><td>{r.graphs}</td></tr>" for r in table.itertuples())
    counts = results.status.value_counts().to_dict()
    figures = [  # (title, caption, figure or None, the sweep that would draw it)
        ("Random vs work-stealing", "Speedup of the random scheduler over ws per graph: median makespan "
         "under ws / median makespan under random (dimensionless; above 1, random is faster).",
         (f := speedup_figure(speed)) and layout(f, "graph", "speedup of random over ws"),
         "runs under both schedulers: --scheduler ws,random"),
        ("AOT against task count (zero worker)", "Average overhead per task, AOT = median makespan / "
         "tasks, in seconds per task, against the graph's task count (log scale), zero worker only; bars: "
         "the fastest and slowest repeat.",
         (f := aot_vs_tasks(med)) and layout(f, "tasks", "AOT (s / task)"),
         "zero-worker runs of graphs of several sizes: --worker zero --graphs merge-1K,merge-5K"),
        ("AOT against worker count (zero worker)", "AOT = median makespan / tasks, seconds per task, "
         "against the number of workers, per graph and scheduler, zero worker only; bars: the fastest and "
         "slowest repeat.",
         (f := aot_vs_workers(med)) and layout(f, "workers", "AOT (s / task)"),
         "zero-worker runs: --worker zero"),
        ("Strong scaling", "Speedup against the fewest workers run: median makespan there / median "
         "makespan, per graph and scheduler, normal worker only (dimensionless); bars: the spread over repeats, "
         "min to max (that median / the slowest repeat, to / the fastest); dotted: linear speedup.",
         (f := strong_scaling(med)) and layout(f, "workers", "speedup"),
         "normal-worker runs at two or more worker counts: --workers 1,2,4"),
    ]
    table_html = (f"<section><h2>Geometric mean speedup of random over ws (as the paper's Table II)</h2><table><tr>"
                  f"<th>workers</th><th>worker</th><th>server</th><th>geometric mean speedup</th><th>graphs</th></tr>"
                  f"{rows}</table></section>")
    # a figure without data is left out; one line at the end says which sweep would draw it
    sections = [section(t, c, f) for t, c, f, _ in figures[:1] if f is not None]
    sections += [table_html] if len(table) else []  # no random runs: no table, the line at the end says why
    sections += [section(t, c, f) for t, c, f, _ in figures[1:] if f is not None]
    missing = [f"{t} (needs {n})" for t, _, f, n in figures if f is None]
    if missing:
        sections.append("<section><p class='caption'>Not drawn, for lack of runs: "
                        + html.escape("; ".join(missing)) + ".</p></section>")
    subtitle = f"{len(results)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items())
    (out / "bench.html").write_text(page_html("daskprobe bench", subtitle, sections))
    return table
