"""report.html: one self-contained page (plotly.js inline, opens offline) with
a figure per analysis, each captioned with what it measures and its unit."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.offline import get_plotlyjs

from ..analyzers import summary_json
from ..analyzers.categories import UNCATEGORIZED
from ..analyzers.transfers import MIN_WIRE_S, rate
from ..analyzers.whatif.advice import top
from ..probes.rundir import RunDir
from .terminal import local_line

# Per figure, so that a 100K-task page draws in seconds: each bar is an SVG element (a browser
# draws about 2,500 a second), a line point costs far less. Larger runs keep their longest
# bars and every n-th point, and the caption says so.
MAX_BARS = 2_000
MAX_POINTS = 5_000
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


def warm_up() -> None:
    """Load what plotly loads on first use of each kind of figure, property and output here
    (0.2-0.4 s): done while the probes get ready, so that report.html is written sooner."""
    one, name = np.zeros(1), pd.Series(["a"])
    fig = go.Figure([go.Bar(name="a", x=one, y=name, base=one, orientation="h", hovertext=name, marker_color="#000"),
                     go.Heatmap(z=np.zeros((1, 1)), x=["a"], y=["a"], text=[["a"]], texttemplate="%{text}",
                                colorscale="Blues", colorbar=dict(title="MB")),
                     go.Scatter(name="a", x=one, y=one, mode="lines", line_shape="hv"),
                     go.Icicle(ids=["a"], labels=["a"], parents=[""], values=[1], branchvalues="total")])
    fig.add_bar(x=[1], y=[1])
    fig.add_scatter(x=[1], y=[1])
    layout(fig.update_layout(barmode="overlay"), "x", "y").to_html(full_html=False, include_plotlyjs=False)


def _page(run: RunDir) -> Page:
    category = run.table("stack_categories").set_index("stack_id").category if run.has_table("stack_categories") \
        else pd.Series(dtype=object)
    return Page(run, summary_json.read(run), category)


def figure_sections(run: RunDir, which: Iterable[int] | None = None) -> list[list]:
    """[position in FIGURES, title, section] of the figures (those at the positions `which` gives)
    that have data: the page's figures can be drawn in parts, by several processes."""
    page = _page(run)
    if "error" in page.summary:
        return []
    which = range(len(FIGURES)) if which is None else which
    return [[i, f[0], section(*f)] for i, f in ((i, FIGURES[i](page)) for i in which) if f[2] is not None]


def write_html(run: RunDir, drawn: list[list] | None = None) -> None:
    """report.html, with the figure sections given (figure_sections, in parts) or drawn here."""
    page = _page(run)
    summary = page.summary
    if "error" in summary:
        unread = "messages" in page.run.meta().get("skipped", {})
        sections = [f"<section><h2>{'No critical path' if unread else 'Nothing to measure'}</h2>"
                    f"<p>{html.escape(summary['error'])}</p></section>", caveats_section(summary)]
        for figure in SAMPLES_ONLY if unread else ():  # what needs no message
            if (drawn_one := figure(page))[2] is not None:
                sections.append(section(*drawn_one))
    else:
        drawn = sorted(figure_sections(run) if drawn is None else drawn)  # no data: left out
        prefixes, profile = prefix_table(page), profile_table(page)
        titles = {title for _, title, _ in drawn} | ({"Task prefixes"} if prefixes else set()) | \
            ({"Your code in the tasks"} if profile else set())
        sections = [headline(summary), caveats_section(summary), findings_section(summary, titles),
                    prefixes, profile] + [s for _, _, s in drawn]
    run.write_file("report.html", page_html("daskprobe report", str(run.path), sections + [metadata(run, summary)]))


def page_html(title: str, subtitle: str, sections: list[str]) -> str:
    """A self-contained page: plotly.js inline (4.8 MB, only where a figure needs it), so it opens offline."""
    body = "".join(sections)
    script = f"<script>{get_plotlyjs()}</script>" if "plotly-graph-div" in body else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}: {html.escape(subtitle)}"
            f"</title>{script}<style>{CSS}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p class='run'>{html.escape(subtitle)}</p>"
            f"{body}{READY_SCRIPT}</body></html>")


