"""The makespan split on real clusters, against causes injected as real code has
them (a small subset of experiments/attribution.py, which runs the whole
matrix). Each test runs a workload unperturbed and perturbed, adjacent in time,
and requires most of the added session time in the cause's category. The
bounds are looser than the benchmark's targets: CI machines are noisy and each
cell here is one pair, not the median of several."""

import importlib.util
import json
import os
import sys

import pytest

from helpers import daskprobe

INJECT = importlib.util.find_spec("daskprobe.experiments.inject").origin


def summary(tmp, name, flow, *opts, env=None) -> dict:
    out = tmp / name
    p = daskprobe("run", "--workers", "2", "--out", str(out), *opts, "--", sys.executable, "-m",
                  "daskprobe.experiments.flows", flow, env=os.environ | (env or {}), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert sum(s["critical_path_s"].values()) == pytest.approx(s["session_s"], rel=1e-6), \
        "the categories partition the session"
    return s


def added(base, pert, category):
    return (pert["critical_path_s"].get(category, 0) - base["critical_path_s"].get(category, 0),
            pert["session_s"] - base["session_s"])


def holds(got: float, share: float, more: float, injected: float, pert: dict, most: float = 1.3):
    """The category holds `share` of the injected time that reached the session, and not much more
    than was injected. The session's growth alone is no yardstick on a loaded machine: the pair
    also differs by noise (CI once saw 3.1 s more for 1.6 s injected, the rest in cpu_starvation)."""
    assert share * min(more, injected) <= got <= most * injected, (got, more, injected, pert["critical_path_s"])


def finding_ids(s: dict) -> list[str]:
    return [f["id"] for f in s["findings"]]


def preload():
    return "--config", f"distributed.scheduler.preload=['{INJECT}']"


def test_wire_delay_goes_to_network_and_an_unperturbed_loopback_has_none(tmp_path):
    base = summary(tmp_path, "base", "chain", "--probes", "proxy")
    assert base["critical_path_s"]["network"] <= 0.02 * base["session_s"]
    pert = summary(tmp_path, "delayed", "chain", "--probes", "proxy", "--delay-ms", "10")
    net, more = added(base, pert, "network")
    assert more > 1.0, "2 rounds x 40 hops x 2 messages x 10 ms"
    # at most twice: a hop whose input is on the other worker fetches it, two more messages
    holds(net, 0.85, more, 2 * 40 * 2 * 0.010, pert, most=2.2)
    assert "network" in finding_ids(pert) and "network" not in finding_ids(base), (pert["findings"], base["findings"])


def test_slow_worker_choice_goes_to_scheduler_decisions(tmp_path):
    base = summary(tmp_path, "base", "chain", "--probes", "proxy,pyspy,offcpu,gil")
    spins = tmp_path / "spins"
    pert = summary(tmp_path, "slow", "chain", "--probes", "proxy,pyspy,offcpu,gil", *preload(),
                   env={"DASKPROBE_INJECT": "decisions:0.02", "DASKPROBE_INJECT_LOG": str(spins)})
    decisions, more = added(base, pert, "scheduler_decisions")
    injected = 2 * 40 * 0.02  # two chains of 40 tasks, one worker choice each, 20 ms of CPU in each
    assert more > 0.8 * injected, (base["session_s"], pert["session_s"])
    # 20 ms of CPU may take longer on a busy host (CI once put 2.13 s here for 1.6 s of CPU): the
    # ceiling is the wall time the spins took, as the injection measured it
    walls = [float(line) for line in spins.read_text().split()]
    assert len(walls) >= 80, len(walls)
    holds(decisions, 0.75, more, injected, pert, most=1.3 * sum(walls) / injected)
    assert "scheduler-decisions" in finding_ids(pert), pert["findings"]


def test_a_scheduler_thread_holding_the_gil_goes_to_gil_contention(tmp_path):
    from daskprobe.probes.ebpf import environment_problem
    if why := environment_problem():
        pytest.skip(why)
    base = summary(tmp_path, "base", "chain", "--probes", "proxy,pyspy,offcpu,gil")
    pert = summary(tmp_path, "hog", "chain", "--probes", "proxy,pyspy,offcpu,gil", *preload(),
                   env={"DASKPROBE_INJECT": "gil-c:0.03"})
    gil, more = added(base, pert, "gil_contention")
    assert more > 0.3, (base["session_s"], pert["session_s"])
    assert gil >= 0.7 * more, (gil, more, pert["critical_path_s"])
    found = {f["id"]: f for f in pert["findings"]}
    assert "'busy-plugin' of scheduler, in _hold" in found["gil-contention"]["evidence"], pert["findings"]


def test_client_work_between_computations_is_the_clients(tmp_path):
    base = summary(tmp_path, "base", "chain", "--probes", "proxy")
    pert = summary(tmp_path, "think", "chain", "--probes", "proxy", env={"THINK_S": "2"})
    client, more = added(base, pert, "client")
    assert [len(s["jobs"]) for s in (base, pert)] == [2, 2], "two computations, two jobs"
    assert more > 1.5, (base["session_s"], pert["session_s"])
    holds(client, 0.9, more, 2.0, pert)
    assert finding_ids(pert)[0] == "client", pert["findings"]


def test_known_compute_is_found_on_the_critical_path(tmp_path):
    s = summary(tmp_path, "sleep", "chain", "--probes", "proxy", env={"TASK_S": "0.05"})
    # each task sleeps 50 ms: no less, and a loaded machine wakes a sleeper late (a few ms per task)
    assert 0.98 * 2 * 40 * 0.05 <= s["critical_path_s"]["compute"] <= 1.15 * 2 * 40 * 0.05
