"""report.html: one self-contained page (plotly.js inline, opens offline) with
a figure per analysis, each captioned with what it measures and its unit."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from ..analyzers.categories import UNCATEGORIZED
from ..analyzers.tasks import task_overheads
from ..probes.rundir import RunDir

MAX_POINTS = 20_000  # per figure: larger runs are binned or sampled, and the caption says so
BIN_NS = 100_000_000

# After every plot has drawn, the page records how many did (and any error):
# the browser test reads these from the DOM.
READY_SCRIPT = """
<script>
window.addEventListener("error", e => { document.body.dataset.errors = (document.body.dataset.errors || "") + e.message + ";"; });
window.addEventListener("load", () => {
  const plots = [...document.querySelectorAll(".js-plotly-plot")];
  Promise.all(plots.map(p => p._fullLayout ? Promise.resolve() : new Promise(r => p.on("plotly_afterplot", r))))
    .then(() => { document.body.dataset.figures = plots.filter(p => p.querySelector("svg.main-svg")).length; });
});
</script>
"""


@dataclass
class Page:
    """What every figure draws from: the run, its summary, and each stack's category
    (by the same rules as summary.json, so page and numbers agree)."""

    run: RunDir
    summary: dict
    category: pd.Series


def write_html(run: RunDir) -> None:
    summary = json.loads((run / "summary.json").read_text())
    category = run.table("stack_categories").set_index("stack_id").category if run.has_table("stack_categories") \
        else pd.Series(dtype=object)
    page = Page(run, summary, category)
    if "error" in summary:
        sections = [f"<section><h2>Nothing to measure</h2><p>{html.escape(summary['error'])}</p></section>"]
    else:
        sections = [findings_section(summary)] + [section(*fig(page)) for fig in FIGURES]
    run.write_file("report.html", page_html("daskprobe report", str(run.path), sections + [metadata(run, summary)]))


def page_html(title: str, subtitle: str, sections: list[str]) -> str:
    """A self-contained page: plotly.js inline, so it opens offline."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}: {html.escape(subtitle)}"
            f"</title><script>{get_plotlyjs()}</script><style>{CSS}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p class='run'>{html.escape(subtitle)}</p>"
            f"{''.join(sections)}{READY_SCRIPT}</body></html>")


CSS = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}"
       "section{margin:2em 0}.caption{color:#444}table{border-collapse:collapse}"
       "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%;text-align:left}")


def section(title: str, caption: str, figure: go.Figure | None, empty: str = "no data for it in this run") -> str:
    body = (f"<p class='empty'>Not drawn: {html.escape(empty)}.</p>" if figure is None
            else figure.to_html(full_html=False, include_plotlyjs=False))
    return f"<section><h2>{html.escape(title)}</h2><p class='caption'>{html.escape(caption)}</p>{body}</section>"


def layout(fig: go.Figure, x: str, y: str) -> go.Figure:
    return fig.update_layout(xaxis_title=x, yaxis_title=y, height=420, margin=dict(l=60, r=20, t=20, b=50))


COLOURS = {"scheduler_decisions": "#d62728", "runtime_bookkeeping": "#ff7f0e", "gil_contention": "#9467bd",
           "cpu_starvation": "#8c564b", "network": "#1f77b4", "compute": "#2ca02c", "queueing": "#e377c2",
           "idle": "#c7c7c7", "client": "#17becf", UNCATEGORIZED: "#7f7f7f"}


def breakdown(p: Page):
    summary = p.summary
    cp = {c: v for c, v in sorted((summary.get("critical_path_s") or {}).items(), key=lambda kv: kv[1]) if v > 0}
    if not cp:
        return "Where the session went", "", None
    total, ci = summary["session_s"], summary.get("critical_path_interval_s", {})
    lo = [v - ci.get(c, {}).get("lo", v) if ci.get(c, {}).get("samples") else 0 for c, v in cp.items()]
    hi = [ci.get(c, {}).get("hi", v) - v if ci.get(c, {}).get("samples") else 0 for c, v in cp.items()]
    fig = go.Figure(go.Bar(x=list(cp.values()), y=list(cp), orientation="h",
                           marker_color=[COLOURS.get(c, "#7f7f7f") for c in cp],
                           text=[f"{v:.3f} s ({100 * v / total:.1f}%)" for v in cp.values()], textposition="auto",
                           error_x=dict(type="data", symmetric=False, array=hi, arrayminus=lo)))
    return ("Where the session went",
            f"Seconds of the {total:.3f} s session on the critical path of each job (and the client's time "
            "between jobs), by category, largest on top; they sum to the session. Whiskers: the 90% interval of "
            "shares taken from samples (none where the time is measured exactly).", layout(fig, "seconds", ""))


