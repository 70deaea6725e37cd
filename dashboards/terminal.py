"""The terminal summary that `daskprobe report` (and the end of `daskprobe run`)
prints: compact; the definitions are in report.html and `daskprobe explain`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..analyzers.whatif.advice import top

FEW = "*"


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console(stderr=True)
    if "error" in summary:
        console.print(f"[yellow]daskprobe: {summary['error']}[/]")
        _print_caveats(console, summary)
        if "command_s" in summary:
            console.print(f"the command took {summary['command_s']:.2f} s (wall time, its start to its exit)")
        if ts := summary.get("task_stream"):
            console.print(f"Dask's task stream: {ts['tasks']} tasks over {ts['span_s']:.2f} s, {ts['compute_s']:.2f} s "
                          "of compute (" + ", ".join(f"{w} {v:.2f} s" for w, v in ts["compute_s_by_worker"].items())
                          + "); largest prefixes: " + ", ".join(f"{k} {v:.2f} s" for k, v in
                                                                list(ts["compute_s_by_prefix"].items())[:3]))
        return
    s = summary
    jobs = s.get("jobs", [])
    console.print(f"[bold]session {s['session_s']:.2f} s[/]: {len(jobs)} job(s), makespan {s['makespan_s']:.2f} s, "
                  f"{s['tasks']} tasks ({s['dispatches']} dispatches), {_ms(s.get('aot_s'))} per task (AOT)")
    if (loc := s.get("local_scheduler")) and not loc.get("ignored_jobs"):
        console.print(local_line(loc))
    console.print(_split_table("where the session went (critical path), s", s, s["session_s"]))
    if len(jobs) > 1:
        console.print(_jobs_table(jobs))
    console.print(f"{FEW} rests on fewer than 20 samples; 'daskprobe explain CATEGORY' says what each means")
    _print_findings(console, s.get("findings", []), s["session_s"])
    if saves := top(s.get("findings", [])):
        console.print(_savings_table(saves))
    _print_caveats(console, s)


def _print_caveats(console: Console, summary: dict) -> None:
    """What the numbers above cannot be trusted for (analyzers/caveats.py): last, so it is seen."""
    for c in summary.get("caveats", []):
        console.print(f"[bold yellow]caution[/]: {c}", markup=True, highlight=False)


def _print_findings(console: Console, found: list[dict], session: float) -> None:
    if not found:
        return
    console.print("[bold]what to change[/] (largest first; all in report.html):")
    for f in found[:3]:
        console.print(f"- [bold]{f['title']}[/]: {f['seconds']:.2f} s ({100 * f['share']:.0f}% of the session). "
                      f"{f['evidence'][:1].upper()}{f['evidence'][1:]}.\n  [green]try[/]: {f['advice']}")


def _savings_table(saves: list[dict]) -> Table:
    """The findings whose advice the what-if model predicts to save most (analyzers/whatif/advice.py)."""
    t = Table(title="what the advice would save (what-if model, predicted; docs/whatif.md)", title_justify="left",
              box=None, pad_edge=False)
    for col in ("finding", "change replayed", "makespan s", "90% interval s", "saved s"):
        t.add_column(col, justify="left" if col in ("finding", "change replayed") else "right")
    for f in saves:
        p = f["saving"]
        t.add_row(f["id"], p["change"], f"{p['measured_s']:.2f} -> {p['makespan_s']:.2f}",
                  f"{p['interval_s'][0]:.2f}-{p['interval_s'][1]:.2f}", f"{p['saving_s']:.2f}")
    return t


def local_line(loc: dict) -> str:
    """Which local scheduler ran the jobs (no cluster: Dask's threads, processes or sync), and its cost per task."""
    mean = loc.get("per_task_mean_s") or {}
    return (f"local scheduler {', '.join(loc['schedulers']) or '?'} (pool of {loc['pool']}): per task, "
            f"{_ms(mean.get('compute_s'))} of compute and {_ms(loc.get('overhead_per_task_s'))} around it from "
            "its dispatch to its result taken in (wall time: waits for the GIL or a CPU included)")


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.2f} ms"


def _split_table(title: str, s: dict, total: float) -> Table:
    t = Table(title=title, title_justify="left", box=None, pad_edge=False)
    for col, just in (("category", "left"), ("seconds", "right"), ("%", "right"), ("90% interval", "right"),
                      ("samples", "right")):
        t.add_column(col, justify=just)
    ci = s.get("critical_path_interval_s", {})
    for cat, sec in sorted(s["critical_path_s"].items(), key=lambda kv: -kv[1]):
        if sec <= 0:
            continue
        c = ci.get(cat, {})
        n = c.get("samples")
        interval = f"{c['lo']:.3f}-{c['hi']:.3f}" if n else "exact"
        t.add_row(cat, f"{sec:.3f}", f"{100 * sec / total:.1f}" if total else "-", interval,
                  "-" if n is None else f"{n}{FEW if c.get('few_samples') else ''}")
    return t


def _jobs_table(jobs: list[dict]) -> Table:
    t = Table(title="jobs", title_justify="left", box=None, pad_edge=False)
    for col in ("job", "at s", "makespan s", "tasks", "recomputed", "largest categories"):
        t.add_column(col, justify="left" if col == "largest categories" else "right")
    for j in jobs[:20]:
        top = sorted(j["critical_path_s"].items(), key=lambda kv: -kv[1])[:3]
        t.add_row(str(j["job"]) + ("" if j.get("complete", True) else " (no end)"), f"{j['start_s']:.2f}",
                  f"{j['makespan_s']:.3f}", str(j["tasks"]),
                  str(j["recomputed"]["keys"]), ", ".join(f"{c} {100 * v / j['makespan_s']:.0f}%" for c, v in top
                                                           if j["makespan_s"]))
    if len(jobs) > 20:
        t.add_row("...", "", "", "", "", f"{len(jobs) - 20} more in summary.json")
    return t
