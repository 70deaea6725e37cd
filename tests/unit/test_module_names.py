"""Modules the code names in strings (`python -m daskprobe...`, run_module, find_spec) exist: a module
moved without its name following it fails here, not in a run on several hosts."""

import ast
import importlib.util
import re
from pathlib import Path

import sources

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ["probes", "analyzers", "dashboards", "tracer", "experiments"]
NAME = re.compile(r"daskprobe(\.[a-z_][a-z0-9_]*)+")


def named_modules():
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            tree = sources.tree(path)
            loggers = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call)
                       and getattr(n.func, "attr", None) == "getLogger" for a in n.args}  # a logger's name
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value) \
                        and id(node) not in loggers:
                    yield f"{path.relative_to(ROOT)}:{node.lineno}", node.value


def test_every_module_named_in_a_string_exists():
    found = list(named_modules())
    assert len(found) > 10  # the check reads what it should: run's demo, the agents' relay, the benchmarks' workloads
    missing = [f"{where}: {name}" for where, name in found if importlib.util.find_spec(name) is None]
    assert not missing, "\n".join(missing)
