"""tls://, ws:// and ucx:// runs: the comm tap inside Dask's processes records the messages the proxy cannot
read. The same workload on tcp:// through the proxy and on the others through the comm tap gives the same
messages."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from daskprobe.probes.proxy_capture import read_capture, read_status
from daskprobe.probes.rundir import RunDir

from helpers import NO_UCX, PINNED_FLOW, UCX_PYTHON, daskprobe, run_flow, searchable_dir, write_flow

N = 20
# Sent on a timer (heartbeat_worker every 0.5-1 s and the scheduler's reply to each), not for the
# workload: their count follows how long the run took, which TLS's handshakes and a loaded machine change.
TIMED = {"heartbeat_worker"}
# Told the client once per key, and again for some when a replica was added (the final sum fetched them):
# how many, the race of that fetch with the client's release decides. Compared by the keys told.
REPEATED = {"key-in-memory"}
# A worker drops a key when told free-keys, or remove-replicas when the final sum's fetch left the key on two
# workers and the scheduler trimmed the copy before the client's release came (the same race; seen on tls and
# ws). Which of the two tells it, that race decides; how many keys are dropped, it does not. Compared by keys.
DROPS = {"free-keys", "remove-replicas"}
# Sent while the cluster stops (the scheduler's goodbye to a worker that is closing its end meanwhile): it
# reaches the worker's comm or not, a race of the shutdown (seen either way on both).
TEARDOWN = {"remove-worker"}
# One each way per connection, and how many connections Dask opens follows how many RPCs overlapped (its
# pool opens another while one is busy): timing. Present between the same roles on both.
PER_CONNECTION = {"handshake"}


PROTOCOLS = ["tls", "ws", "ucx"]


@pytest.fixture(scope="module")
def tcp():
    run, _ = run_flow(searchable_dir("comm-tap-tcp"), PINNED_FLOW.format(n=N), "--workers", "2", "--probes", "proxy",
                      "--no-trace")
    return run


@pytest.fixture(scope="module", params=PROTOCOLS)
def other(request):
    """A run of the same workload on another protocol, and its process."""
    python = sys.executable
    if request.param == "ucx":
        if not UCX_PYTHON or os.geteuid():
            pytest.skip(f"ucx:// needs root and distributed-ucxx ({NO_UCX})")
        python = UCX_PYTHON
    return run_flow(searchable_dir(f"comm-tap-{request.param}"), PINNED_FLOW.format(n=N), "--workers", "2", "--probes",
                    "proxy", "--no-trace", "--protocol", request.param, "--python", python, python=python)


def _counts(run) -> pd.Series:
    m = run.table("messages")
    timed_replies = m.reply_to.isin(m.msg_id[m.op.isin(TIMED)])
    kept = m[~m.op.isin(TIMED | REPEATED | DROPS | TEARDOWN | PER_CONNECTION) & ~timed_replies]
    return kept.groupby(["src_role", "dst_role", "op"]).size()


def _dropped(run) -> pd.Series:
    m = run.table("messages")
    return m[m.op.isin(DROPS)].groupby(["src_role", "dst_role"]).n_keys.sum()


def test_run_is_on_its_protocol_with_the_comm_tap(other):
    tls, p = other
    meta, protocol = tls.meta(), tls.meta()["cluster"]["protocol"]
    assert meta["scheduler_address"].startswith(f"{protocol}://") and protocol in PROTOCOLS
    assert "comm tap" in p.stderr
    assert not tls.proxy_capture.exists() and tls.messages_capture == tls.comm_capture
    assert read_status(tls.comm_capture)["state"] == "ended"
    cap = read_capture(tls.comm_capture)
    assert cap.torn_bytes == 0 and len(cap.malformed) == 0
    # every member's log says it listened on that protocol
    for name in ("scheduler", "worker-0", "worker-1"):
        assert f"{protocol}://127.0.0.1:" in tls.log(name).read_text()


def test_messages_match_tcp(tcp, other):
    """Every op the workload causes, counted per sender and receiver role, is the same on both: exactly, since
    both see every message of the run once (the proxy at the listener's door, the comm tap at the
    listener's comm). The tolerance is nil but for ops whose count the run's timing decides: the timed
    heartbeats and their replies (a short run may have none), key-in-memory told again (each key told on both),
    free-keys and remove-replicas (the keys dropped counted instead), remove-worker at the end (at most one per
    worker), and the handshakes of connections opened (between the same roles on both)."""
    tls, _ = other
    a, b = _counts(tcp), _counts(tls)
    pd.testing.assert_series_equal(a, b, check_names=False)
    pd.testing.assert_series_equal(_dropped(tcp), _dropped(tls), check_names=False)
    assert _dropped(tcp).loc[("scheduler", "worker")] >= N + 1
    told, shook = [], []
    for run in (tcp, tls):
        m = run.table("messages")
        shook.append(set(map(tuple, m[m.op == "handshake"][["src_role", "dst_role"]].to_numpy())))
        told.append(set(m.key[m.op == "key-in-memory"]))
        assert (m.op == "remove-worker").sum() <= 2
    assert shook[0] == shook[1]
    assert len(told[0]) == len(told[1]) == N + 1  # the keys are named afresh each run (tokens of __main__'s inc)
    assert (_counts(tls).loc[("scheduler", "worker", "compute-task")]) == N + 1


def test_network_time_and_critical_path(other):
    tls, _ = other
    s = json.loads((tls / "summary.json").read_text())
    assert s["critical_path_s"]["network"] > 0
    assert any(k.startswith("network: compute-task") for k in s["critical_path_parts_s"])
    conns = tls.table("connections")
    # the peers are named from the comm tap's own records of who connected (a client has none)
    assert set(conns.peer) >= {"worker-0", "worker-1", "client"}
    attempts = tls.table("attempts")
    assert len(attempts) == N + 1 and (attempts.outcome == "finished").all()


def test_ucx_without_distributed_ucxx_is_refused_before_anything_starts(tmp_path):
    """daskprobe's own Python has no distributed-ucxx (it pins another dask): said at once, nothing started."""
    out = tmp_path / "run"
    p = daskprobe("run", "--protocol", "ucx", "--out", str(out), "--", sys.executable, "-c", "print('ran')", timeout=60)
    assert p.returncode != 0 and "ran" not in p.stdout
    why = "needs distributed-ucxx in the cluster's Python" if os.geteuid() == 0 else "needs root"
    assert why in p.stderr, p.stderr
    assert not out.exists()


def test_a_member_slow_to_exit_loses_none_of_its_records(tmp_path):
    """The comm tap writes a process's last records at its exit, after Dask logged its end: a scheduler whose
    exit takes a second more (an exit handler of another preload, run first) still ends its file whole."""
    slow = tmp_path / "slow_exit.py"
    slow.write_text("import atexit, time\natexit.register(time.sleep, 1.5)\n")
    slow.chmod(0o644)
    run, p = run_flow(tmp_path, PINNED_FLOW.format(n=4), "--workers", "2", "--probes", "comm", "--no-trace",
                      "--config", f"distributed.scheduler.preload={slow}")
    assert "comm tap:" not in p.stderr, p.stderr[-2000:]
    assert read_status(run.comm_capture)["state"] == "ended"


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.skipif(os.geteuid() != 0, reason="runs daskprobe as the user nobody")
def test_default_without_root_records_inside_the_comms_what_the_proxy_does(tcp):
    """Without root (no tap) the default records the messages with the comm tap, not the proxy in their path: it
    says so, and gets the same messages per op as the proxy's run of the same flow (as test_messages_match_tcp)."""
    tmp = searchable_dir("comm-tap-not-root")
    out, flow = tmp / "run", write_flow(tmp / "flow.py", PINNED_FLOW.format(n=N))
    p = subprocess.run([*NOBODY, sys.executable, "-m", "daskprobe.tracer.commands", "run", "--workers", "2",
                        "--no-trace", "--out", str(out), "--", sys.executable, str(flow)],
                       capture_output=True, text=True, timeout=240, env=dict(os.environ, HOME=str(tmp)), cwd=tmp)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "messages inside Dask's comms: the comm tap, as the tap needs root" in p.stderr
    run = RunDir(out)
    assert run.messages_capture == run.comm_capture and not run.proxy_capture.exists()
    assert read_status(run.comm_capture)["state"] == "ended" and run.meta()["partial"] is False
    pd.testing.assert_series_equal(_counts(tcp), _counts(run), check_names=False)