CSS = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}.headline{font-size:120%}"
       "section{margin:2em 0}.caption{color:#444}table{border-collapse:collapse}"
       "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%;text-align:left}")


def anchor(title: str) -> str:
    """A section's id, from its title: what a finding links to."""
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def section(title: str, caption: str, figure: go.Figure | None, empty: str = "no data for it in this run") -> str:
    body = (f"<p class='empty'>Not drawn: {html.escape(empty)}.</p>" if figure is None
            else figure.to_html(full_html=False, include_plotlyjs=False))
    return (f"<section id='{anchor(title)}'><h2>{html.escape(title)}</h2><p class='caption'>{html.escape(caption)}"
            f"</p>{body}</section>")


# The figure (or table) that shows each finding's evidence, by its title; the first one drawn is linked.
EVIDENCE = {"recomputed": ["Task prefixes"], "worker-saturation": ["Task stream", "Per-worker tasks in flight (busy vs idle)"],
            "client": ["The critical path on a timeline"], "cpu-starvation": ["Where each job's time went"],
            "gil-contention": ["GIL wait per thread"], "scheduler-decisions": ["Scheduler CPU by category and call path",
                                                                                "Scheduler CPU over time, by category"],
            "task-overhead": ["Per-task overhead (CDF)", "Task prefixes"],
            "graph-materialization": ["The critical path on a timeline"],
            "transfers": ["Task stream", "Bandwidth between workers"],
            "scheduler-bound": ["Per-worker tasks in flight (busy vs idle)"], "network": ["The critical path on a timeline"]}


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
                           text=[f"{v:.3f} s ({100 * v / total:.1f}%)" + ("*" if ci.get(c, {}).get("few_samples") else "")
                                 for c, v in cp.items()], textposition="auto",
                           error_x=dict(type="data", symmetric=False, array=hi, arrayminus=lo)))
    return ("Where the session went",
            f"Seconds of the {total:.3f} s session on the critical path of each job (and the client's time "
            "between jobs), by category, largest on top; they sum to the session. Whiskers: the 90% interval of "
            "shares taken from samples (none where the time is measured exactly); * rests on fewer than 20 "
            "samples.", layout(fig, "seconds", ""))


def headline(summary: dict) -> str:
    jobs = summary.get("jobs", [])
    return (f"<p class='headline'><b>{summary['session_s']:.2f} s</b> session, {len(jobs)} job(s), makespan "
            f"<b>{summary['makespan_s']:.2f} s</b>, {summary['tasks']} tasks ({summary['dispatches']} dispatches), "
            f"<b>{1e3 * (summary.get('aot_s') or 0):.2f} ms</b> of makespan per task (AOT).</p>"
            + (f"<p class='headline'>{html.escape(local_line(loc))}.</p>" if (loc := summary.get("local_scheduler"))
               and not loc.get("ignored_jobs") else ""))


def caveats_section(summary: dict) -> str:
    """What the numbers cannot be trusted for (analyzers/caveats.py), under the headline: a partial run,
    what the captures lost, jobs without a recorded end, workers that ended, a build of a live run."""
    items = "".join(f"<li>{html.escape(c)}</li>" for c in summary.get("caveats", []))
    return (f"<section class='caveats' id='caveats'><h2>Caution</h2><p class='caption'>What these numbers cannot be "
            f"trusted for.</p><ul>{items}</ul></section>") if items else ""


