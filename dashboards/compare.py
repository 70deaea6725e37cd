"""`daskprobe compare RUN_DIR...`: runs side by side, grouped by one dimension
(workers, scheduler, server, worker-mode), as compare.csv, speedups.csv, differences.csv
(the session split), prefix_differences.csv (each prefix's compute and critical path) and compare.html.

A run's graph is identified by its command; speedups are per graph against
the baseline value of the dimension, summarized by their geometric mean as in
the paper's Table II. An untraced run (--probes none, bench's default) has no
makespan in its summary.json: it is taken from the workload's own clock, as
its bench recorded it (bench_results.py), and the split is left out.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..analyzers import summary_json
from ..analyzers.categories import CATEGORIES, UNCATEGORIZED
from . import bench_results
from .html_report import COLOURS, layout, page_html, section
from ..probes.rundir import RunDir


def run_row(run: RunDir) -> dict:
    meta, summary = run.meta(), summary_json.read(run)
    cluster, config = meta.get("cluster", {}), meta.get("config", {})
    traced = summary.get("makespan_s") is not None  # no messages captured: no makespan, no split
    clock = {} if traced else (workload_clock(run) or _command_clock(summary))
    tasks = summary.get("tasks") or np.nan
    sched_cpu = summary.get("cpu_by_category_s", {}).get("scheduler", {})
    command = meta.get("command", [])
    row = {"run": str(run.path), "graph": " ".join(map(str, command)), "workload": workload_name(command),
           "workers": cluster.get("workers"), "threads": cluster.get("threads"),
           "server": cluster.get("server_cmd") or "dask",
           "scheduler": cluster.get("scheduler") or _policy(config), "worker-mode": cluster.get("worker", "normal"),
           "probes": ",".join(meta.get("probes") or []) or "none",
           "makespan_from": "trace" if traced else (clock.get("from", "workload") if clock else None),
           "makespan_s": summary.get("makespan_s", clock.get("makespan_s")),
           "tasks": summary.get("tasks", clock.get("tasks")), "aot_s": summary.get("aot_s", clock.get("aot_s")),
           "scheduler_cpu_per_task_s": summary.get("scheduler_cpu_per_task_s")}
    for cat in (*CATEGORIES, UNCATEGORIZED):
        row[f"critical_path_s.{cat}"] = summary.get("critical_path_s", {}).get(cat)
        row[f"scheduler_cpu_per_task_s.{cat}"] = sched_cpu.get(cat, np.nan if not traced else 0.0) / tasks
    return row


def workload_clock(run: RunDir) -> dict:
    """An untraced run's makespan_s, tasks and aot_s on the workload's own clock, as its bench recorded
    them (bench_results.run_row); {} if none did, or the run was not ok."""
    row = bench_results.run_row(run.path)
    if not row or row.get("status") != "ok":
        return {}
    return {k: row[k] for k in ("makespan_s", "tasks", "aot_s")}


def _command_clock(summary: dict) -> dict:
    """An untraced run outside bench: the command's wall time (summary's command_s), imports and all."""
    return {"makespan_s": summary["command_s"], "from": "command"} if summary.get("command_s") else {}


def workload_name(command: list) -> str:
    """What a command runs, as a reader tells runs apart: the graph of a bench run (`python -m
    daskprobe.tracer.bench.workloads merge-1K` is merge-1K), else the module or the script's name and
    the arguments, without the interpreter's path; a long one keeps its end, where the name is."""
    args = [str(a) for a in command]
    if args and Path(args[0]).name.startswith("python"):
        args = args[1:]
    if args[:2] == ["-m", "daskprobe.tracer.bench.workloads"]:
        args = args[2:]
    elif args[:1] == ["-m"]:
        args = args[1:]
    elif args and not args[0].startswith("-"):
        args[0] = Path(args[0]).name
    name = " ".join(args) or " ".join(map(str, command))
    return name if len(name) <= 60 else "…" + name[-59:]


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
    per_graph[by] = per_graph[by].astype(makespans[by].dtype)  # melt leaves objects: 1 workers printed as 1.0
    geo = per_graph.groupby([*within, by]).speedup.agg(
        geometric_mean_speedup=_geometric_mean, graphs="size").reset_index()
    return per_graph, geo


def _geometric_mean(s: pd.Series) -> float:
    return float(np.exp(np.log(s).mean()))


