"""The reference sections of the README and docs/, rendered from the definitions
the code itself carries (categories, summary keys, capture formats), so that the
text cannot drift from the code.

    python -m daskprobe.dashboards.reference          # rewrite the generated blocks in place

A generated block sits between `<!-- generated: NAME -->` and
`<!-- end generated -->`; the pages in PAGES are generated whole (run.json's and summary.json's
keys); tests/unit/test_docs.py fails when one differs.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..analyzers.categories import CATEGORIES, DEFINITIONS as CATEGORY_DEFINITIONS, UNCATEGORIZED
from ..analyzers import summary_json
from ..analyzers.summary_json import DEFINITIONS as SUMMARY_DEFINITIONS
from ..probes import ebpf_format, run_json
from ..probes.proxy_capture import RECORDS
from ..probes.local_scheduler import LINES as LOCAL_LINES
from ..probes.pyspy import LINES
from .bench_results import RESULTS as BENCH_RESULTS

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


def _fields(spec: str) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in (f.split(":") for f in spec.split()))


def proxy_records() -> str:
    lines = ["| kind | record | body |", "| --- | --- | --- |"]
    lines += [f"| {number} | `{name}` | {_fields(spec)} |" for number, (name, spec) in RECORDS.items()]
    return "\n".join(lines) + "\n"


def _lines(defined: dict) -> str:
    lines = ["| line | fields after the letter | what |", "| --- | --- | --- |"]
    lines += [f"| `{kind}` | {_fields(spec)} | {what} |" for kind, (spec, what) in defined.items()]
    return "\n".join(lines) + "\n"


def sampler_lines() -> str:
    return _lines(LINES)


def local_scheduler_lines() -> str:
    return _lines(LOCAL_LINES)


def ebpf_events() -> str:
    Event = ebpf_format.Event
    lines = [f"`struct event`, {ebpf_format.SIZE} bytes: "
             + ", ".join(f"`{name}` {kind} at {getattr(Event, name).offset}" for name, kind in ebpf_format.FIELDS)
             + ".", "",
             f"An ebpf_events.bin record, {ebpf_format.RECORD_SIZE} bytes: the ring buffer's header "
             f"(`ring_len` u32 at 0, always {ebpf_format.SIZE}; `ring_pgoff` u32 at 4, the kernel's), "
             f"then the struct event at {ebpf_format.RING_HEADER}.", "",
             "| kind | event | fields | notes |", "| --- | --- | --- | --- |"]
    for name, (number, columns, notes) in ebpf_format.KINDS.items():
        fields = ", ".join(f"`{field}`: {column}" for field, column in columns.items())
        lines.append(f"| {number} | `{name}` | {fields} | {notes} |")
    Ustack = ebpf_format.Ustack
    lines += ["", f"`struct ustack`, {ebpf_format.USTACK_SIZE} bytes: `e` struct event at 0, "
              + ", ".join(f"`{name}` {kind} at {getattr(Ustack, name).offset}" for name, kind in ebpf_format.USTACK_FIELDS)
              + f", `stack` u8[{ebpf_format.USTACK_BYTES}] at {Ustack.stack.offset}."]
    return "\n".join(lines) + "\n"


def bench_results() -> str:
    lines = ["| column | dtype | unit | definition |", "| --- | --- | --- | --- |"]
    lines += [f"| `{c.name}` | {c.dtype} | {c.unit} | {c.doc} |" for c in BENCH_RESULTS.columns]
    return "\n".join(lines) + "\n"


BLOCKS = {"categories": categories, "summary-keys": summary_keys, "proxy-records": proxy_records,
          "sampler-lines": sampler_lines, "local-scheduler-lines": local_scheduler_lines, "ebpf-events": ebpf_events,
          "bench-results": bench_results}
FILES = ("README.md", "docs/attribution.md", "docs/formats.md", "docs/bench.md")
# pages generated whole: the JSON files' keys
PAGES = {"docs/run_json.md": run_json.markdown, "docs/summary_json.md": summary_json.markdown}


def render(text: str) -> str:
    """`text` with every generated block it holds rendered afresh."""
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group("name")]() + m.group(4), text)


def main() -> int:
    for name in FILES:
        path = ROOT / name
        path.write_text(render(path.read_text()))
    for name, page in PAGES.items():
        (ROOT / name).write_text(page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
