"""`daskprobe compare`: untraced bench runs compared by the makespan bench recorded, warnings for runs that
differ in more than the dimension compared, spreads on speedups, figures without data left out."""

import argparse
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from daskprobe.dashboards import bench_results, compare as cmp
from daskprobe.probes.schema import SchemaError
from daskprobe.tracer.commands import compare_verb

PY = "/opt/venv/bin/python3.11"
BENCH = [PY, "-m", "daskprobe.tracer.bench.workloads", "merge-1K"]
UNTRACED = {"error": "no messages were captured: nothing to measure"}  # what an untraced run's summary.json holds


def make_run(path, workers, makespan, traced=True, threads=1, command=BENCH, tasks=1000):
    path.mkdir(parents=True)
    meta = {"command": command, "probes": ["proxy"] if traced else [], "config": {},
            "cluster": {"workers": workers, "threads": threads, "scheduler": "ws", "worker": "normal"}}
    summary = {"makespan_s": makespan, "tasks": tasks, "aot_s": makespan / tasks, "scheduler_cpu_per_task_s": 1e-3,
               "critical_path_s": {"compute": makespan / 2, "runtime_bookkeeping": makespan / 2},
               "cpu_by_category_s": {"scheduler": {"runtime_bookkeeping": 0.5}}} if traced else UNTRACED
    (path / "run.json").write_text(json.dumps(meta))
    (path / "summary.json").write_text(json.dumps(summary))
    return str(path)


REPEATS = {1: (3.2, 3.0, 2.9), 2: (2.0, 1.7, 1.8)}  # makespans of 3 repeats per worker count, seconds


def untraced_bench(tmp_path):
    """A bench's untraced runs (--probes none, its default) and its results.csv, as bench writes them:
    run_dir relative to where bench ran, so only the directory's name tells which row is whose."""
    bench, runs, rows = tmp_path / "bench", [], []
    for w, times in REPEATS.items():
        for r, m in enumerate(times):
            name = f"merge-1K-w{w}-ws-normal-dask-r{r}"
            runs.append(make_run(bench / name, w, m, traced=False))
            rows.append({"graph": "merge-1K", "workers": w, "repeat": r, "status": "ok", "makespan_s": m,
                         "tasks": 1001, "aot_s": m / 1001, "run_dir": f"runs/elsewhere/{name}"})
    pd.DataFrame(rows).to_csv(bench / "results.csv", index=False)
    return runs


def figures(page: str) -> int:
    return page.count("class=\"plotly-graph-div\"")


def test_untraced_bench_runs_are_compared_by_the_makespan_bench_recorded(tmp_path):
    table, notes = cmp.compare(untraced_bench(tmp_path), "workers", tmp_path / "cmp")
    df = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert sorted(df.makespan_s) == [1.7, 1.8, 2.0, 2.9, 3.0, 3.2] and (df.tasks == 1001).all()
    assert table.set_index("workers").geometric_mean_speedup[2] == pytest.approx(3.0 / 1.8)
    assert sum("untraced" in n for n in notes) == 1, notes
    page = (tmp_path / "cmp" / "compare.html").read_text()
    # AOT and speedup drawn; the split and scheduler CPU left out, not drawn empty, and said why
    assert figures(page) == 2
    assert "<h2>Where the session went, per run</h2>" not in page and "<h2>Scheduler CPU per task" not in page
    assert "Not drawn, for lack of data: Where the session went" in page
    assert "Makespan per command" in page and "<td>3.000</td>" in page  # the 1-worker median, in seconds


def test_an_untraced_run_without_results_csv_takes_the_workload_s_line_from_bench_log(tmp_path):
    runs = untraced_bench(tmp_path)
    (tmp_path / "bench" / "results.csv").unlink()
    (tmp_path / "bench" / "merge-1K-w1-ws-normal-dask-r0" / "bench.log").write_text(
        '$ daskprobe run ...\n--- stdout\n{"graph": "merge-1K", "tasks": 1001, "makespan_s": 3.5, "check": "ok"}\n'
        "\n--- stderr\ndaskprobe: ...\n")
    cmp.compare(runs, "workers", tmp_path / "cmp")
    df = pd.read_csv(tmp_path / "cmp" / "compare.csv").set_index("run")
    assert df.makespan_s[runs[0]] == 3.5 and df.makespan_s.drop(runs[0]).isna().all()


