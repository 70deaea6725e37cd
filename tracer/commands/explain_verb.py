"""`daskprobe explain`: what each category and each number of the summary means."""

from __future__ import annotations

HELP = "say what a category of the split, or a number of summary.json, means"
EXAMPLES = """examples:
  daskprobe explain                     # every category and number, one paragraph each
  daskprobe explain gil_contention      # one of them
"""


def add_arguments(p) -> None:
    p.add_argument("name", nargs="?", help="a category (e.g. cpu_starvation) or a key of summary.json")


def main(args, command: list[str]) -> int:
    import difflib
    import textwrap

    from ...analyzers.categories import DEFINITIONS as CATEGORIES
    from ...analyzers.summary_json import DEFINITIONS as NUMBERS
    known = CATEGORIES | NUMBERS
    if args.name and args.name not in known:
        near = difflib.get_close_matches(args.name, list(known), n=3)
        hint = f"; did you mean {' or '.join(near)}?" if near else f"; known: {', '.join(known)}"
        raise SystemExit(f"daskprobe: no category or number called {args.name!r}{hint}")
    for name in [args.name] if args.name else known:
        kind = "category" if name in CATEGORIES else "number"
        print(f"{name} ({kind}):")
        print(textwrap.indent(textwrap.fill(known[name], 88), "  "))
    return 0
