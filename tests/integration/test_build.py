"""tracer/pipeline/build.py: the analysis stage works out the samples' side in a child, beside the rest; the
tables stage (tracer/decode/tables.py) reads the samplers' captures in a child, beside the messages."""

import json

import pandas as pd

from daskprobe.analyzers.summary import INPUTS, analyze
from daskprobe.probes.rundir import RunDir
from daskprobe.probes.schema import TABLES
from daskprobe.analyzers.summary_json import dumps
from daskprobe.tracer.pipeline.build import _hosted, analysis, report
from daskprobe.tracer.decode.tables import build
from scenario import META, Scenario, two_task_chain
from test_decode import DEEP, make_run


def test_the_stage_split_over_two_processes_says_what_one_process_says(tmp_path):
    s = two_task_chain(Scenario())
    s.state("scheduler", "gil", 37, 39)
    s.state("scheduler", "runnable", 40, 41)
    s.state("scheduler", "blocked", 42, 45)
    s.state("scheduler", "blocked", 5, 25, tid=101)
    s.sample("scheduler", 16, "SchedulerState.decide_worker_non_rootish")
    s.sample("scheduler", 20, "Comm.read", file="distributed/comm/tcp.py", tid=101, name="Dask-Offload_0")
    s.sample("worker-0", 30, "inc", file="my_flow.py", tid=201, name="ThreadPoolExecutor-0_0")
    run, one = RunDir(tmp_path / "two"), RunDir(tmp_path / "one")
    for r in (run, one):
        r.path.mkdir()
        r.write_file("run.json", json.dumps(META))
        for name, df in s.tables().items():
            r.write_table(name, df.reindex(columns=TABLES[name].names))
    expected = analyze({name: one.table(name, missing_ok=True) for name in INPUTS}, META)
    for name, df in expected.tables.items():
        one.write_table(name, _hosted(name, df, META))  # as the stage writes them
    analysis(run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary.pop("run") == str(run.path) and summary.pop("caveats") == []
    assert summary == json.loads(dumps(expected.summary))
    assert summary["critical_path_s"]["gil_contention"] > 0 and len(run.table("cpu_samples")) == 3  # the side's part
    for name in expected.tables:
        pd.testing.assert_frame_equal(run.table(name), one.table(name))


def test_report_prints_the_summary_on_stdout_and_a_finalizing_run_on_stderr(tmp_path, capfd):
    # `daskprobe report RUN > file` keeps the summary; `run` keeps stdout for the command's own output
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.write_file("run.json", json.dumps(META))
    for name, df in two_task_chain(Scenario()).tables().items():
        run.write_table(name, df.reindex(columns=TABLES[name].names))
    assert report(run)
    out, err = capfd.readouterr()
    assert "where the session went" in out and "where the session went" not in err
    analysis(run)
    out, err = capfd.readouterr()
    assert "where the session went" in err and "where the session went" not in out


def test_build_counts_what_it_could_not_decode_in_run_json(tmp_path):
    # the decoding itself: tests/unit/test_decode.py; here the whole stage, its samplers' child included
    run = make_run(tmp_path, [(1, 0, 0, {"op": "update-graph", "keys": ["x"]}), (1, 0, 1, b"\xc1"), (1, 0, 2, DEEP)])
    assert build(run)["undecodable_messages"] == 2
    assert run.meta()["capture"]["undecodable_messages"] == 2