def speedup_ranges(makespans: pd.DataFrame, by: str, baseline) -> pd.DataFrame:
    """The spread over repeats of each speedup: per graph and value of `by`, the baseline's median makespan /
    the slowest run's (speedup_lo) and / the fastest run's (speedup_hi); then their geometric means over graphs."""
    base = makespans[makespans[by] == baseline].groupby("graph").makespan_s.median().rename("base_s")
    runs = makespans.join(base, on="graph").dropna(subset=["base_s", "makespan_s"])
    runs = runs.assign(speedup=runs.base_s / runs.makespan_s)
    per_graph = runs.groupby(["graph", by]).speedup.agg(lo="min", hi="max").reset_index()
    return per_graph.groupby(by).agg(speedup_lo=("lo", _geometric_mean), speedup_hi=("hi", _geometric_mean)) \
        .reset_index()


# What else makes runs differ, besides the dimension compared: each one mixes its effect into the comparison.
DIMENSIONS = {"workers": "workers", "threads": "threads per worker", "scheduler": "scheduler", "server": "server",
              "worker-mode": "worker mode", "probes": "probes"}


def warnings(df: pd.DataFrame, by: str, baseline) -> list[str]:
    """What the reader of a comparison must know: nothing to compare, runs differing in more than `by`,
    workloads not run at every value of `by`, points resting on one run, graphs without a baseline, untraced runs."""
    out = _nothing_to_compare(df, by) + _mixed(df, by) + _partial(df, by)
    n = df.groupby(["graph", by]).size()
    if (n < 3).any():
        out.append(f"{int((n < 3).sum())} of {len(n)} points rest on fewer than 3 runs: on a shared machine single "
                   "runs of the same command vary by up to 2x; repeat them (daskprobe bench --repeat 3)")
    lacking = sorted(set(df.workload) - set(df[df[by] == baseline].workload))
    if lacking:
        out.append(f"no run with {by} = {baseline} for {len(lacking)} command(s), so no speedup for them: "
                   + "; ".join(lacking[:3]))
    return out + _untraced(df)


def _nothing_to_compare(df: pd.DataFrame, by: str) -> list[str]:
    if len(df) == 1:
        return ["one run only: nothing to compare it against; give two or more run directories"]
    if df[by].nunique(dropna=False) == 1:
        return [f"every run has {by} = {df[by].iloc[0]}: nothing to compare against; give runs with other values"]
    return []


def _mixed(df: pd.DataFrame, by: str) -> list[str]:
    out = []
    for col, what in DIMENSIONS.items():
        counts = df[col].astype(str).value_counts(dropna=False)
        if col != by and len(counts) > 1:
            values = ", ".join(f"{v} ({n} run{'s' * (n > 1)})" for v, n in counts.sort_index().items())
            out.append(f"the runs differ in {what} as well as in {by}: {values}; their differences mix both")
    return out


def _partial(df: pd.DataFrame, by: str) -> list[str]:
    """Workloads run at only some values of `by`: each is drawn apart, not pooled with the others."""
    every = set(df[by].dropna())
    have = df.groupby("workload")[by].agg(lambda v: set(v.dropna()))
    partial = have[have.map(lambda v: v != every)]
    if partial.empty or len(have) == 1:
        return []
    listed = "; ".join(f"{w} at {by} = {', '.join(map(str, sorted(v)))}" for w, v in partial.items())
    return [f"{len(partial)} of {len(have)} commands have runs at only some values of {by} ({listed}): "
            "each command has its own box of AOT, not pooled with the others, and a geometric mean counts only the "
            "commands run at its value (column graphs)"]


def _untraced(df: pd.DataFrame) -> list[str]:
    """Untraced runs (--probes none) have a makespan (the workload's clock, from bench) but no split."""
    untraced, missing = df.makespan_from != "trace", df.makespan_s.isna()
    out = []
    if untraced.all():
        out.append("the runs are untraced (--probes none): makespan, tasks and AOT are the workload's own clock "
                   "(as bench recorded it), and the session split, scheduler CPU and task prefixes cannot be "
                   "compared; for those, trace them (daskprobe bench --probes all)")
    elif untraced.any():
        out.append(f"{int(untraced.sum())} of {len(df)} runs are untraced (--probes none): the session split, "
                   "scheduler CPU and task prefixes are compared over the traced runs only")
    if (df.makespan_from == "command").any():
        n = int((df.makespan_from == "command").sum())
        out.append(f"{n} untraced run(s) outside bench: their makespan is the command's wall time (summary.json "
                   "command_s: interpreter start and imports included), longer than a traced run's makespan "
                   "(first update-graph to last result) of the same work")
    if missing.any():
        names = df[missing].run.str.rsplit("/", n=1).str[-1]
        out.append(f"no makespan for {int(missing.sum())} run(s): untraced, and not from daskprobe bench, so "
                   "the workload's clock was not recorded: " + "; ".join(names[:3]))
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
    # unknown (NaN) spreads and differences are compared as inf and 0: noisy, and no NaN comparison warned about
    g["noisy"] = spread.isna().any(axis=1) | (spread.max(axis=1).fillna(np.inf) > g.difference_s.abs().fillna(0))
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