def prefix_table(p: Page) -> str:
    """Per task prefix (table prefixes): how many, how long, how much overhead, how many bytes, how much of the path."""
    g = p.run.table("prefixes", missing_ok=True).head(30)
    if g.empty:
        return ""
    rows = "".join(f"<tr><td>{html.escape(str(r.prefix))}</td><td>{r.tasks:.0f}</td><td>{r.attempts:.0f}</td>"
                   f"<td>{r.compute_s:.2f}</td><td>{1e3 * r.compute_per_task_s:.2f}</td>"
                   f"<td>{1e3 * r.overhead_per_task_s:.2f}</td><td>{1e3 * r.wait_per_task_s:.2f}</td>"
                   f"<td>{r.result_bytes / 1e6:.1f}</td><td>{r.moved_bytes / 1e6:.1f}</td>"
                   f"<td>{100 * r.critical_path_share:.1f}%</td></tr>" for r in g.itertuples())
    head = ("<tr><th>prefix</th><th>tasks</th><th>attempts</th><th>compute, s</th><th>compute per task, ms</th>"
            "<th>overhead per task, ms (median)</th><th>waiting per task, ms (median)</th><th>result bytes, MB</th>"
            "<th>moved to other workers, MB</th><th>share of the session on the critical path</th></tr>")
    return (f"<section id='{anchor('Task prefixes')}'><h2>Task prefixes</h2><p class='caption'>Per key prefix (the 30 with most of the critical "
            "path): tasks (a key per job), attempts (dispatches; more than tasks when stolen or recomputed), compute "
            "seconds summed, mean compute per task, median overhead per task ((task-finished reaching the "
            "scheduler - ready) - compute - waiting: the runtime's own hops), median waiting per task (queued on the "
            "scheduler, or on the worker for a thread: a saturated cluster, not a slow runtime), the results' sizes "
            "and what other "
            "workers needed of them (each result once per other worker that ran a task depending on it), and the "
            "share of the session its segments take on the critical path (table prefixes).</p>"
            f"<table>{head}{rows}</table></section>")


def profile_table(p: Page) -> str:
    """Per task prefix, the user's functions its tasks ran most (table compute_profile): the counterpart
    of a worker profile, with Dask's and the libraries' frames folded into the user's code that called them."""
    prof = p.run.table("compute_profile", missing_ok=True)
    if prof.empty:
        return ""
    order = p.run.table("prefixes", missing_ok=True).prefix.tolist()
    prof = prof.assign(rank=prof.prefix.map({x: i for i, x in enumerate(order)}).fillna(len(order)))
    top = prof.sort_values(["rank", "samples"], ascending=[True, False]).groupby("prefix", sort=False).head(3).head(30)
    rows = "".join(f"<tr><td>{html.escape(str(r.prefix))}</td><td>{html.escape(r.function)}</td>"
                   f"<td>{html.escape(r.filename.rsplit('/', 1)[-1])}:{r.line}</td><td>{r.samples}</td>"
                   f"<td>{100 * r.share:.0f}%</td><td>{r.seconds:.2f}</td></tr>" for r in top.itertuples())
    head = ("<tr><th>prefix</th><th>your function</th><th>file:line</th><th>samples</th>"
            "<th>share of the prefix's samples</th><th>CPU, s</th></tr>")
    return (f"<section id='{anchor('Your code in the tasks')}'><h2>Your code in the tasks</h2><p class='caption'>"
            "Per task prefix (in the order of the table above), the functions of your own code its tasks ran "
            "most: each on-CPU sample inside a task's compute span, on its thread, counts for the innermost frame "
            "of your code on its stack (Dask's, the libraries' and Python's own frames below it fold into it); "
            "the share is of all the prefix's samples, so a prefix whose time went to library code alone shows "
            "small shares (table compute_profile).</p>"
            f"<table>{head}{rows}</table></section>")


def task_stream(p: Page):
    """Dask's task stream: each compute span on the worker thread that ran it (by its name),
    coloured by prefix, and each input transfer on a row of its worker's own."""
    a = p.run.table("attempts")
    t = a.dropna(subset=["compute_start_ns", "compute_stop_ns"])
    if t.empty or "window_ns" not in p.summary:
        return "Task stream", "", None
    names = p.run.table("attempt_threads", missing_ok=True).set_index("attempt").name.reindex(t.index)
    thread_no = t.thread.fillna(-1).groupby(t.worker).rank(method="dense").astype(int)  # Dask's idents are long
    label = [f"{w} / " + (n.removeprefix(f"{w}-") if isinstance(n, str) else f"thread {k}")
             for w, n, k in zip(t.worker, names, thread_no)]
    spans = pd.DataFrame({"row": label, "key": t.key, "prefix": t.prefix, "start_ns": t.compute_start_ns,
                          "stop_ns": t.compute_stop_ns})
    x = a.dropna(subset=["transfer_start_ns", "transfer_stop_ns"])
    moves = pd.DataFrame({"worker": x.worker, "key": x.key, "start_ns": x.transfer_start_ns, "stop_ns": x.transfer_stop_ns})
    return ("Task stream", stream_caption(spans, moves, "the first update-graph"),
            _stream(spans, moves, p.summary["window_ns"][0], "the first update-graph"))


