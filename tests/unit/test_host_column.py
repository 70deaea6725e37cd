"""Every table of processes' or threads' rows, and every table decoded from a probe's capture, says
which host its rows come from (docs/usage.md lists which)."""

import json

import pandas as pd

from daskprobe.probes.rundir import RunDir
from daskprobe.probes.schema import HOST_PID, TABLES
from daskprobe.tracer.decode import tables

PROBE_TABLES = {"samples", "stacks", "frames", "gil_waits", "offcpu", "short_waits", "tcp", "proc", "thread_names"}


def test_every_table_of_processes_threads_or_probe_captures_has_a_host_column():
    per_process = {name for name, t in TABLES.items() if {"pid", "tid"} & set(t.names)}
    assert {"thread_states", "threads", "cpu_samples", "attempt_threads"} <= per_process
    lacking = sorted(name for name in per_process | PROBE_TABLES if "host" not in TABLES[name].names)
    assert lacking == [], lacking


def test_the_probes_tables_say_the_host_of_the_capture_each_row_came_from(tmp_path):
    run = RunDir(tmp_path)
    for sub in ("captures", "tables", "hosts/10.0.0.2/captures"):
        (tmp_path / sub).mkdir(parents=True)
    theirs = HOST_PID + 20  # pid 20 on the first host with an agent
    run.update_meta(hosts={"10.0.0.2": {"number": 1, "offset_ns": 0}}, processes=[
        {"pid": 10, "name": "scheduler", "role": "scheduler", "listen": None, "contact": None, "command": []},
        {"pid": theirs, "name": "worker-0", "role": "worker", "listen": None, "contact": None, "command": [],
         "host": "10.0.0.2"}])
    for cap, pid in ((tmp_path / "captures", 10), (tmp_path / "hosts/10.0.0.2/captures", 20)):
        (cap / "pyspy.tsv").write_text(f"F\t0\tmain\t/a.py\t1\nS\t5\t{pid}\t{pid}\t1\t1\tMainThread\t0\t7\t0\t0\t0\n")
        (cap / "proc.tsv").write_text(f"5\t{pid}\t1\t1\t100\t1000\n7\t99\t1\t1\t100\t1000\n")  # 99: no process of the run's
        (cap / "threads.tsv").write_text(f"{pid}\t{pid}\tpython\n")
    procs = tables.processes_table(run.meta())
    tables.probe_tables(run, procs, pd.DataFrame(columns=TABLES["connections"].names))
    for name in PROBE_TABLES:
        df = run.table(name)
        assert df.host.notna().all(), name
    by_pid = run.table("samples").set_index("pid").host.to_dict()
    assert by_pid == {10: "local", theirs: "10.0.0.2"}
    assert sorted(run.table("proc").host) == ["10.0.0.2", "10.0.0.2", "local", "local"]
    assert sorted(run.table("frames").host) == ["10.0.0.2", "local"]


def test_the_analysis_tables_take_the_host_from_the_pid_or_tid():
    meta = json.loads(json.dumps({"hosts": {"10.0.0.2": {"number": 1}, "10.0.0.3": {"number": 2}}}))
    df = pd.DataFrame({"tid": [10, HOST_PID + 10, 2 * HOST_PID + 10, 3 * HOST_PID + 1]})
    assert tables.with_host(df, meta).host.tolist()[:3] == ["local", "10.0.0.2", "10.0.0.3"]
    assert pd.isna(df.host[3]), "a host none of the run's"
