"""whatif --scaling: the scheduler's costs fitted on a small synthetic bench table, the heartbeats
Dask adds as workers grow, and the flag on every prediction beyond measured ground (times in ms)."""

import json

import pandas as pd
import pytest

from daskprobe.analyzers.whatif import Changes, predict
from daskprobe.analyzers.whatif.scaling import Fit, fit, ground, heartbeats_per_s
from daskprobe.dashboards import bench_results
from daskprobe.tracer.commands.whatif_verb import render

from scenario import META, Scenario, two_task_chain
from test_whatif import tables

MS = 1e-3
ONE = META | {"cluster": {"threads": 1}}


def bench(rows: list[tuple[int, float, float]], **extra) -> pd.DataFrame:
    """Runs of 1,000 tasks: (workers, the scheduler's CPU per task but the administrative, administrative
    CPU s), with 1,000 administrative messages of 3,000 each."""
    return bench_results.frame([{"graph": "merge-1K", "workers": w, "repeat": 0, "status": "ok", "server": "dask",
                                 "tasks": 1000, "scheduler_cpu_s": per_task * 1000 + admin, "administrative_cpu_s": admin,
                                 "scheduler_messages": 3000, "administrative_msg_share": 1 / 3} | extra
                                for w, per_task, admin in rows])


def test_the_curve_is_fitted_from_a_bench_table_and_widens_away_from_it():
    # 400 µs + 1 µs per worker, give or take 5 µs; a failed run and one without proc are left out
    rows = bench([(8, 408e-6 + 5e-6, 0.01), (16, 416e-6 - 5e-6, 0.02), (32, 432e-6 - 5e-6, 0.01),
                  (64, 464e-6 + 5e-6, 0.02)])
    failed = bench([(128, 1.0, 0.0)], status="failed")
    no_proc = bench([(256, 1.0, 0.0)]).assign(scheduler_cpu_s=float("nan"))
    f = fit(pd.concat([rows, failed, no_proc], ignore_index=True))
    assert (f.lo, f.hi, f.points) == (8, 64, 4)
    assert f.slope == pytest.approx(1e-6, rel=0.1) and f.intercept == pytest.approx(400e-6, rel=0.02)
    assert f.admin_msg_s == pytest.approx(0.06 / 4000)  # administrative CPU over their messages, pooled
    inside, beyond = f.per_task_interval_s(32), f.per_task_interval_s(1024)
    assert inside[0] < f.per_task_s(32) < inside[1] and beyond[0] < f.per_task_s(1024) < beyond[1]
    assert beyond[1] - beyond[0] > 5 * (inside[1] - inside[0])
    point, low, high = f.factor(1024, 8)
    assert point == pytest.approx(f.per_task_s(1024) / f.per_task_s(8)) and low < point < high
    # a cost that falls with workers is held flat, not extrapolated to nothing
    falling = fit(bench([(8, 500e-6, 0), (16, 450e-6, 0), (32, 400e-6, 0)]))
    assert falling.slope == 0 and falling.per_task_s(1024) == pytest.approx(450e-6)
    with pytest.raises(ValueError, match="two or more"):
        fit(bench([(8, 500e-6, 0), (8, 450e-6, 0)]))


def test_heartbeats_grow_with_workers_per_dasks_rule():
    # distributed.scheduler.heartbeat_interval: 0.5 s to 10 workers, 1 s below 50, 2 s below 200, then n/200 + 1
    assert [heartbeats_per_s(n) for n in (8, 10, 11, 49, 50, 199, 200)] == [16, 20, 11, 49, 25, 99.5, 100]
    assert heartbeats_per_s(1024) == pytest.approx(1024 / 6.12)
    f = Fit(intercept=1e-3, slope=0, lo=2, hi=8, points=3, resid_s=0, mean_w=5, sxx=18, admin_msg_s=10e-6)
    # each heartbeat is two administrative messages (the heartbeat and its reply)
    assert f.admin_load(1024, 8) == pytest.approx((1024 / 6.12 - 16) * 2 * 10e-6)
    assert f.admin_load(8, 8) == 0


def test_heartbeats_beyond_the_runs_take_their_share_of_the_schedulers_loop():
    """The chain of test_whatif (43 ms replayed, 9 ms of it the scheduler's graph handling) on 8 workers
    instead of 2: 12 more heartbeats a second at 2 messages of 1/48 s each take half the scheduler's loop,
    so its graph takes 18 ms; its CPU is the 9 ms and half the makespan."""
    f = Fit(intercept=1e-3, slope=0, lo=2, hi=8, points=3, resid_s=0, mean_w=5, sxx=18, admin_msg_s=1 / 48)
    p = predict(tables(two_task_chain(Scenario())), ONE, Changes(workers=8), scaling=f)
    assert p["makespan_s"] == pytest.approx(52 * MS)
    assert p["scheduler_cpu_s"] == pytest.approx(9 * MS + 0.5 * 52 * MS)
    assert "heartbeats +50.0% of its loop" in p["scheduler_costs"]


def test_a_prediction_beyond_measured_ground_is_flagged_in_text_and_json():
    f = Fit(intercept=1e-3, slope=1e-6, lo=4, hi=32, points=3, resid_s=1e-5, mean_w=16, sxx=300, admin_msg_s=0)
    t = tables(two_task_chain(Scenario()))  # a run on 2 workers
    inside, beyond = (predict(t, ONE, Changes(workers=w), samples=1, scaling=f) for w in (32, 64))
    assert inside["ground"] == "measured" and not inside["extrapolated"]
    assert beyond["ground"] == "extrapolated from 2..32 workers" and beyond["extrapolated"]
    assert json.loads(json.dumps(beyond))["ground"] == beyond["ground"]
    text = render([inside, beyond])
    row = next(line for line in text.splitlines() if line.startswith("workers=64"))
    assert "extrapolated from 2..32 workers" in row
    # without a bench, the run's own count is the measured ground, and the costs are said to be the run's
    alone = predict(t, ONE, Changes(workers=4), samples=1)
    assert alone["ground"] == "extrapolated from 2 workers" and "no --scaling" in alone["scheduler_costs"]
    assert ground(4, 2, None) != "measured" and ground(2, 2, None) == "measured"


def test_a_prediction_inside_measured_ground_has_no_flag():
    f = Fit(intercept=1e-3, slope=1e-6, lo=4, hi=32, points=3, resid_s=1e-5, mean_w=16, sxx=300, admin_msg_s=0)
    t = tables(two_task_chain(Scenario()))
    out = [predict(t, ONE, Changes(workers=w), samples=1, scaling=f) for w in (1, 2, 16)]
    assert all(p["ground"] == "measured" and not p["extrapolated"] for p in out)
    assert "extrapolated" not in render(out)


def test_findings_of_a_summary_from_before_the_model_say_to_run_report(tmp_path):
    from daskprobe.probes.rundir import RunDir
    from daskprobe.tracer.commands.whatif_verb import _findings
    (tmp_path / "summary.json").write_text(json.dumps({"findings": [{"id": "hot-function", "advice": "..."}]}))
    with pytest.raises(SystemExit, match="daskprobe report"):
        _findings(RunDir(tmp_path), tables(two_task_chain(Scenario())), 1)