ROW = {"graph": "merge-1K", "workers": 1, "scheduler": "ws", "worker": "normal", "server": "dask", "repeat": 0,
       "status": "ok", "makespan_s": 3.5, "tasks": 1001, "aot_s": 3.5 / 1001, "exit_code": 0}


def test_an_untraced_run_out_of_its_bench_takes_its_makespan_from_its_own_row(tmp_path):
    runs = untraced_bench(tmp_path)
    (tmp_path / "bench" / "results.csv").unlink()  # the run directory alone, as bench wrote it
    bench_results.write_row(Path(runs[0]), ROW | {"run_dir": runs[0]})
    cmp.compare(runs, "workers", tmp_path / "cmp")
    df = pd.read_csv(tmp_path / "cmp" / "compare.csv").set_index("run")
    assert df.makespan_s[runs[0]] == 3.5 and df.tasks[runs[0]] == 1001 and df.makespan_s.drop(runs[0]).isna().all()


def test_a_bench_row_is_checked_against_its_columns():
    assert bench_results.frame([ROW]).dtypes["tasks"] == "Int64"
    with pytest.raises(SchemaError, match="column 'makespan' is not in its schema"):
        bench_results.frame([ROW | {"makespan": 3.5}])
    with pytest.raises(SchemaError, match="column 'makespan_s': string values do not fit its dtype float64"):
        bench_results.frame([ROW | {"makespan_s": "3.5 s"}])


def test_no_raw_empty_dataframe_is_printed_and_no_empty_figure_drawn(tmp_path, capsys):
    runs = [make_run(tmp_path / f"w{w}", w, 1.0, traced=False) for w in (1, 2)]  # not from bench: no makespan
    args = argparse.Namespace(run_dirs=runs, by="workers", baseline=None, out=str(tmp_path / "cmp"))
    assert compare_verb.main(args, []) == 0
    out, err = capsys.readouterr()
    assert "Empty DataFrame" not in out + err and "no speedups" in err
    assert "no makespan for 2 run(s)" in err
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert figures(page) == 0 and "Speedups (as the paper" not in page


def test_whole_numbers_print_as_integers(tmp_path):
    runs = [make_run(tmp_path / f"{g}-w{w}", w, m, command=[PY, "-m", "daskprobe.tracer.bench.workloads", g])
            for g in ("merge-1K", "tree-5") for w, m in ((1, 2.0), (2, 1.0))]
    cmp.compare(runs, "workers", tmp_path / "cmp")
    page = (tmp_path / "cmp" / "compare.html").read_text()
    table = page[page.index("Speedups (as the paper"):]
    assert re.search(r"<tr><td>2</td><td>2\.000</td><td>[^<]*</td><td>2</td></tr>", table), table
    assert "2.0<" not in table and "1.0<" not in table


def test_the_speedup_carries_its_spread_over_repeats(tmp_path):
    runs = [make_run(tmp_path / f"w{w}-r{r}", w, m) for w, times in REPEATS.items() for r, m in enumerate(times)]
    table, _ = cmp.compare(runs, "workers", tmp_path / "cmp")
    two = table.set_index("workers").loc[2]
    assert two.speedup_lo == pytest.approx(3.0 / 2.0) and two.speedup_hi == pytest.approx(3.0 / 1.7)
    one = table.set_index("workers").loc[1]
    assert one.speedup_lo == pytest.approx(3.0 / 3.2) and one.speedup_hi == pytest.approx(3.0 / 2.9)
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert "1.500 to 1.765" in page and '"error_y":{"array":' in page.replace(" ", "")


def test_runs_differing_in_threads_or_probes_are_warned_about(tmp_path):
    runs = [make_run(tmp_path / "a", 2, 2.0, threads=1), make_run(tmp_path / "b", 3, 1.5, threads=2),
            make_run(tmp_path / "c", 3, 1.6, threads=1, traced=False)]
    _, notes = cmp.compare(runs, "workers", tmp_path / "cmp")
    assert any("threads per worker as well as in workers" in n for n in notes), notes
    assert any("probes as well as in workers" in n for n in notes), notes
    _, alike = cmp.compare(runs[:1] + [make_run(tmp_path / "d", 3, 1.5)], "workers", tmp_path / "cmp2")
    assert not any("as well as" in n for n in alike), alike