def stream_caption(spans: pd.DataFrame, moves: pd.DataFrame, since: str = "the session began") -> str:
    shown = (f"all {len(spans)} tasks and {len(moves)} transfers are drawn, so gaps are a thread without work"
             if len(spans) <= MAX_BARS and len(moves) <= MAX_BARS // 4 else
             f"the longest {min(len(spans), MAX_BARS)} of {len(spans)} tasks and {min(len(moves), MAX_BARS // 4)} "
             f"of {len(moves)} transfers are drawn (a page stays quick to draw), so a gap may hold shorter tasks")
    median_ms = (spans.stop_ns - spans.start_ns).median() / 1e6 if len(spans) else 0.0
    return ("Each task's compute span on the worker thread that ran it, coloured by key prefix, and in red, on a "
            "row per worker, the spans in which a worker fetched a task's inputs from other workers; in seconds "
            f"since {since}. The median task took {median_ms:.2f} ms (zoom in on short ones); {shown}.")


def dask_task_stream(p: Page):
    """The task stream as Dask's own recorded it (tables/task_stream: an attached tls:// cluster)."""
    ts = p.run.table("task_stream", missing_ok=True)
    if ts.empty:
        return "Task stream (Dask's)", "", None
    thread_no = ts.thread.fillna(-1).groupby(ts.worker).rank(method="dense").astype(int)
    procs = p.run.table("processes")
    ts = ts.assign(worker=ts.worker + " (" + ts.worker.map(dict(zip(procs.name, procs.listen))).fillna("?") + ")")
    compute = ts[ts.action == "compute"]
    spans = compute.assign(row=compute.worker + " / thread " + thread_no[compute.index].astype(str))
    moves = ts[ts.action == "transfer"]
    return ("Task stream (Dask's)", stream_caption(spans, moves, "the first task began") + " From the task "
            "stream the scheduler keeps, on the workers' wall clocks; threads numbered per worker.",
            _stream(spans, moves, int(ts.start_ns.min()), "the first task began"))


# Prefixes are many (dozens in a dataframe ETL): 46 colours, none the transfers' red.
PREFIX_COLOURS = [c for c in qualitative.Dark24 + qualitative.Light24 if c not in ("#FB0D0D", "#FD3216")]


def _stream(spans: pd.DataFrame, moves: pd.DataFrame, start: int, since: str = "the session began") -> go.Figure:
    """Compute spans (row, key, prefix, start_ns, stop_ns) and transfers (worker, key, start_ns, stop_ns)."""
    spans = spans.assign(s=(spans.stop_ns - spans.start_ns) / 1e9).nlargest(MAX_BARS, "s")
    fig = go.Figure(layout=dict(colorway=PREFIX_COLOURS))
    for prefix, g in spans.groupby("prefix"):
        fig.add_bar(name=prefix, y=g.row, x=g.s, base=(g.start_ns - start) / 1e9, orientation="h", hovertext=g.key)
    moves = moves.assign(s=(moves.stop_ns - moves.start_ns) / 1e9).nlargest(MAX_BARS // 4, "s")
    if len(moves):
        fig.add_bar(name="transfer (fetching inputs)", y=moves.worker + " / transfers", x=moves.s,
                    base=(moves.start_ns - start) / 1e9, orientation="h", hovertext=moves.key, marker_color="#d62728")
    fig.update_yaxes(categoryorder="category descending")  # worker-0 on top, its threads in order
    return layout(fig.update_layout(barmode="overlay"), f"seconds since {since}", "")


def bandwidth(p: Page):
    """Data moved between workers (table transfers): get_data replies and P2P shuffle_receive requests."""
    x = p.run.table("transfers", missing_ok=True)
    if x.empty:
        return "Data moved between workers", "", None
    x = x.assign(wire_s=(x.t_last_ns - x.t_first_ns) / 1e9)
    g = x.groupby(["dst", "src"]).agg(mb=("bytes", lambda b: b.sum() / 1e6), n=("bytes", "size"), wire_s=("wire_s", "sum"))
    mb = g.mb.unstack(fill_value=0)

    def cell(a: str, b: str) -> str:
        if (a, b) not in g.index:
            return ""
        r = g.loc[(a, b)]
        speed = rate(r.mb * 1e6, r.wire_s)
        return f"{r.mb:.1f} MB in {int(r.n)} messages, " + (f"{speed:.0f} MB/s on the wire" if speed else
                                                             f"under {MIN_WIRE_S * 1e3:.0f} ms on the wire")
    text = [[cell(a, b) for b in mb.columns] for a in mb.index]
    fig = go.Figure(go.Heatmap(z=mb.to_numpy(), x=list(mb.columns), y=list(mb.index), text=text,
                               texttemplate="%{text}", colorscale="Blues", colorbar=dict(title="MB")))
    kinds = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in x.groupby("kind").bytes.sum().items())
    return ("Data moved between workers",
            f"Megabytes each worker (column) sent another (row): {kinds}. get_data replies carry the inputs one "
            "worker fetched from another; shuffle_receive carries a P2P shuffle's or rechunk's pieces. In each "
            "cell, the messages' count and their bytes over their time on the wire (first to last byte at the "
            f"proxy, in MB/s; not given under {MIN_WIRE_S * 1e3:.0f} ms).",
            layout(fig, "from (the worker that sent)", "to"))


