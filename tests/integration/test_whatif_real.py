"""`daskprobe whatif` against a real second run: a run on one worker predicts the same graph on two."""

import json
import sys

from daskprobe.probes.rundir import RunDir

from helpers import daskprobe, searchable_dir

GRAPH = "merge_slow-40-0.02"  # 40 tasks sleeping 20 ms, then one that takes them all


def _run(out, workers: int) -> RunDir:
    p = daskprobe("run", "--workers", str(workers), "--threads", "1", "--no-trace", "--out", str(out), "--",
                  sys.executable, "-m", "daskprobe.tracer.bench.workloads", GRAPH)
    assert p.returncode == 0, p.stderr[-2000:]
    return RunDir(out)


def _makespan(run: RunDir) -> float:
    jobs = run.table("jobs")
    return float(jobs.end_ns.max() - jobs.start_ns.min()) / 1e9


def test_whatif_predicts_a_second_worker_within_a_quarter():
    d = searchable_dir("whatif")
    one = _run(d / "one", 1)
    p = daskprobe("whatif", str(one.path), "--workers", "1,2", "--json", timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    same, two = (json.loads(line) for line in p.stdout.splitlines())
    assert abs(same["replay_error"]) <= 0.25, same  # the model's replay of the run as it was
    real = _makespan(_run(d / "two", 2))
    # half the sleeps on each worker: a model blind to workers would be off by about 2x
    assert two["makespan_s"] < 0.8 * same["measured_s"]
    assert abs(two["makespan_s"] / real - 1) <= 0.25, (two, real)
    assert two["interval_s"][0] <= two["makespan_s"] <= two["interval_s"][1]
    refused = daskprobe("whatif", str(one.path), "--runtime", "rsds")
    assert refused.returncode != 0 and "not modelled" in refused.stderr
