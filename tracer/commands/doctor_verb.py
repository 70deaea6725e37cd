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
    from ..capture import dask_versions
    table = Table(title="daskprobe doctor: probes on this machine")
    for col in ("probe", "status", "what it captures"):
        table.add_column(col, overflow="fold")
    for name, problem, what in doctor():
        table.add_row(name, "[green]ok[/]" if problem is None else f"[red]no[/]: {problem}", what)
    Console().print(table)
    versions = dask_versions.installed()
    found = ", ".join(f"{p} {v or 'not installed'}" for p, v in versions.items())
    Console().print(f"{found} (daskprobe supports {dask_versions.OLDEST} to {dask_versions.NEWEST})", highlight=False)
    for why in dask_versions.warnings(versions):
        Console().print(f"[red]warning[/]: {why}", highlight=False)
    return 0
