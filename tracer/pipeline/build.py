"""Finalize a run directory: captures -> tables -> analysis -> trace -> report.
Each stage reads what the previous one wrote, so each can be re-run alone."""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from pathlib import Path

from ...probes.rundir import RunDir
from ..decode.forked import ChildFailed, Gate, Queue, beside
from ..capture.say import record, say
from ..capture.session import Interrupted


WHAT = {"tables": "decoding the captures into tables", "analysis": "analysing",
        "trace": "writing trace.pftrace", "html": "writing report.html"}


@contextlib.contextmanager
def _progress(name: str, spinner: bool = True):
    """A spinner on a terminal (rich), else (or for a stage beside another) one line: a stage can
    take tens of seconds."""
    from rich.console import Console
    console = Console(stderr=True)
    if not (spinner and console.is_terminal):
        with contextlib.suppress(OSError):
            say(f"{WHAT[name]} ...")
        yield
        return
    with console.status(f"daskprobe: {WHAT[name]} ..."):
        yield


class Stopped(Exception):
    """A signal (or Ctrl-C) during a stage: finalizing stops after it."""


def _stage(run: RunDir, name: str, fn, spinner: bool = True) -> str | None:
    try:
        with _progress(name, spinner):  # inside: a signal while it imports rich is this stage's interruption too
            fn(run)
        return None
    except (Interrupted, KeyboardInterrupt) as e:
        signum = getattr(e, "signum", 2)
        say(f"{name} stage interrupted; 'daskprobe build {run.path}' finalizes the run directory")
        raise Stopped(f"interrupted by signal {signum}") from None
    except Exception as e:  # one broken stage must not cost the others
        say(f"{name} stage failed: {type(e).__name__}: {e}")
        with contextlib.suppress(OSError):
            traceback.print_exc()
        return f"{type(e).__name__}: {e}"


def analysis(run: RunDir, rules=(), stdout: bool = False) -> None:
    """The analysis stage: the decoded tables in, its tables and summary.json out, the summary printed
    (on stderr while a run finalizes, beside the command's output; on stdout for `report`). What the
    samples say is worked out in a child beside the messages' side, and read back from its tables."""
    from ...analyzers.caveats import caveats
    from ...analyzers import summary_json
    from ...analyzers.summary import INPUTS, SAMPLED, analyze, sampled
    from rich.console import Console

    from ...dashboards.terminal import print_summary
    tables, meta = {name: run.table(name, missing_ok=True) for name in INPUTS}, run.meta()

    def side() -> None:  # in the child
        for name, df in sampled(tables, meta, list(rules)).items():
            run.write_table(name, _hosted(name, df, meta))

    def written(joined) -> dict:  # here, once the attribution needs them
        joined()  # raises what failed in the child
        return {name: run.table(name) for name in SAMPLED}
    with beside(side) as joined:
        result = analyze(tables, meta, list(rules), side=lambda: written(joined))
    for name, df in result.tables.items():
        run.write_table(name, _hosted(name, df, meta))
    summary = result.summary | {"run": str(run.path), "caveats": caveats(meta, result.summary, live_recorder(meta))}
    summary_json.write(run, summary)
    with contextlib.suppress(OSError):  # a closed terminal costs the printout, not the run
        print_summary(summary, Console(stderr=not stdout))


def _hosted(name: str, df, meta: dict):
    """A table of the analysis with the host column its schema asks for (processes' and threads' rows)."""
    from ...probes.schema import TABLES
    from ..decode.tables import with_host
    return with_host(df, meta) if "host" in TABLES[name].names else df


def live_recorder(meta: dict) -> int | None:
    """The pid of the daskprobe still recording this run (its session has not ended), if any: what is
    built now reads captures still being written."""
    if meta.get("ended"):
        return None
    pid = next((p["pid"] for p in meta.get("processes", []) if p.get("name") == "daskprobe"), None)
    if not pid or pid == os.getpid():
        return None
    try:
        alive = b"daskprobe" in Path(f"/proc/{pid}/cmdline").read_bytes()  # not a pid reused since
    except OSError:
        return None
    return pid if alive else None


