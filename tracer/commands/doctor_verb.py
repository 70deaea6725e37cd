"""`daskprobe doctor`: which probes can run on this machine, and why not."""

from __future__ import annotations

HELP = "say which probes can run on this machine, and why not"
EXAMPLES = """examples:
  daskprobe doctor                 # which probes can run here, and why not
"""


def add_arguments(p) -> None:
    pass


def main(args, command: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    from ...probes.registry import doctor
    table = Table(title="daskprobe doctor: probes on this machine")
    for col in ("probe", "status", "what it captures"):
        table.add_column(col, overflow="fold")
    for name, problem, what in doctor():
        table.add_row(name, "[green]ok[/]" if problem is None else f"[red]no[/]: {problem}", what)
    Console().print(table)
    return 0
