"""experiments/comm_backends.py's figures: a graph's messages are those that began while it computed; the
time per MB counts the bulk messages alone; backends alternate in order."""

import pandas as pd
import pytest

from daskprobe.experiments.comm_backends import BULK, comm_figures, orders, summarize


def test_a_graphs_figures_come_from_the_messages_that_began_while_it_computed():
    m = pd.DataFrame({"t_first_ns": [50, 100, 200, 300, 900],
                      "t_last_ns": [60, 110, 240, 300 + 2_000_000, 950],
                      "msg_bytes": [10, 10, 10, 2 * BULK, 10]})
    row = {"start_ns": 100, "end_ns": 300, "cpu_s": 0.5, "tasks": 250}
    f = comm_figures(row, m)
    assert f["messages"] == 3 and f["bulk_messages"] == 1
    assert f["us_per_message"] == pytest.approx(0.04)  # median of 10, 40 and 2,000,000 ns
    assert f["ms_per_mb"] == pytest.approx(2.0 / (2 * BULK / 1e6))
    assert f["cpu_ms_per_task"] == pytest.approx(2.0)


def test_no_bulk_message_gives_no_time_per_mb():
    m = pd.DataFrame({"t_first_ns": [100], "t_last_ns": [150], "msg_bytes": [BULK - 1]})
    assert pd.isna(comm_figures({"start_ns": 0, "end_ns": 200, "cpu_s": 1.0, "tasks": 1}, m)["ms_per_mb"])


def test_backends_alternate_and_the_summary_has_median_and_spread():
    assert orders(["a", "b", "c"], 3) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
    runs = pd.DataFrame({"graph": ["g"] * 3, "backend": ["tcp"] * 3, "makespan_s": [1.0, 3.0, 2.0],
                         "cpu_ms_per_task": [1.0] * 3, "messages": [5] * 3, "us_per_message": [1.0, 2.0, 9.0],
                         "ms_per_mb": [1.0] * 3, "bulk_mb": [1.0] * 3})
    s = summarize(runs).iloc[0]
    assert (s.makespan_s_median, s.makespan_s_min, s.makespan_s_max, s.runs) == (2.0, 1.0, 3.0, 3)
    assert s.us_per_message_median == 2.0