def _stacked(df: pd.DataFrame, x: pd.Series, prefix: str) -> go.Figure | None:
    """One bar per run, stacked by category, in the report's colours; None without data (untraced runs)."""
    cats = [c for c in df.columns if c.startswith(prefix) and df[c].fillna(0).any()]
    if not cats:
        return None
    return go.Figure([go.Bar(name=c[len(prefix):], x=x, y=df[c], marker_color=COLOURS.get(c[len(prefix):]))
                      for c in cats]).update_layout(barmode="stack")


def aot_boxes(df: pd.DataFrame, by: str) -> go.Figure | None:
    """AOT per value of `by`, one box per command side by side: different workloads are never pooled."""
    known = df[df.aot_s.notna()]
    if known.empty:
        return None
    runs = known.run.str.rsplit("/", n=1).str[-1]
    fig = go.Figure([go.Box(name=w, x=g[by].astype(str), y=g.aot_s, boxpoints="all", text=runs[g.index])
                     for w, g in known.groupby("workload", sort=False)])
    return fig.update_layout(boxmode="group", showlegend=True, legend_title_text="command")


def speedup_bars(table: pd.DataFrame, by: str) -> go.Figure | None:
    """The geometric mean speedup per value of `by`, its error bar the spread over repeats (min to max); None
    unless some command has runs at two values or more (the baseline's own 1.0 alone says nothing)."""
    if table[by].nunique() < 2:
        return None
    spread = dict(type="data", symmetric=False, array=table.speedup_hi - table.geometric_mean_speedup,
                  arrayminus=table.geometric_mean_speedup - table.speedup_lo)
    return go.Figure(go.Bar(x=table[by].astype(str), y=table.geometric_mean_speedup, error_y=spread))


def _distinct(df: pd.DataFrame) -> pd.DataFrame:
    """Two commands that shorten alike (two scripts named etl.py) are shown by their whole command's end."""
    clash = df.groupby("workload").graph.transform("nunique") > 1
    tail = df.graph.map(lambda c: c if len(c) <= 60 else "…" + c[-59:])
    return df.assign(workload=df.workload.where(~clash, tail))


def compare(run_dirs: list[str], by: str, out: Path, baseline=None) -> tuple[pd.DataFrame, list[str]]:
    df = _distinct(pd.DataFrame([run_row(RunDir(d)) for d in run_dirs]))
    df = df.astype({"workers": "Int64", "threads": "Int64", "tasks": "Int64", "makespan_s": float, "aot_s": float})
    df = df.sort_values([by, "graph"], ignore_index=True)
    baseline = df[by].iloc[0] if baseline is None else type(df[by].iloc[0])(baseline)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "compare.csv", index=False)
    table = speedups(df, by, baseline)[1]
    table = table.merge(speedup_ranges(df, by, baseline), on=by, how="left")
    table.to_csv(out / "speedups.csv", index=False)
    notes = warnings(df, by, baseline)
    diff = differences(category_seconds(df, by), by, baseline, "category")
    diff.to_csv(out / "differences.csv", index=False)
    by_prefix = differences(prefix_seconds(df, by), by, baseline, "cost")
    by_prefix.to_csv(out / "prefix_differences.csv", index=False)
    per_run = df[by].astype(str) + " · " + df.run.str.rsplit("/", n=1).str[-1]
    cpu, path = (_stacked(df, per_run, prefix) for prefix in ("scheduler_cpu_per_task_s.", "critical_path_s."))
    untraced = "traced runs: --probes all, or proxy"
    names = df.drop_duplicates("graph").set_index("graph").workload  # shown; the CSVs keep the whole command
    figures = [  # (title, caption, figure or None, y axis, what would draw it)
        ("Average overhead per task", f"AOT = makespan / tasks, seconds per task, against {by}, one box per command: "
         "each run a point, the box its median and quartiles.", aot_boxes(df, by), "AOT (s / task)",
         "runs with a makespan: traced, or from daskprobe bench"),
        ("Where the session went, per run", "Seconds of each run's session by category (its critical path and the "
         f"client's time), runs ordered by {by}.", path, "seconds", untraced),
        ("Scheduler CPU per task, by category", "Scheduler CPU seconds per task (samples x their thread's on-CPU "
         f"time / tasks), stacked by category, against {by}; one bar per run.", cpu, "s / task", untraced),
        ("Makespan speedup", f"Geometric mean over commands of (median makespan with {by} = {baseline}) / (median "
         f"makespan), per value of {by} (dimensionless; above 1 is faster); error bars: the spread over repeats, "
         "from the baseline's median / the slowest run to / the fastest run (min to max), as a geometric mean "
         "over commands.", speedup_bars(table, by), "speedup", f"a makespan at {by} = {baseline}"),
    ]
    sections = [
        "".join(f"<p class='warning'><b>Note</b>: {html.escape(n)}</p>" for n in notes),
        _diff_table(_shown(diff.head(20), names), by, baseline, "category", "What grew, what shrank",
                    "differences.csv"),
        _diff_table(_shown(by_prefix.head(20), names), by, baseline, "cost", "Task prefixes: what grew, what shrank",
                    "prefix_differences.csv"),
        _makespan_table(df, by),
        # a figure without data is left out; one line at the end says what would draw it
        *[section(t, c, layout(f, by, y)) for t, c, f, y, _ in figures if f is not None],
        _speedup_table(table, by),
        _not_drawn([f"{t} (needs {n})" for t, _, f, _, n in figures if f is None]),
    ]
    (out / "compare.html").write_text(page_html("daskprobe compare", f"by {by}, baseline {baseline}", sections))
    return table, notes


