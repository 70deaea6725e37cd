"""experiments/findings_savings.py: a first finding's predicted saving against its twin's measured one."""

import pandas as pd
import pytest

from daskprobe.experiments.findings_savings import _row, table


def test_the_error_is_the_predicted_saving_less_the_twins_as_a_share_of_the_planted_makespan():
    planted = {"makespan_s": 4.0, "findings": [{"id": "blocked-tasks", "saving": {
        "change": "the tasks never blocked", "saving_s": 3.0, "measured_s": 4.0, "interval_s": [0.8, 1.2]}}]}
    row = _row("blocked_io", planted, {"makespan_s": 0.5})  # fixing it saved 3.5 s
    assert row["measured_s"] == pytest.approx(3.5) and row["error"] == pytest.approx(-0.5 / 4.0)
    assert (row["lo_s"], row["hi_s"]) == pytest.approx((2.8, 3.2))
    unmodelled = _row("slow_udf", {"makespan_s": 4.0, "findings": [{"id": "hot-function", "saving": {
        "not_modelled": "a faster function"}}]}, {"makespan_s": 1.0})
    assert "error" not in unmodelled and unmodelled["change"] == "a faster function"
    text = table(pd.DataFrame([row, unmodelled]))
    assert "1 of 2 first findings have a number" in text and "median 12%" in text
    assert "| slow_udf | `hot-function` | not modelled: a faster function | - | 3.00 | - | - |" in text
