"""The experiments layer, reached by name: its registry is the entry point
`daskprobe.experiments` (pyproject.toml). Layers below it never import it."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points


@cache
def experiments():
    """experiments/registry.py: variants, the demo workload, extra verbs."""
    (ep,) = entry_points(group="daskprobe.experiments", name="registry")
    return ep.load()