def makespans(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per command and value of `by`: its runs, their median makespan, its spread (min, max) and tasks."""
    known = df[df.makespan_s.notna()]
    return known.groupby(["workload", by], sort=False).agg(
        runs=("makespan_s", "size"), makespan_s=("makespan_s", "median"), lo=("makespan_s", "min"),
        hi=("makespan_s", "max"), tasks=("tasks", "median"), aot_s=("aot_s", "median")).reset_index()


def _num(v, fmt: str) -> str:
    """A number as `fmt`, or - where it is unknown (a command's wall time has no task count)."""
    return "-" if v is None or pd.isna(v) else format(v, fmt)


def _table_section(title: str, caption: str, head: list[str], rows: list[list]) -> str:
    """An HTML section: a title, its caption (HTML) and a table (cells escaped)."""
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return (f"<section><h2>{html.escape(title)}</h2><p class='caption'>{caption}</p><table><tr>"
            + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{cells}</table></section>")


def _makespan_table(df: pd.DataFrame, by: str) -> str:
    m = makespans(df, by)
    if m.empty:
        return ""
    return _table_section(
        "Makespan per command", f"Per command and {html.escape(by)}: the median makespan over its runs and their "
        "spread (fastest to slowest), the median task count and AOT (makespan / tasks).",
        ["command", by, "runs", "median makespan, s", "min to max, s", "tasks", "AOT, ms / task"],
        [[r["workload"], r[by], r["runs"], f"{r['makespan_s']:.3f}", f"{r['lo']:.3f} to {r['hi']:.3f}",
          _num(r["tasks"], ".0f"), _num(r["aot_s"] * 1e3, ".3f")] for r in m.to_dict("records")])


def _speedup_table(table: pd.DataFrame, by: str) -> str:
    if table.empty:
        return ""
    return _table_section(
        "Speedups (as the paper's Table II)", "Dimensionless; the spread is over repeats (the baseline's median / "
        "the slowest run to / the fastest run), as a geometric mean over commands.",
        [by, "geometric mean speedup", "spread (min to max)", "commands"],
        [[r[by], f"{r['geometric_mean_speedup']:.3f}", f"{r['speedup_lo']:.3f} to {r['speedup_hi']:.3f}",
          r["graphs"]] for r in table.to_dict("records")])


def _shown(diff: pd.DataFrame, names: pd.Series) -> pd.DataFrame:
    return diff.assign(graph=diff.graph.map(names))


def _not_drawn(missing: list[str]) -> str:
    if not missing:
        return ""
    return ("<section><p class='caption'>Not drawn, for lack of data: " + html.escape("; ".join(missing))
            + ".</p></section>")


def _diff_table(diff: pd.DataFrame, by: str, baseline, item: str, title: str, csv: str) -> str:
    if diff.empty:
        return ""
    return _table_section(
        title, f"Per command and {html.escape(item)}, the median seconds with {html.escape(by)} = "
        f"{html.escape(str(baseline))} and with each other value, their difference, and the larger spread (max - min "
        "over runs) of the two: where the spread exceeds the difference, the difference is within run-to-run noise "
        f"(the 20 largest differences; all in {csv}).",
        ["command", by, item, "baseline, s", "median, s", "difference, s", "spread, s"],
        [[r["graph"], r[by], r[item], f"{r['baseline_median']:.3f}", f"{r['median']:.3f}", f"{r['difference_s']:+.3f}",
          _spread(r) + (" (noisy)" if r["noisy"] else "")] for r in diff.to_dict("records")])


def _spread(r: dict) -> str:
    both = (r["spread"], r["baseline_spread"])
    return "unknown (one run)" if any(pd.isna(v) for v in both) else f"{max(both):.3f}"
