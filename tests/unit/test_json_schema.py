"""run.json and summary.json against their definitions (probes/run_json.py, analyzers/summary_json.py):
checked at write (a bug raises in the tests, and the data is written all the same) and at read (an
older run directory opens, missing keys taking their documented defaults)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from daskprobe.analyzers import summary_json
from daskprobe.probes import json_schema, rates
from daskprobe.probes.json_schema import SchemaError, problems
from daskprobe.probes.rundir import RunDir
from daskprobe.probes.run_json import RUN_JSON
from sources import tree

PACKAGE = Path(__file__).resolve().parents[2]
LAYERS = ("probes", "analyzers", "dashboards", "tracer", "experiments")


def test_an_unknown_key_raises_in_the_tests_and_is_written_all_the_same(tmp_path):
    run = RunDir(tmp_path)
    run.update_meta(partial=True)
    with pytest.raises(SchemaError, match="run.json.no_such_key: a key run.json does not define"):
        run.update_meta(no_such_key=1)
    assert json.loads((tmp_path / "run.json").read_text()) == {"partial": True, "no_such_key": 1}


def test_a_wrong_type_raises_at_any_depth(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(SchemaError, match=r"run.json.exit_code: \"0\" is not int or null"):
        run.update_meta(exit_code="0")
    with pytest.raises(SchemaError, match=r"run.json.processes\[0\].pid: \"7\" is not int or null"):
        run.update_meta(processes=[{"name": "scheduler", "role": "scheduler", "pid": "7"}])
    with pytest.raises(SchemaError, match=r"run.json.cluster.nany: a key cluster does not define"):
        run.update_meta(cluster={"workers": 2, "nany": True})
    with pytest.raises(SchemaError, match="is not bool"):  # JSON's true is no int, and 1 no bool
        run.update_meta(finalized=1)


def test_outside_the_tests_a_problem_is_said_once_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DASKPROBE_STRICT", "0")
    run = RunDir(tmp_path)
    for _ in range(2):
        run.update_meta(exit_code="0", partial=False)
    assert run.meta() == {"partial": False}  # the reader does not get what does not fit...
    assert json.loads((tmp_path / "run.json").read_text())["exit_code"] == "0"  # ...but nothing is lost
    assert capsys.readouterr().err.count("run.json.exit_code") == 1


def test_an_older_run_directory_opens_with_the_documented_defaults(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"command": ["python", "flow.py"], "a_newer_key": [1]}))
    meta = RunDir(tmp_path).meta()
    assert (meta.sample_rate, meta.cpu_hz) == (rates.SAMPLE_RATE, rates.CPU_HZ)
    assert meta.finalized is False and meta.hosts == {} and meta.ended is None and meta.command == ["python", "flow.py"]
    assert meta["a_newer_key"] == [1]  # a newer daskprobe's key: kept for whoever knows it
    with pytest.raises(AttributeError):
        meta.sample_rat  # a name run.json does not define is a reader's bug


def test_a_wrong_type_read_raises_in_the_tests(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"sample_rate": "fast"}))
    with pytest.raises(SchemaError, match="run.json.sample_rate"):
        RunDir(tmp_path).meta()


def _writes_run_json(node: ast.AST) -> bool:
    """run.update_meta(...), or tracer/capture/session.py's record(run, ...)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "update_meta") or (
        isinstance(f, ast.Name) and f.id == "record" and bool(node.args) and ast.unparse(node.args[0]).endswith("run"))


def _written_keys() -> dict[str, str]:
    """Every keyword given to run.json's writers anywhere in the package: {key: where}."""
    out = {}
    files = [p for layer in LAYERS for p in (PACKAGE / layer).rglob("*.py") if not {"target", "vendor"} & set(p.parts)]
    for path in files:
        for node in ast.walk(tree(path)):
            if _writes_run_json(node):
                out |= {k.arg: f"{path.relative_to(PACKAGE)}:{node.lineno}" for k in node.keywords if k.arg}
    return out


def test_every_key_the_code_writes_to_run_json_is_defined():
    written = _written_keys()
    assert {"partial", "exit_code", "finalized", "hosts", "capture"} <= set(written), "the search finds the writers"
    assert not {k: w for k, w in written.items() if k not in RUN_JSON.keys}


def test_summary_json_is_checked_when_written_and_read(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(SchemaError, match="summary.json.makespan: a key summary.json does not define"):
        summary_json.write(run, {"makespan": 1.0})
    with pytest.raises(SchemaError, match=r"summary.json.jobs\[0\].tasks: \"3\" is not int"):
        summary_json.write(run, {"jobs": [{"job": 0, "tasks": "3"}]})
    run.write_file("summary.json", json.dumps({"makespan_s": 2.5}))
    s = summary_json.read(run)
    assert s.makespan_s == 2.5 and s.findings == [] and s.critical_path_s == {} and s.tasks is None


def test_problems_names_what_does_not_fit():
    kinds = json_schema.obj("x", "", json_schema.Key("n", dict[str, list[int]], ""))
    assert problems({"n": {"a": [1, 2.5]}}, kinds, "x") == ["x.n.a[1]: 2.5 is not int"]
    assert problems({"n": {"a": []}}, kinds, "x") == []
