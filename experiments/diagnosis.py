"""Benchmark: does the first finding name the cause a script was written with?

    python -m daskprobe.experiments.diagnosis
    python -m daskprobe.experiments.diagnosis --flows gil,recompute --repeat 2 --out runs/diagnosis

Each script in experiments/diagnosis_flows/ is a plain Dask user's script with
one planted cause; PLANT=0 runs its twin, the same script without the cause.
Its docstring says, one per line, the cause (`cause:`), the finding ids that
name it (`expect:`) and the `daskprobe run` options it needs (`options:`).
Each script runs planted, then as its twin, as `daskprobe run OPTIONS -- python
SCRIPT` with every probe. Per script the table says: the planted run's first
finding, whether it names the cause, whether any finding does, and the twin's
findings (one that names the cause is a false positive). Writes runs.csv (one
row per run), diagnosis.csv and diagnosis.md in --out and prints the table.
Run directories go to a temporary directory, deleted once summary.json is
read (--keep: kept under OUT/runs). --retable makes the table again from
OUT/runs.csv (after a script's expected ids changed); --reanalyze analyses
the kept runs again with the code of now (after the findings changed), in
minutes rather than the benchmark's half hour.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..analyzers import summary_json
from ..probes.rundir import RunDir

FLOWS_DIR = Path(__file__).with_name("diagnosis_flows")
ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900


@dataclass(frozen=True)
class Flow:
    name: str
    path: Path
    cause: str
    expect: tuple[str, ...]
    options: tuple[str, ...]


def flows() -> dict[str, Flow]:
    """The scripts, by name, from their docstrings (read, never imported: they are the cluster user's)."""
    found = {}
    for path in sorted(FLOWS_DIR.glob("[!_]*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        keys = dict(line.split(":", 1) for line in doc.splitlines()
                    if line.split(":", 1)[0] in ("cause", "expect", "options"))
        found[path.stem] = Flow(path.stem, path, keys["cause"].strip(),
                                tuple(i.strip() for i in keys["expect"].split(",")), tuple(keys["options"].split()))
    return found


def run_one(flow: Flow, plant: bool, out: Path) -> dict:
    """One `daskprobe run` of the script (planted or its twin) and what its summary.json found."""
    cmd = [sys.executable, "-m", "daskprobe.tracer.commands", "run", "--no-trace", "--out", str(out), *flow.options,
           "--", sys.executable, str(flow.path)]
    row = {"flow": flow.name, "plant": plant}
    try:
        p = subprocess.run(cmd, env=os.environ | {"PLANT": "1" if plant else "0"}, capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return row | {"exit_code": None, "error": f"timed out after {TIMEOUT_S} s"}
    return row | {"exit_code": p.returncode} | findings(out, p.stderr if p.returncode else "")


def reanalyzed(row: dict, out: Path) -> dict:
    """The row of a kept run, its captures analysed again by today's code (`daskprobe report`)."""
    p = subprocess.run([sys.executable, "-m", "daskprobe.tracer.commands", "report", str(out)], capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    keep = {k: row[k] for k in ("flow", "plant", "exit_code", "repeat")}
    return keep | findings(out, p.stderr if p.returncode else "")


def findings(out: Path, failed: str) -> dict:
    """What a run's summary.json found; `failed`: the stderr of a command that failed, else ''."""
    try:
        s = summary_json.read(RunDir(out))
    except (OSError, ValueError):
        return {"error": failed[-500:] or f"no summary.json: {_stage_errors(out)}"}
    found = s.get("findings", [])
    return {"session_s": s.get("session_s"), "ids": ",".join(f["id"] for f in found),
            "first_title": found[0]["title"] if found else None, "error": s.get("error") or failed[-500:] or None}


def _stage_errors(out: Path) -> str:
    """Why finalizing the run failed, by stage (run.json's finalize_errors)."""
    try:
        errors = RunDir(out).meta().get("finalize_errors") or {}
    except (OSError, ValueError):
        return "no run.json"
    return "; ".join(f"{stage}: {e}" for stage, e in errors.items()) or "no stage failed"


def run_dir(scratch: Path, flow: str, plant: bool, repeat: int) -> Path:
    return scratch / f"{flow}-{'planted' if plant else 'twin'}-r{repeat}"


def paired(runs: pd.DataFrame, known: dict[str, Flow]) -> pd.DataFrame:
    """One row per script and repeat: the planted run's findings beside its twin's."""
    rows = []
    for (name, repeat), g in runs.groupby(["flow", "repeat"], sort=False):
        flow, got = known[name], {bool(r["plant"]): r for r in g.to_dict("records")}
        planted, twin = got.get(True, {}), got.get(False, {})
        ids, twin_ids = _ids(planted), _ids(twin)
        rows.append({"flow": name, "repeat": repeat, "cause": flow.cause, "expected": ",".join(flow.expect),
                     "first_id": ids[0] if ids else None, "first_title": planted.get("first_title"),
                     "first_names": bool(ids) and ids[0] in flow.expect,
                     "any_names": any(i in flow.expect for i in ids), "planted_ids": ",".join(ids),
                     "twin_ids": ",".join(twin_ids), "false_positive": any(i in flow.expect for i in twin_ids),
                     "session_s": planted.get("session_s"), "twin_session_s": twin.get("session_s"),
                     "error": "; ".join(f"{v}: {r['error']}" for v, r in (("planted", planted), ("twin", twin))
                                        if _text(r.get("error")))})
    return pd.DataFrame(rows)


def _ids(run: dict) -> list[str]:
    return _text(run.get("ids")).split(",") if _text(run.get("ids")) else []


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)


def headline(table: pd.DataFrame) -> str:
    n = len(table)
    return (f"planted cause first in {int(table.first_names.sum())} of {n}; named by some finding in "
            f"{int(table.any_names.sum())} of {n}; false positives in the twins: {int(table.false_positive.sum())} "
            f"of {n}")


def version(out: Path) -> str:
    """The commit the findings came from, and whether analyzers/ differed from it (the findings live there:
    its diff goes to OUT/analyzers.diff, so that the table can be traced to the code that made it)."""
    git = ["git", "-C", str(ROOT)]
    try:
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        diff = subprocess.run([*git, "diff", "HEAD", "--", "analyzers"], capture_output=True, text=True).stdout
    except OSError:
        return "commit unknown"
    (out / "analyzers.diff").write_text(diff)
    changed = " with uncommitted changes in analyzers/ (analyzers.diff)" if diff else ""
    return f"commit {commit or 'unknown'}{changed}"


def markdown(table: pd.DataFrame, made: str) -> str:
    cols = ("script", "planted cause", "expected ids", "first finding (planted)", "first names it",
            "any names it", "other findings (planted)", "twin's findings", "twin false positive",
            "session s (planted / twin)")
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in table.to_dict("records"):
        first = f"`{r['first_id']}`: {r['first_title']}" if r["first_id"] else "none"
        others = r["planted_ids"].split(",")[1:] if r["planted_ids"] else []
        cells = (r["flow"] + (f" (r{r['repeat']})" if table.repeat.nunique() > 1 else ""), r["cause"],
                 ", ".join(f"`{i}`" for i in r["expected"].split(",")), first, _yes(r["first_names"]),
                 _yes(r["any_names"]), ", ".join(f"`{i}`" for i in others) or "-",
                 ", ".join(f"`{i}`" for i in r["twin_ids"].split(",") if i) or "none",
                 _yes(r["false_positive"]), f"{_s(r['session_s'])} / {_s(r['twin_session_s'])}")
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    errors = [f"- {r['flow']}: {r['error']}" for r in table.to_dict("records") if r["error"]]
    return "\n".join([f"{headline(table)} ({made})", "", *lines,
                      *(["", "Errors:", *errors] if errors else [])]) + "\n"


def _yes(v: bool) -> str:
    return "yes" if v else "no"


def _s(v) -> str:
    return "-" if v is None or pd.isna(v) else f"{v:.1f}"


def main(argv=None) -> int:
    known = flows()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flows", default=",".join(known), help="comma-separated scripts (default: all)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", default="runs/diagnosis")
    p.add_argument("--keep", action="store_true", help="keep the run directories (under OUT/runs)")
    p.add_argument("--retable", action="store_true",
                   help="run nothing: the table again from OUT/runs.csv, with the scripts' expected ids of now")
    p.add_argument("--reanalyze", action="store_true",
                   help="run nothing: analyse the runs kept in OUT/runs again (daskprobe report), then the table")
    args = p.parse_args(argv)
    unknown = set(args.flows.split(",")) - set(known)
    if unknown:
        p.error(f"no such script(s): {', '.join(sorted(unknown))}; there are {', '.join(known)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.reanalyze:
        runs = reanalyze_all(pd.read_csv(out / "runs.csv"), out)
    else:
        runs = pd.read_csv(out / "runs.csv") if args.retable else run_all(args, known, out)
    table = paired(runs, known)
    table.to_csv(out / "diagnosis.csv", index=False)
    (out / "diagnosis.md").write_text(markdown(table, str(runs["code"].iloc[0]) if "code" in runs else "code unknown"))
    _print(table)
    return 0


def run_all(args, known: dict[str, Flow], out: Path) -> pd.DataFrame:
    """Each script planted, then its twin, per repeat; one row per run (OUT/runs.csv, rewritten after each)."""
    scratch = out / "runs" if args.keep else Path(tempfile.mkdtemp(prefix="daskprobe-diagnosis-"))
    scratch.mkdir(exist_ok=True)
    scratch.chmod(0o711)  # a root daskprobe runs the cluster as another user, who must reach the run directory
    todo = [(r, known[f], plant) for r in range(args.repeat) for f in args.flows.split(",") for plant in (True, False)]
    # the code the runs ran, not what it became meanwhile
    made = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {version(out)}"
    rows = []
    try:
        with Progress(console=Console(stderr=True)) as progress:
            bar = progress.add_task("diagnosis", total=len(todo))
            for r, flow, plant in todo:
                progress.update(bar, description=f"r{r} {flow.name} {'planted' if plant else 'twin'}")
                there = run_dir(scratch, flow.name, plant, r)
                rows.append(run_one(flow, plant, there) | {"repeat": r, "code": made})
                pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)  # what ran so far, if stopped
                if not args.keep:
                    shutil.rmtree(there, ignore_errors=True)
                progress.advance(bar)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return pd.DataFrame(rows)


def reanalyze_all(runs: pd.DataFrame, out: Path) -> pd.DataFrame:
    """Every run of runs.csv analysed again by the code of now (the runs' findings came from the analyzers of
    their own moment, which may have changed between the first run and the last)."""
    made = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (analysed again), {version(out)}"
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        for row in progress.track(runs.to_dict("records"), description="analysing again"):
            there = run_dir(out / "runs", row["flow"], bool(row["plant"]), int(row["repeat"]))
            rows.append(reanalyzed(row, there) | {"code": made})
    runs = pd.DataFrame(rows)
    runs.to_csv(out / "runs.csv", index=False)
    return runs


def _print(table: pd.DataFrame) -> None:
    console = Console()
    t = Table(title="does the first finding name the planted cause?")
    for col in ("script", "cause", "first finding (planted)", "first", "any", "twin's findings", "false +"):
        t.add_column(col)
    for r in table.to_dict("records"):
        t.add_row(r["flow"], r["cause"], f"{r['first_id'] or 'none'}: {r['first_title'] or ''}",
                  _yes(r["first_names"]), _yes(r["any_names"]), r["twin_ids"] or "none",
                  "YES" if r["false_positive"] else "no")
    console.print(t)
    console.print(f"[bold]{headline(table)}[/]")
    for r in table.to_dict("records"):
        if r["error"]:
            console.print(f"[yellow]{r['flow']}[/]: {r['error']}", highlight=False)


if __name__ == "__main__":
    sys.exit(main())