def _html(run: RunDir) -> None:
    """report.html, its figures drawn by this process and a child, each taking the next one left."""
    from ...dashboards.html_report import FIGURES, figure_sections, write_html
    queue = Queue(len(FIGURES))
    try:
        with beside(lambda: figure_sections(run, queue)) as theirs:
            mine = figure_sections(run, queue)
        write_html(run, mine + theirs())
    finally:
        queue.close()


def report(run: RunDir, rules=(), html: bool = False) -> bool:
    """`daskprobe report`: the analysis again, its summary on stdout, and report.html if asked."""
    ok = _stage(run, "analysis", lambda r: analysis(r, rules, stdout=True)) is None
    return ok and (not html or _stage(run, "html", _html) is None)


def _tables(run: RunDir) -> None:
    from ..decode import tables
    tables.build(run)


def _trace(run: RunDir, analysed=lambda: None) -> None:
    from ...dashboards import trace_writer
    trace_writer.write(run, analysed)


def warm_up() -> None:
    """Import what the stages use and load plotly's figure kinds (about 0.5-0.8 s) while something
    else waits: `run` does it while the cluster starts and the probes get ready. Best effort: a
    stage imports what it needs."""
    with contextlib.suppress(Exception):
        from ..decode import tables  # noqa: F401
        from ...dashboards import trace_writer  # noqa: F401
        from ...analyzers import summary  # noqa: F401
        from ...dashboards import html_report, terminal  # noqa: F401
        html_report.warm_up()


def finalize(run: RunDir, trace: bool = True) -> bool:
    """Every stage in order, each whatever the others did; run.json says which failed,
    how long each took, and whether all ran (`finalized`). A stage imports what it
    needs itself, so that a signal in an import is a stage's interruption too. The
    trace is written in a child process: what it takes from the decoded tables while the
    analysis runs here, the rest (from the analysis' tables) while the page is written."""
    errors, seconds, began = {}, {}, time.perf_counter()
    with contextlib.suppress(OSError, ValueError):
        if live := live_recorder(run.meta()):
            say(f"warning: the run is still recording (daskprobe pid {live}): building what its captures hold so "
                "far; they end mid-run. Build it again once it has ended")
    try:
        _timed(run, "tables", _tables, errors, seconds)
        gate, joined = Gate(), None
        try:
            with beside(lambda: _trace_child(run, gate)) if trace else contextlib.nullcontext() as joined:
                try:
                    _timed(run, "analysis", analysis, errors, seconds)
                finally:
                    gate.open()
                _timed(run, "html", _html, errors, seconds)
        finally:
            gate.open()
            _merge(joined, "trace", errors, seconds)
    except Stopped:
        pass
    done = len(seconds) == 3 + trace and not any("interrupted" in e for e in errors.values())
    record(run, finalize_errors=errors, finalize_seconds=seconds, finalized=done)
    with contextlib.suppress(OSError):
        say(f"{'finalized' if done else 'finalizing stopped'} in {time.perf_counter() - began:.1f} s ("
            + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()) + ")")
    return not errors


def _trace_child(run: RunDir, gate: Gate) -> dict:
    """The trace stage, its seconds without the wait for the analysis. At a lower priority until the
    analysis is done (the page waits on it; nothing waits on the trace but the end), then, where it
    may (as root), at the priority of the rest: what it has left is often the last thing done."""
    os.nice(10)

    def analysed():
        gate.wait()
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    out = _in_child(run, "trace", lambda r: _trace(r, analysed))
    out["seconds"]["trace"] = round(out["seconds"]["trace"] - gate.waited, 3)
    return out


def _timed(run: RunDir, name: str, fn, errors: dict, seconds: dict, spinner: bool = True) -> None:
    start = time.perf_counter()
    try:
        if err := _stage(run, name, fn, spinner):
            errors[name] = err
    except Stopped as e:
        errors[name] = str(e)
        raise
    finally:
        seconds[name] = round(time.perf_counter() - start, 3)


def _in_child(run: RunDir, name: str, fn) -> dict:
    errors, seconds = {}, {}
    with contextlib.suppress(Stopped):
        _timed(run, name, fn, errors, seconds, spinner=False)
    return {"errors": errors, "seconds": seconds}


def _merge(joined, name: str, errors: dict, seconds: dict) -> None:
    if joined is None:
        return
    try:
        got = joined()
        errors.update(got["errors"])
        seconds.update(got["seconds"])
    except ChildFailed as e:
        errors[name] = str(e)
