"""Finalize a run directory: captures -> tables -> trace. Each stage can be re-run alone."""

from __future__ import annotations

import traceback

from daskprobe.tracer.rundir import RunDir


def finalize(run: RunDir) -> bool:
    from daskprobe.tracer.session import say
    from daskprobe.tracer import tables, trace_writer
    errors = {}
    for name, stage in (("tables", tables.build), ("trace", trace_writer.write)):
        try:
            stage(run)
        except Exception as e:  # one broken stage must not cost the others
            errors[name] = f"{type(e).__name__}: {e}"
            say(f"{name} stage failed: {errors[name]}")
            traceback.print_exc()
    run.update_meta(finalize_errors=errors)
    return not errors