def per_job(p: Page):
    jobs = p.summary.get("jobs", [])
    if len(jobs) < 2:
        return "Where each job's time went", "", None
    jobs = jobs[:50]
    total = {c: sum(j["critical_path_s"].get(c, 0) for j in jobs) for c in COLOURS}
    cats = sorted((c for c in COLOURS if total[c] > 0), key=lambda c: -total[c])  # the largest at the bottom
    x = [f"job {j['job']} ({j['tasks']} tasks)" for j in jobs]
    share = [[j["critical_path_s"].get(c, 0) / (sum(j["critical_path_s"].values()) or 1) for j in jobs] for c in cats]
    fig = go.Figure([go.Bar(name=c, x=x, y=[j["critical_path_s"].get(c, 0) for j in jobs], marker_color=COLOURS[c],
                            text=[f"{v:.0%}" if v >= 0.05 else "" for v in sh], textposition="inside", customdata=sh,
                            hovertemplate="%{x}: " + c + " %{y:.3f} s (%{customdata:.1%})<extra></extra>")
                     for c, sh in zip(cats, share)])
    return ("Where each job's time went", "Each job's makespan split along its critical path by category, in "
            "seconds, with each category's share of that job (shown from 5%); categories stacked from the largest "
            "over all jobs at the bottom (the first 50 jobs). A job is a computation the client submitted (a "
            "compute() or a batch of futures in the cluster together).",
            layout(fig.update_layout(barmode="stack"), "", "seconds"))


def findings_section(summary: dict, drawn: set[str] = frozenset()) -> str:
    found = summary.get("findings") or []
    if not found:
        return ("<section><h2>What to change</h2><p>No cause took 10% of the session or more, and no key was "
                "computed twice.</p></section>")
    items = "".join(
        f"<li><b>{html.escape(f['title'])}</b>: {f['seconds']:.2f} s ({100 * f['share']:.0f}% of the session"
        + (f"; 90% interval {f['interval_s'][0]:.2f}-{f['interval_s'][1]:.2f} s" if f.get("interval_s") else "")
        + f"). {html.escape(f['evidence'][:1].upper() + f['evidence'][1:])}.{_see(f['id'], drawn)}<br><i>Try</i>: "
        f"{html.escape(f['advice'])}{_predicted(f.get('saving') or {})}</li>" for f in found)
    return f"<section><h2>What to change</h2>{savings_table(found)}<ol>{items}</ol></section>"


