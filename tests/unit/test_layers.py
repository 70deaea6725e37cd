"""Each top-level folder is one layer and imports only from the layers below it."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["probes", "analyzers", "dashboards", "tracer", "experiments"]  # bottom to top


def imported_layers(path: Path):
    """(line, layer) for every import of a daskprobe module in `path`."""
    layer = path.relative_to(ROOT).parts[0]
    depth = len(path.relative_to(ROOT).parts) - 1  # packages between the root package and this module
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb `level` packages from this module's own
                parts = list(path.relative_to(ROOT).parts[:-1])[:max(0, depth - node.level + 1)]
                target = (parts + (node.module or "").split("."))
                target = [p for p in target if p]
                yield node.lineno, target[0] if target else layer
            elif (node.module or "").startswith("daskprobe."):
                yield node.lineno, node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("daskprobe."):
                    yield node.lineno, a.name.split(".")[1]


def test_imports_only_go_down():
    upward = []
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            for line, target in imported_layers(path):
                if target in LAYERS and LAYERS.index(target) > LAYERS.index(layer):
                    upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    bad = ROOT / "probes" / "_layer_probe_tmp.py"
    bad.write_text("from ..tracer import session\n")
    try:
        found = list(imported_layers(bad))
    finally:
        bad.unlink()
    assert found == [(1, "tracer")]