def findings_section(summary: dict) -> str:
    found = summary.get("findings") or []
    if not found:
        return ("<section><h2>What to change</h2><p>No cause took 10% of the session or more, and no key was "
                "computed twice.</p></section>")
    items = "".join(
        f"<li><b>{html.escape(f['title'])}</b>: {f['seconds']:.2f} s ({100 * f['share']:.0f}% of the session"
        + (f"; 90% interval {f['interval_s'][0]:.2f}-{f['interval_s'][1]:.2f} s" if f.get("interval_s") else "")
        + f"). {html.escape(f['evidence'][:1].upper() + f['evidence'][1:])}.<br><i>Try</i>: {html.escape(f['advice'])}</li>" for f in found)
    return f"<section><h2>What to change</h2><ol>{items}</ol></section>"


def critical_path(p: Page):
    run, summary = p.run, p.summary
    path = run.table("critical_path")
    path = path.assign(seconds=(path.end_ns - path.start_ns) / 1e9)
    if path.empty:
        return "The critical path on a timeline", "", None
    start = summary["window_ns"][0]
    fig = go.Figure()
    for kind, seg in path.groupby("kind"):
        seg = seg.nlargest(MAX_POINTS, "seconds")
        fig.add_bar(name=kind, y=[kind] * len(seg), x=seg.seconds, base=(seg.start_ns - start) / 1e9,
                    orientation="h", hovertext=seg.part + " " + seg.key.fillna(""))
    return ("The critical path on a timeline",
            "Each segment of the critical path, by kind, at its time in seconds since the makespan began "
            f"(at most the {MAX_POINTS} longest segments per kind are drawn).",
            layout(fig.update_layout(barmode="overlay"), "seconds since the first update-graph", ""))


