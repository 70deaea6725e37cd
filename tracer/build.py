"""Finalize a run directory: captures -> tables -> trace -> summary.
Each stage reads what the previous one wrote, so each can be re-run alone."""

from __future__ import annotations

import time
import traceback

from ..probes.rundir import RunDir


def _stage(run: RunDir, name: str, fn) -> str | None:
    from .session import say
    try:
        fn(run)
        return None
    except Exception as e:  # one broken stage must not cost the others
        say(f"{name} stage failed: {type(e).__name__}: {e}")
        traceback.print_exc()
        return f"{type(e).__name__}: {e}"


def _summary(run: RunDir, rules=()) -> None:
    from ..analyzers.summary import write_summary
    from ..dashboards.terminal import print_summary
    print_summary(write_summary(run, rules))


def _html(run: RunDir, rules=()) -> None:
    from ..dashboards.html_report import write_html
    write_html(run, rules)


def report(run: RunDir, rules=(), html: bool = False) -> bool:
    ok = _stage(run, "report", lambda r: _summary(r, rules)) is None
    return ok and (not html or _stage(run, "html", lambda r: _html(r, rules)) is None)


def finalize(run: RunDir, trace: bool = True) -> bool:
    from . import tables, trace_writer
    stages = (("tables", tables.build), ("trace", trace_writer.write) if trace else None,
              ("report", _summary), ("html", _html))
    stages = [s for s in stages if s]
    errors, seconds = {}, {}
    for name, fn in stages:
        start = time.perf_counter()
        if err := _stage(run, name, fn):
            errors[name] = err
        seconds[name] = round(time.perf_counter() - start, 3)
    run.update_meta(finalize_errors=errors, finalize_seconds=seconds)
    return not errors
