"""The reference sections of the README and docs/, rendered from the definitions
the analysis itself carries, so that the text cannot drift from the code.

    python -m daskprobe.dashboards.reference          # rewrite the generated blocks in place

A generated block sits between `<!-- generated: NAME -->` and
`<!-- end generated -->`; tests/unit/test_docs.py fails when one differs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..analyzers.categories import CATEGORIES, DEFINITIONS as CATEGORY_DEFINITIONS, UNCATEGORIZED
from ..analyzers.summary import DEFINITIONS as SUMMARY_DEFINITIONS

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)


def _table(header: tuple[str, str], rows: dict[str, str]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "| --- | --- |"]
    lines += [f"| `{k}` | {v} |" for k, v in rows.items()]
    return "\n".join(lines) + "\n"


def categories() -> str:
    return _table(("category", "seconds of the session spent ..."),
                  {c: CATEGORY_DEFINITIONS[c] for c in (*CATEGORIES, UNCATEGORIZED)})


def summary_keys() -> str:
    return _table(("key of summary.json", "definition"), SUMMARY_DEFINITIONS)


BLOCKS = {"categories": categories, "summary-keys": summary_keys}
FILES = ("README.md", "docs/attribution.md")


def render(text: str) -> str:
    """`text` with every generated block it holds rendered afresh."""
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group("name")]() + m.group(4), text)


def main() -> int:
    for name in FILES:
        path = ROOT / name
        path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
