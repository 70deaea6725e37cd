"""Each top-level folder is one layer and imports only from the layers below it; inside
tracer/, each stage's package imports only from the stages before it. A layer reaching
one above it by name (an entry point it loads) counts as importing it."""

import ast
import re
import tomllib
from pathlib import Path

from sources import tree

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["probes", "analyzers", "dashboards", "tracer", "experiments"]  # bottom to top
STAGES = ["variants", "capture", "decode", "pipeline", "bench", "commands"]  # tracer's packages, in order


def imported_modules(path: Path):
    """(line, dotted path below daskprobe) for every import of a daskprobe module in `path`."""
    rel = path.relative_to(ROOT)
    package = list(rel.parts[:-1]) if rel.name != "__init__.py" else list(rel.parts[:-1])
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb `level` packages from this module's own
                base = package[:max(0, len(package) - node.level + 1)]
                target = [p for p in base + (node.module or "").split(".") if p]
                yield node.lineno, target
            elif (node.module or "").startswith("daskprobe."):
                yield node.lineno, node.module.split(".")[1:]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("daskprobe."):
                    yield node.lineno, a.name.split(".")[1:]


def entry_point_groups(path: Path):
    """(line, group) for every entry_points(group=...) a module loads."""
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "entry_points":
            for kw in node.keywords:
                if kw.arg == "group" and isinstance(kw.value, ast.Constant):
                    yield node.lineno, kw.value.value


def entry_point_targets() -> dict[str, list[list[str]]]:
    """Each entry-point group in pyproject.toml: the module paths below daskprobe it names."""
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("entry-points", {})
    return {g: [re.split(r"[:\s]", v)[0].split(".")[1:] for v in eps.values()] for g, eps in groups.items()}


def upward(path: Path, order: list[str], depth: int, edges) -> list[str]:
    """The edges from `path` (its own part at `depth` of its path) to a part later in `order`."""
    own = path.relative_to(ROOT).parts[depth]
    return [f"{path.relative_to(ROOT)}:{line} reaches {'.'.join(target)}" for line, target in edges
            if len(target) > depth and target[depth] in order and own in order
            and order.index(target[depth]) > order.index(own)
            and (depth == 0 or target[0] == "tracer")]


def edges_of(path: Path, targets: dict):
    yield from imported_modules(path)
    for line, group in entry_point_groups(path):
        for target in targets.get(group, []):
            yield line, target


def test_imports_only_go_down():
    targets, found = entry_point_targets(), []
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            found += upward(path, LAYERS, 0, list(edges_of(path, targets)))
    assert not found, "\n".join(found)


def test_tracer_stages_only_go_down():
    targets, found = entry_point_targets(), []
    for stage in STAGES:
        for path in (ROOT / "tracer" / stage).rglob("*.py"):
            found += upward(path, STAGES, 1, list(edges_of(path, targets)))
    assert not found, "\n".join(found)


def test_the_check_sees_an_upward_import_and_an_entry_point():
    bad = ROOT / "probes" / "_layer_probe_tmp.py"
    bad.write_text("from ..tracer import session\nfrom importlib.metadata import entry_points\n"
                   "entry_points(group='g', name='x')\n")
    try:
        found = upward(bad, LAYERS, 0, list(edges_of(bad, {"g": [["experiments", "registry"]]})))
    finally:
        bad.unlink()
    assert [f.split(":")[1].split()[0] for f in found] == ["1", "3"]


def test_the_check_sees_a_stage_importing_a_later_one():
    bad = ROOT / "tracer" / "capture" / "_stage_probe_tmp.py"
    bad.write_text("from ..commands import options\nfrom ...probes import rates\n")
    try:
        found = upward(bad, STAGES, 1, list(imported_modules(bad)))
    finally:
        bad.unlink()
    assert found == ["tracer/capture/_stage_probe_tmp.py:1 reaches tracer.commands"]
