"""Messages between hosts seen at both ends (the recorder's tap and an agent's): one capture of
them, the other host's clock set by the messages, each message timed from the sender's host to the
receiver's. Ground truth: the send and arrival times and the clock error the captures are built with."""

import io

import numpy as np
import pandas as pd

from daskprobe.probes.proxy_capture import DROPS, GAP, OPEN, PEER, CaptureWriter, losses, read_capture
from daskprobe.probes.rundir import RunDir
from daskprobe.probes.schema import HOST_PID
from daskprobe.tracer.decode.both_ends import align, clocks, consistent, merged

T0 = 5_000_000_000
SCHED, WORKER = "10.0.0.1:8786", "10.0.0.2:4001"
OUT = "10.0.0.2:40000"  # the worker's end of its connection to the scheduler


def _capture(path, messages, peer_pid):
    with open(path, "wb") as f:
        w = CaptureWriter(io.BufferedWriter(f))
        w.record(OPEN, conn=1, opened_ns=T0, label="scheduler", listen=SCHED, peer_addr=OUT, upstream=SCHED,
                 upstream_local="")
        w.record(PEER, conn=1, peer_pid=peer_pid)
        for d, t_first, latency, op in messages:
            w.message(1, d, t_first, {"op": op, "n": len(op)}, opaque=len(op) % 3, latency_ns=latency)
        w.f.flush()


def test_each_message_is_timed_from_its_senders_host_to_its_receivers_on_a_clock_set_by_them(tmp_path):
    rng = np.random.default_rng(1)
    error = 3_456_789  # what the round trips left of the worker's clock: its times read this much late
    wire = rng.integers(80_000, 400_000, 60)  # ns from a message's first byte leaving to its first arriving
    sent = T0 + np.cumsum(rng.integers(1_000_000, 5_000_000, 60))
    ops = [f"op{i % 7}" * (1 + i % 4) for i in range(60)]
    directions = rng.integers(0, 2, 60)
    # the scheduler's host: it sends direction 1 and receives 0; the worker's host, the other way round
    here = [(d, int(s if d else s + w), 20_000, op) for d, s, w, op in zip(directions, sent, wire, ops)]
    there = [(d, int((s + w if d else s) + error), 20_000, op) for d, s, w, op in zip(directions, sent, wire, ops)]
    run = RunDir(tmp_path / "run")
    (run / "captures").mkdir(parents=True)
    (run / "hosts" / "10.0.0.2" / "captures").mkdir(parents=True)
    _capture(run.tap_capture, here, -1)
    _capture(run / "hosts" / "10.0.0.2" / "captures" / "tap.bin", there[5:], 77)  # its tap joined later
    procs = pd.DataFrame({"name": ["scheduler", "worker-0"], "host": ["local", "10.0.0.2"], "listen": [SCHED, WORKER]})
    hosts = {"10.0.0.2": {"number": 1, "offset_ns": 0, "uncertainty_ns": 10_000_000}}

    cap = merged(run, read_capture(run.tap_capture), procs, hosts)

    assert len(cap.connections) == 1 and cap.connections.peer_pid[0] == HOST_PID + 77  # its pid on its host
    assert len(cap.messages) == 60, "each message once"
    h = hosts["10.0.0.2"]
    assert abs(h["offset_ns"] + error) <= h["uncertainty_ns"] < 400_000, h  # within the quickest round trip
    m = cap.messages.sort_values("t_first_ns", kind="stable")
    both = m[m.both_ends]
    assert len(both) == 55, "the 5 before its tap joined were seen at one end only"
    took = (both.t_last_ns - both.t_first_ns).to_numpy()
    truth = wire[5:] + 20_000
    assert (took >= 0).all(), "none arrives before it left"
    assert np.abs(took - truth).max() <= 2 * h["uncertainty_ns"]


def test_views_that_started_apart_line_up_where_their_sizes_agree():
    sizes = np.array([10, 20, 10, 30, 10, 10, 40, 50, 10, 20])
    t = np.arange(10) * 1_000_000
    i, j = align(sizes, t, sizes[4:], t[4:] + 300)
    assert list(i) == list(range(4, 10)) and list(j) == list(range(6))
    i, j = align(sizes[4:], t[4:], sizes, t)
    assert list(i) == list(range(6)) and list(j) == list(range(4, 10))
    beats = np.full(10, 64)  # all the same size: told apart by time
    i, j = align(beats, t, beats[3:], t[3:] + 100)
    assert list(i) == list(range(3, 10))
    assert not len(align(sizes, t, np.array([7, 8, 9]), t[:3])[0]), "no stream of its own"


def test_a_cycle_of_hosts_keeps_every_link_causal():
    # a <-> b, a <-> c, b <-> c: the b-c link's own quickest messages disagree with the tree's midpoints
    quickest = {("local", "b"): 100, ("b", "local"): 300, ("local", "c"): 200, ("c", "local"): 200,
                ("b", "c"): 10, ("c", "b"): 500}
    c = clocks({k: np.array([v, v + 50]) for k, v in quickest.items()})
    corr = {"local": 0, **{n: v["correction"] for n, v in c.items()}}
    for (x, y), d in quickest.items():
        assert d + corr[y] - corr[x] >= 0, (x, y, corr)
    # half the quickest round trip to the recorder's host (200), and each moved 45 to hold the b-c link
    assert c["b"]["uncertainty"] == c["c"]["uncertainty"] == 245, c


def test_a_stamp_that_cannot_be_is_set_aside_not_believed():
    rng = np.random.default_rng(3)
    error = 40_000  # the other host's clock reads 40 us late
    xy = 50_000 + rng.integers(0, 30_000, 500) + error  # true one-way times of 50-80 us
    yx = 50_000 + rng.integers(0, 30_000, 500) - error
    xy[17] = -30_000  # one stamp taken by a clock read cut in two: 120 us early
    assert consistent(xy, yx)[2] == 1
    c = clocks({("local", "h"): xy, ("h", "local"): yx})["h"]
    assert abs(c["correction"] + error) <= c["uncertainty"] < 60_000, c
    assert c["set_aside"] == 1
    assert consistent(np.array([-900, -800]), np.array([100, 200])) is None, "more than 1% wrong: no estimate"


def test_what_an_agents_tap_lost_is_in_the_merged_capture(tmp_path):
    run = RunDir(tmp_path / "run")
    (run / "captures").mkdir(parents=True)
    theirs = run / "hosts" / "10.0.0.2" / "captures" / "tap.bin"
    theirs.parent.mkdir(parents=True)
    messages = [(0, T0 + 1_000_000 * i, 20_000, f"op{i}") for i in range(5)]
    _capture(run.tap_capture, messages, -1)
    _capture(theirs, messages, 77)
    with open(theirs, "ab") as f:  # the worker's host's tap lost 3 packets, 4,000 bytes of the connection
        w = CaptureWriter(f)
        w.record(DROPS, t_ns=T0 + 6_000_000, packets=3)
        w.record(GAP, conn=1, direction=1, t_ns=T0 + 6_000_000, offset=100, bytes=4000)
    procs = pd.DataFrame({"name": ["scheduler", "worker-0"], "host": ["local", "10.0.0.2"], "listen": [SCHED, WORKER]})
    hosts = {"10.0.0.2": {"number": 1, "offset_ns": 0, "uncertainty_ns": 10_000_000}}
    cap = merged(run, read_capture(run.tap_capture), procs, hosts)
    lost = losses(cap, None)
    assert lost["packets_dropped"] == 3 and lost["gaps"] == 0  # the connection's gap is the other view's: this one saw its bytes