def scheduler_cpu(p: Page):
    run, summary = p.run, p.summary
    s, procs = run.table("samples"), run.table("processes")
    pid = procs[procs.role == "scheduler"].pid
    s = s[s.pid.isin(pid) & (s.source == "pyspy") & s.active.astype(bool)]
    if s.empty or "window_ns" not in summary:
        return "Scheduler CPU over time", "", None
    s = s.assign(category=s.stack_id.map(p.category).fillna(UNCATEGORIZED), t=(s.t_ns - summary["window_ns"][0]) // BIN_NS)
    per = 1 / run.meta().get("sample_rate", 100.0)
    binned = s.groupby(["t", "category"]).size().unstack(fill_value=0) * per / (BIN_NS / 1e9)
    fig = go.Figure([go.Bar(name=c, x=binned.index * BIN_NS / 1e9, y=binned[c]) for c in binned])
    return ("Scheduler CPU over time, by category",
            "CPU of the scheduler's threads (py-spy samples on CPU x sampling period), in CPU-seconds per "
            "second, in 100 ms bins, by the category of each sample's stack.",
            layout(fig.update_layout(barmode="stack"), "seconds since the first update-graph", "CPU s / s"))


def message_latency(p: Page):
    run = p.run
    m = run.table("messages").drop_duplicates("msg_id")
    m = m[~m.op.isin(["handshake"])]
    if m.empty:
        return "Message time on the wire, per op", "", None
    top = m.op.value_counts().index[:12]
    m = m[m.op.isin(top)]
    m = m.sample(min(len(m), MAX_POINTS), random_state=0)
    fig = go.Figure([go.Box(name=op, y=(g.t_last_ns - g.t_first_ns) / 1e3) for op, g in m.groupby("op")])
    return ("Message time on the wire, per op",
            "Per message (a batch counts once, named by its first op), microseconds from its first byte "
            "read by the proxy to its last byte handed on; the 12 commonest ops"
            f" (at most {MAX_POINTS} messages, sampled). 0 µs: the whole message came in one read.",
            layout(fig, "op", "µs"))


def overhead_cdf(p: Page):
    run = p.run
    over = np.sort(task_overheads(run.table("tasks")))
    if not len(over):
        return "Per-task overhead", "", None
    step = max(1, len(over) // MAX_POINTS)
    fig = go.Figure(go.Scatter(x=over[::step], y=np.arange(1, len(over) + 1)[::step] / len(over), mode="lines"))
    return ("Per-task overhead (CDF)",
            "Share of tasks whose overhead is at most x seconds; overhead = (task-finished reaching the "
            "scheduler - the task being ready) - its compute span.", layout(fig, "seconds", "share of tasks"))


def worker_busy(p: Page):
    run, summary = p.run, p.summary
    t = run.table("attempts").dropna(subset=["compute_recv_ns", "finished_sent_ns"])
    if t.empty or "window_ns" not in summary:
        return "Per-worker tasks in flight", "", None
    start = summary["window_ns"][0]
    fig = go.Figure()
    for worker, g in t.groupby("worker"):
        ev = pd.concat([pd.DataFrame({"t": g.compute_recv_ns, "d": 1}), pd.DataFrame({"t": g.finished_sent_ns, "d": -1})])
        ev = ev.sort_values("t")
        ev["n"] = ev.d.cumsum()
        ev = ev.iloc[:: max(1, len(ev) // MAX_POINTS)]
        fig.add_scatter(name=worker, x=(ev.t - start) / 1e9, y=ev.n, mode="lines", line_shape="hv")
    return ("Per-worker tasks in flight (busy vs idle)",
            "Tasks each worker holds, from a compute-task reaching it to its task-finished leaving; 0 means idle, "
            "waiting on the scheduler.", layout(fig, "seconds since the first update-graph", "tasks"))


def gil_per_thread(p: Page):
    run = p.run
    g, short = run.table("gil_waits"), run.table("short_waits")
    waits = pd.concat([g.assign(ns=g.wait_ns)[["process", "tid", "ns"]],
                       short[short.kind == "gil"].assign(ns=short.total_ns)[["process", "tid", "ns"]]])
    waits = waits.dropna(subset=["process"])
    if waits.empty:
        return "GIL wait per thread", "", None
    per = waits.groupby(["process", "tid"]).ns.sum().sort_values(ascending=False).head(30) / 1e9
    labels = [f"{p} / {tid}" for p, tid in per.index]
    return ("GIL wait per thread",
            "Seconds each thread waited in take_gil over the whole run (eBPF; short waits included), "
            "the 30 longest.", layout(go.Figure(go.Bar(x=labels, y=per.values)), "process / thread id", "seconds"))


def top_functions(p: Page):
    run = p.run
    s, procs = run.table("samples"), run.table("processes")
    s = s[s.pid.isin(procs[procs.role == "scheduler"].pid) & s.active.astype(bool)]
    if s.empty:
        return "Top functions in each category", "", None
    stacks = run.table("stacks").set_index("stack_id").frame_ids
    frames = run.table("frames").set_index("frame_id")
    cat = p.category
    leaf = s.stack_id.map(lambda i: frames.function.get(stacks[i][0], "?") if len(stacks[i]) else "?")
    counts = pd.DataFrame({"category": s.stack_id.map(cat).fillna(UNCATEGORIZED), "function": leaf})
    top = counts.value_counts().groupby(level=0, group_keys=False).head(10).reset_index(name="n")
    ids = list(top.category.unique()) + [f"{c}/{f}" for c, f in zip(top.category, top.function)]
    parents = [""] * top.category.nunique() + list(top.category)
    values = list(top.groupby("category").n.sum()[top.category.unique()]) + list(top.n)
    labels = list(top.category.unique()) + list(top.function)
    fig = go.Figure(go.Icicle(ids=ids, labels=labels, parents=parents, values=values, branchvalues="total"))
    return ("Top functions in each category (scheduler)",
            "Scheduler CPU samples by category, then by the function on top of the stack (the 10 commonest "
            "per category); sizes are sample counts.", fig.update_layout(height=500, margin=dict(t=10)))


FIGURES = [breakdown, critical_path, scheduler_cpu, message_latency, overhead_cdf, worker_busy,
           gil_per_thread, top_functions]


def metadata(run: RunDir, summary: dict) -> str:
    meta = run.meta()
    rows = {"command": " ".join(map(str, meta.get("command", []))), "versions": meta.get("versions"),
            "cluster": meta.get("cluster"), "config": meta.get("config"), "probes": meta.get("probes"),
            "probes skipped": meta.get("skipped"), "exit code": meta.get("exit_code"),
            "partial": meta.get("partial"), "capture": meta.get("capture")}
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v, default=str))}</td></tr>"
                    for k, v in rows.items())
    return f"<section><h2>Run</h2><p class='caption'>What ran, with what, and what was not captured.</p><table>{cells}</table></section>"