def savings_table(found: list[dict]) -> str:
    """The findings whose advice the what-if model predicts to save most (analyzers/whatif/advice.py)."""
    saves = top(found)
    if not saves:
        return ""
    rows = "".join(f"<tr><td>{html.escape(f['title'])}</td><td>{html.escape(p['change'])}</td>"
                   f"<td>{p['measured_s']:.2f} s &rarr; {p['makespan_s']:.2f} s</td>"
                   f"<td>{p['interval_s'][0]:.2f}-{p['interval_s'][1]:.2f} s</td><td>{p['saving_s']:.2f} s</td></tr>"
                   for f in saves for p in [f["saving"]])
    return ("<p class='caption'>What the advice would save, as the what-if model predicts it from this run "
            "(<code>daskprobe whatif</code>, docs/whatif.md): the makespan measured and predicted after the "
            "change the advice amounts to.</p><table><tr><th>finding</th><th>the advice, as the model replays "
            "it</th><th>makespan</th><th>90% interval</th><th>saved</th></tr>" + rows + "</table>")


def _predicted(saving: dict) -> str:
    if "saving_s" in saving:
        return (f"<br><i>Predicted</i>: {html.escape(saving['change'])}: {saving['measured_s']:.2f} s &rarr; "
                f"{saving['makespan_s']:.2f} s (90% interval {saving['interval_s'][0]:.2f}-"
                f"{saving['interval_s'][1]:.2f} s)")
    why = saving.get("not_modelled")
    return f"<br><i>Predicted</i>: no number: {html.escape(why)}" if why else ""


def _see(finding: str, drawn: set[str]) -> str:
    title = next((t for t in EVIDENCE.get(finding, []) if t in drawn), None)
    return f" <a href='#{anchor(title)}'>See: {html.escape(title.lower())}.</a>" if title else ""


# the critical path's kinds in the colours of the categories they mostly are
KIND_COLOURS = {"compute": COLOURS["compute"], "network": COLOURS["network"], "client": COLOURS["client"],
                "scheduler": COLOURS["runtime_bookkeeping"], "worker": "#bcbd22", "queueing": COLOURS["queueing"]}


