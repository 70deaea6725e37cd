"""The terminal summary `daskprobe report` (and the end of `daskprobe run`) prints."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..analyzers.summary import DEFINITIONS

ROWS = [("makespan_s", "s"), ("tasks", "tasks"), ("aot_s", "s/task"), ("compute_s", "s"),
        ("messages", "messages"), ("ops", "ops"), ("messages_per_task", "messages/task"),
        ("bytes_per_task", "B/task")]


def print_summary(summary: dict, console: Console | None = None) -> None:
    console = console or Console(stderr=True)
    if "error" in summary:
        console.print(f"[yellow]daskprobe report: {summary['error']}[/]")
        return
    table = Table(title=f"daskprobe: {summary['run']}", title_justify="left")
    for col in ("quantity", "value", "unit", "definition"):
        table.add_column(col, overflow="fold")
    for name, unit in ROWS:
        value = summary.get(name)
        text = "-" if value is None else (f"{value:.6g}" if isinstance(value, float) else str(value))
        table.add_row(name, text, unit, DEFINITIONS[name])
    console.print(table)
    path = summary.get("critical_path_s")
    if path:
        cp = Table(title="where the makespan went (critical path)", title_justify="left")
        for col in ("category", "seconds", "% of makespan"):
            cp.add_column(col, justify="right" if col != "category" else "left")
        for cat, sec in sorted(path.items(), key=lambda kv: -kv[1]):
            cp.add_row(cat, f"{sec:.4f}", f"{100 * sec / summary['makespan_s']:.1f}")
        console.print(cp)
        console.print("definitions: summary.json ('definitions') and the README")
