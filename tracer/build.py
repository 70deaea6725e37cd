"""Finalize a run directory: captures -> tables -> analysis -> trace -> report.
Each stage reads what the previous one wrote, so each can be re-run alone."""

from __future__ import annotations

import json
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


def analysis(run: RunDir, rules=()) -> None:
    """The analysis stage: the decoded tables in, its tables and summary.json out."""
    from ..analyzers.summary import INPUTS, analyze
    from ..dashboards.terminal import print_summary
    result = analyze({name: run.table(name) for name in INPUTS}, run.meta(), list(rules))
    for name, df in result.tables.items():
        run.write_table(name, df)
    summary = result.summary | {"run": str(run.path)}
    (run / "summary.json").write_text(json.dumps(summary, indent=2, default=_json))
    print_summary(summary)


def _json(v):
    return None if v != v else (int(v) if hasattr(v, "__int__") else str(v))


def _html(run: RunDir) -> None:
    from ..dashboards.html_report import write_html
    write_html(run)


def report(run: RunDir, rules=(), html: bool = False) -> bool:
    ok = _stage(run, "analysis", lambda r: analysis(r, rules)) is None
    return ok and (not html or _stage(run, "html", _html) is None)


def finalize(run: RunDir, trace: bool = True) -> bool:
    from . import tables, trace_writer
    stages = (("tables", tables.build), ("analysis", analysis), ("trace", trace_writer.write) if trace else None,
              ("html", _html))
    errors, seconds = {}, {}
    for name, fn in filter(None, stages):
        start = time.perf_counter()
        if err := _stage(run, name, fn):
            errors[name] = err
        seconds[name] = round(time.perf_counter() - start, 3)
    run.update_meta(finalize_errors=errors, finalize_seconds=seconds)
    return not errors
