"""docs/formats.md's tables, rendered from the capture formats' definitions
(proxy_capture.RECORDS, pyspy.LINES, ebpf_format), as reference.py renders
its blocks; tests/unit/test_formats.py fails when the text differs.

    python -m daskprobe.dashboards.formats_reference    # rewrite the generated blocks in place
"""

from __future__ import annotations

import sys

from ..probes import ebpf_format
from ..probes.proxy_capture import RECORDS
from ..probes.pyspy import LINES
from .reference import BLOCK, ROOT

DOC = ROOT / "docs/formats.md"


def _fields(spec: str) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in (f.split(":") for f in spec.split()))


def proxy_records() -> str:
    lines = ["| kind | record | body |", "| --- | --- | --- |"]
    lines += [f"| {number} | `{name}` | {_fields(spec)} |" for number, (name, spec) in RECORDS.items()]
    return "\n".join(lines) + "\n"


def sampler_lines() -> str:
    lines = ["| line | fields after the letter | what |", "| --- | --- | --- |"]
    lines += [f"| `{kind}` | {_fields(spec)} | {what} |" for kind, (spec, what) in LINES.items()]
    return "\n".join(lines) + "\n"


def ebpf_events() -> str:
    Event = ebpf_format.Event
    lines = [f"`struct event`, {ebpf_format.SIZE} bytes: "
             + ", ".join(f"`{name}` {kind} at {getattr(Event, name).offset}" for name, kind in ebpf_format.FIELDS)
             + ".", "",
             "| kind | event | fields | notes |", "| --- | --- | --- | --- |"]
    for name, (number, columns, notes) in ebpf_format.KINDS.items():
        fields = ", ".join(f"`{field}`: {column}" for field, column in columns.items())
        lines.append(f"| {number} | `{name}` | {fields} | {notes} |")
    return "\n".join(lines) + "\n"


BLOCKS = {"proxy-records": proxy_records, "sampler-lines": sampler_lines, "ebpf-events": ebpf_events}


def render(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + BLOCKS[m.group("name")]() + m.group(4), text)


def main() -> int:
    DOC.write_text(render(DOC.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