def critical_path(p: Page):
    run, summary = p.run, p.summary
    path = run.table("critical_path")
    path = path.assign(seconds=(path.end_ns - path.start_ns) / 1e9)
    if path.empty:
        return "The critical path on a timeline", "", None
    start = summary["window_ns"][0]
    fig = go.Figure()
    for kind, seg in path.groupby("kind"):
        seg = seg.nlargest(MAX_BARS // max(1, path.kind.nunique()), "seconds")
        fig.add_bar(name=kind, y=[kind] * len(seg), x=seg.seconds, base=(seg.start_ns - start) / 1e9,
                    orientation="h", hovertext=seg.part + " " + seg.key.fillna(""), marker_color=KIND_COLOURS.get(kind))
    return ("The critical path on a timeline",
            "Each segment of the critical path, by kind, at its time in seconds since the makespan began "
            f"(at most the {MAX_BARS} longest segments are drawn, shared out evenly between kinds).",
            layout(fig.update_layout(barmode="overlay"), "seconds since the first update-graph", ""))


def scheduler_cpu(p: Page):
    run, summary = p.run, p.summary
    c = run.table("cpu_samples", missing_ok=True)
    c = c[(c.process == "scheduler") & c.on_cpu]
    if c.empty or "window_ns" not in summary:
        return "Scheduler CPU over time", "", None
    c = c.assign(t=(c.t_ns - summary["window_ns"][0]) // BIN_NS)
    binned = c.groupby(["t", "category"]).weight_s.sum().unstack(fill_value=0) / (BIN_NS / 1e9)
    fig = go.Figure([go.Bar(name=k, x=binned.index * BIN_NS / 1e9, y=binned[k], marker_color=COLOURS.get(k))
                     for k in binned])
    return ("Scheduler CPU over time, by category",
            "CPU of the scheduler's threads in CPU-seconds per second, in 100 ms bins, by the category of each "
            "on-CPU sample's stack; each sample weighs the CPU time it stands for (table cpu_samples, as "
            "cpu_by_category_s).",
            layout(fig.update_layout(barmode="stack"), "seconds since the first update-graph", "CPU s / s"))


def overhead_cdf(p: Page):
    run = p.run
    over = np.sort(run.table("tasks").overhead_s.dropna().to_numpy())
    if not len(over):
        return "Per-task overhead", "", None
    step = max(1, len(over) // MAX_POINTS)
    # overheads span microseconds to seconds: a log axis (with what is below 1 µs at 1 µs)
    fig = go.Figure(go.Scatter(x=np.maximum(over[::step], 1e-6), y=np.arange(1, len(over) + 1)[::step] / len(over),
                               mode="lines"))
    fig.update_xaxes(type="log")
    return ("Per-task overhead (CDF)",
            "Share of tasks whose overhead is at most x seconds (log scale); overhead = (task-finished reaching the "
            "scheduler - the task being ready) - its compute span - its waiting in queues (on the scheduler, or "
            "for a worker thread): messages' hops, fetching inputs, reporting the result (table tasks, "
            "overhead_s).", layout(fig, "seconds", "share of tasks"))


def worker_busy(p: Page):
    run, summary = p.run, p.summary
    ev = run.table("in_flight", missing_ok=True)
    if ev.empty or "window_ns" not in summary:
        return "Per-worker tasks in flight", "", None
    start = summary["window_ns"][0]
    fig = go.Figure()
    for worker, g in ev.groupby("worker"):
        g = g.iloc[:: max(1, len(g) * ev.worker.nunique() // MAX_POINTS)]
        fig.add_scatter(name=worker, x=(g.t_ns - start) / 1e9, y=g.tasks, mode="lines", line_shape="hv")
    return ("Per-worker tasks in flight (busy vs idle)",
            "Tasks each worker holds, from a compute-task reaching it to its task-finished leaving; 0 means idle, "
            f"waiting on the scheduler (at most {MAX_POINTS} changes over all workers: every n-th in a larger run).",
            layout(fig, "seconds since the first update-graph", "tasks"))


def gil_per_thread(p: Page):
    run = p.run
    g, short = run.table("gil_waits"), run.table("short_waits")
    waits = pd.concat([g.assign(ns=g.wait_ns)[["process", "tid", "ns"]],
                       short[short.kind == "gil"].assign(ns=short.total_ns)[["process", "tid", "ns"]]])
    waits = waits.dropna(subset=["process"])
    if waits.empty:
        return "GIL wait per thread", "", None
    per = waits.groupby(["process", "tid"]).ns.sum().sort_values(ascending=False).head(30) / 1e9
    names = run.table("threads").set_index(["process", "tid"]).name.to_dict() if run.has_table("threads") else {}
    labels = [f"{p} / {names.get((p, tid)) or f'thread {tid}'}" for p, tid in per.index]
    return ("GIL wait per thread",
            "Seconds each thread waited for the GIL (take_gil asleep on its condition) over the whole run (eBPF; short "
            "waits included), "
            "the 30 longest.", layout(go.Figure(go.Bar(x=labels, y=per.values)), "process / thread", "seconds"))


def scheduler_call_paths(p: Page):
    run = p.run
    s = run.table("cpu_samples", columns=["role", "source", "stack_id", "on_cpu", "category"])
    s = s[(s.role == "scheduler") & s.on_cpu.fillna(False).astype(bool)]
    if s.empty:
        return "Scheduler CPU by category and call path", "", None
    # Python stacks where the scheduler is Python (eBPF's native frames would hide them), else native ones (RSDS)
    source = "pyspy" if (s.source == "pyspy").any() else "ebpf"
    s = s[s.source == source]
    stacks = run.table("stacks").set_index("stack_id").frame_ids
    function = run.table("frames", columns=["frame_id", "function"]).set_index("frame_id").function
    n = s.groupby([s.category.fillna(UNCATEGORIZED), "stack_id"]).size()
    paths = {sid: [function.get(f, "?") for f in reversed(list(fr))] for sid, fr in stacks.reindex(
        n.index.get_level_values(1).unique()).items()}  # outermost first
    return ("Scheduler CPU by category and call path",
            f"The scheduler's {len(s)} {'Python' if source == 'pyspy' else 'native (eBPF)'} samples taken on a CPU "
            "(per eBPF's thread states where the run has them, else the sampler's), by category (as in "
            "cpu_by_category_s), then by call path from the outermost function in: a box's width is its share of "
            f"the samples; paths under {MIN_PATH_SHARE:.1%} are left out, and a chain that every sample below it "
            "shares is one box (first … last function). Click a box to zoom into it; hover for names too small "
            "to print.", _flame(n, paths).update_layout(height=650, margin=dict(t=10, l=10, r=10)))


MIN_PATH_SHARE = 0.005


def _flame(counts: pd.Series, paths: dict) -> go.Figure:
    """An icicle of (category, stack id) sample counts: root, category, then each stack's functions
    outermost first; nodes under MIN_PATH_SHARE left out, and single-child chains of equal count merged."""
    total = int(counts.sum())
    value: dict[tuple, int] = {}
    for (cat, sid), k in counts.items():
        path = (cat, *paths.get(sid, []))
        for depth in range(1, len(path) + 1):
            value[path[:depth]] = value.get(path[:depth], 0) + int(k)
    keep = {p: v for p, v in value.items() if v >= MIN_PATH_SHARE * total}
    children: dict[tuple, list] = {}
    for p in keep:
        children.setdefault(p[:-1], []).append(p)
    root = f"scheduler CPU ({total} samples)"
    ids, labels, parents, values = [root], [root], [""], [total]

    def add(node: tuple, parent: str) -> None:
        first, last = node, node
        while len(children.get(last, [])) == 1 and keep[children[last][0]] == keep[last]:
            last = children[last][0]  # every sample below goes this way: one box
        label = first[-1] if last == first else f"{first[-1]} … {last[-1]}"
        me = "\x1f".join(last)
        ids.append(me), labels.append(label), parents.append(parent), values.append(keep[last])
        for child in sorted(children.get(last, []), key=lambda c: -keep[c]):
            add(child, me)

    for cat in sorted(children.get((), []), key=lambda c: -keep[c]):
        add(cat, root)
    colour = [COLOURS.get(i.split("\x1f")[0], "#7f7f7f") if i != root else "#ffffff" for i in ids]
    return go.Figure(go.Icicle(ids=ids, labels=labels, parents=parents, values=values, branchvalues="total",
                               maxdepth=7, textinfo="label+percent root", marker=dict(colors=colour),
                               tiling=dict(orientation="v"))).update_layout(uniformtext=dict(minsize=10, mode="hide"))


FIGURES = [breakdown, per_job, critical_path, task_stream, bandwidth, scheduler_cpu, overhead_cdf, worker_busy,
           gil_per_thread, scheduler_call_paths]
SAMPLES_ONLY = [dask_task_stream, gil_per_thread, scheduler_call_paths]  # where the messages could not be read


def metadata(run: RunDir, summary: dict) -> str:
    meta = run.meta()
    rows = {"command": " ".join(map(str, meta.get("command", []))), "versions": meta.get("versions"),
            "cluster": meta.get("cluster"), "config": meta.get("config"), "probes": meta.get("probes"),
            "probes skipped": meta.get("skipped"), "exit code": meta.get("exit_code"),
            "partial": meta.get("partial"), "capture": meta.get("capture"), "lost": meta.get("lost") or "-"}
    rows |= {f"host {h}": _host_clock(info) for h, info in sorted(meta.get("hosts", {}).items())}
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{_readable(v)}</td></tr>" for k, v in rows.items())
    return f"<section><h2>Run</h2><p class='caption'>What ran, with what, and what was not captured.</p><table>{cells}</table></section>"


def _host_clock(h: dict) -> dict:
    """An agent's host: its clock against the recorder's, how sure, from what; how it was read."""
    return {"clock offset": f"{h['offset_ns'] / 1e9:+.9f} s ± {h['uncertainty_ns'] / 1e3:.1f} µs (the recorder's "
                            "CLOCK_MONOTONIC minus this host's, added to its times; estimated from "
                            + h.get("clock_from", "round trips") + ")",
            "members": ", ".join(m["name"] for m in h.get("members", [])),
            "read to the end": h.get("complete"), "skipped": h.get("skipped") or "-"} | (
        {"error": h["error"]} if h.get("error") else {})


def _readable(v) -> str:
    """A run.json value as lines of `key: value` (nested one level), not raw JSON."""
    if isinstance(v, dict):
        return "<br>".join(f"{html.escape(str(k))}: {html.escape(json.dumps(x, default=str) if isinstance(x, (dict, list)) else str(x))}"
                           for k, x in v.items()) or "-"
    if isinstance(v, list):
        return html.escape(", ".join(map(str, v))) or "-"
    return html.escape(str(v))
