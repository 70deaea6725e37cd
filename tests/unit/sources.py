"""The package's own Python sources, parsed once per session: the tests that read what the code
imports (test_layers) and what it writes to run.json (test_json_schema) walk every module, and
parsing them is most of their time."""

import ast
import functools
from pathlib import Path


def tree(path: Path) -> ast.AST:
    """The module's syntax tree, as it reads now."""
    return _parsed(path.read_text(), str(path))


@functools.cache
def _parsed(text: str, filename: str) -> ast.AST:
    return ast.parse(text, filename)