def test_a_workload_at_some_values_only_is_reported_and_not_pooled(tmp_path):
    etl, arr = [PY, "s/etl.py"], [PY, "s/arr.py"]
    runs = [make_run(tmp_path / "etl-w2", 2, 19.0, command=etl), make_run(tmp_path / "etl-w3", 3, 18.0, command=etl),
            make_run(tmp_path / "arr", 2, 12.0, command=arr)]
    _, notes = cmp.compare(runs, "workers", tmp_path / "cmp")
    assert any("arr.py at workers = 2" in n and "only some values" in n for n in notes), notes
    fig = cmp.aot_boxes(pd.read_csv(tmp_path / "cmp" / "compare.csv"), "workers")
    assert sorted(t.name for t in fig.data) == ["arr.py", "etl.py"], "one box per command, not one pooling both"
    assert fig.layout.boxmode == "group"


def test_the_command_column_shows_the_graph_or_script_not_the_interpreter_path(tmp_path):
    assert cmp.workload_name(BENCH) == "merge-1K"
    assert cmp.workload_name(["/tmp/h13/daskprobe/.venv/bin/python", "s/etl.py", "--n", "3"]) == "etl.py --n 3"
    assert cmp.workload_name(["python", "-m", "mypkg.flow"]) == "mypkg.flow"
    runs = [make_run(tmp_path / f"w{w}", w, m, traced=True) for w, m in ((1, 2.0), (2, 1.5))]
    cmp.compare(runs, "workers", tmp_path / "cmp")
    page = (tmp_path / "cmp" / "compare.html").read_text()
    diff = page[page.index("What grew, what shrank"):page.index("Makespan per command")]
    assert "<td>merge-1K</td>" in diff and "daskprobe.experim" not in diff
    assert pd.read_csv(tmp_path / "cmp" / "differences.csv").graph.str.endswith("workloads merge-1K").all()


def test_a_single_run_is_warned_about(tmp_path):
    _, notes = cmp.compare([make_run(tmp_path / "a", 2, 2.0)], "workers", tmp_path / "cmp")
    assert any("nothing to compare" in n for n in notes), notes
    _, same = cmp.compare([make_run(tmp_path / "b", 2, 2.0), make_run(tmp_path / "c", 2, 2.1)], "workers",
                      tmp_path / "cmp2")
    assert any("every run has workers = 2: nothing to compare" in n for n in same), same


def test_run_dirs_and_by_have_help():
    p = argparse.ArgumentParser()
    compare_verb.add_arguments(p)
    helps = {a.dest: a.help for a in p._actions}
    assert helps["run_dirs"] and helps["by"]


def test_an_untraced_run_outside_bench_is_compared_by_the_command_s_wall_time(tmp_path):
    runs = [make_run(tmp_path / f"w{w}", w, 0, traced=False, command=[PY, "flow.py"]) for w in (1, 2)]
    for run, seconds in zip(runs, (6.0, 4.0)):
        (tmp_path / run / "summary.json").write_text(json.dumps(UNTRACED | {"command_s": seconds}))
    table, notes = cmp.compare(runs, "workers", tmp_path / "cmp")
    df = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(df.makespan_s) == [6.0, 4.0] and set(df.makespan_from) == {"command"}
    assert table.set_index("workers").geometric_mean_speedup[2] == pytest.approx(1.5)
    assert any("command's wall time" in n for n in notes), notes


def test_a_bench_s_results_keep_their_types_through_its_files(tmp_path):
    """results.csv is read back as bench wrote it (to resume), a failed run's nulls included."""
    rows = bench_results.frame([ROW | {"run_dir": "a"}, ROW | {"run_dir": "b", "status": "failed", "makespan_s": None,
                                                            "tasks": None, "error": "exit code 1", "exit_code": 1}])
    bench_results.save(rows, tmp_path)
    pd.testing.assert_frame_equal(bench_results.load(tmp_path), rows)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "results.parquet"), rows)
