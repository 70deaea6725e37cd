"""bench.html: sections only with data, the spread over repeats on strong scaling; bench's help says
how many runs a point gets."""

import argparse

import pandas as pd
import pytest

from daskprobe.dashboards.bench_report import medians, strong_scaling, write_bench_report
from daskprobe.tracer.commands import bench_verb

TABLE = "Geometric mean speedup of random over ws"


def results(makespans: dict) -> pd.DataFrame:
    """results.csv rows: {(workers, scheduler): makespans of its repeats}."""
    return pd.DataFrame([{"graph": "merge-1K", "workers": w, "scheduler": s, "worker": "normal", "server": "dask",
                          "repeat": r, "status": "ok", "makespan_s": m, "tasks": 1001, "aot_s": m / 1001}
                         for (w, s), times in makespans.items() for r, m in enumerate(times)])


def test_without_random_runs_the_random_over_ws_table_is_left_out(tmp_path):
    write_bench_report(results({(1, "ws"): (3.0,), (2, "ws"): (2.0,)}), tmp_path)
    page = (tmp_path / "bench.html").read_text()
    assert TABLE not in page and "Random vs work-stealing (needs runs under both schedulers" in page
    write_bench_report(results({(1, "ws"): (3.0,), (1, "random"): (2.0,)}), tmp_path)
    assert TABLE in (tmp_path / "bench.html").read_text()


def test_strong_scaling_shows_the_spread_over_repeats(tmp_path):
    fig = strong_scaling(medians(results({(1, "ws"): (3.21, 3.09, 2.95), (2, "ws"): (2.04, 1.69, 1.83)})))
    line = fig.data[0]
    assert list(line.y) == pytest.approx([1.0, 3.09 / 1.83])
    # min to max over repeats: the baseline's median over the slowest repeat, and over the fastest
    assert list(line.y - line.error_y.arrayminus) == pytest.approx([3.09 / 3.21, 3.09 / 2.04])
    assert list(line.y + line.error_y.array) == pytest.approx([3.09 / 2.95, 3.09 / 1.69])
    write_bench_report(results({(1, "ws"): (3.21, 3.09, 2.95), (2, "ws"): (2.04, 1.69, 1.83)}), tmp_path)
    assert "bars: the spread over repeats, min to max" in (tmp_path / "bench.html").read_text()


def test_the_help_says_how_many_runs_each_point_gets():
    p = argparse.ArgumentParser()
    bench_verb.add_arguments(p)
    repeat = p.get_default("repeat")
    assert "one run each" not in bench_verb.HELP and f"--repeat runs of each (default {repeat})" in bench_verb.HELP
