"""Captures of stock distributed 2.16 (legacy framing, no handshake), recorded once."""

import shutil

from helpers import DATA, daskprobe
from daskprobe.probes.rundir import RunDir


def test_legacy_capture_decodes(tmp_path):
    run = RunDir(tmp_path / "r216")
    shutil.copytree(DATA / "distributed-2.16", run.path)
    (run / "captures").mkdir()
    shutil.move(run / "proxy.bin", run.proxy_capture)
    p = daskprobe("build", str(run.path))
    assert p.returncode == 0, p.stderr
    assert run.meta()["capture"]["malformed_streams"] == 0
    m = run.table("messages")
    assert (m.op == "handshake").sum() == 0, "2.16 has no handshake"
    assert m.error.isna().all()
    assert ((m.src_role == "scheduler") & (m.op == "compute-task")).sum() == 21
    assert ((m.src_role == "worker") & (m.dst_role == "scheduler") & (m.op == "task-finished")).sum() == 21
    assert ((m.src_role == "worker") & (m.dst_role == "worker") & (m.op == "get_data")).sum() >= 1
    t = run.table("attempts")
    assert len(t) == 21 and (t.outcome == "finished").all(), "results matched to dispatches without run_id"
    assert t.compute_stop_ns.notna().all()
    assert t.key.str.startswith(("inc-", "sum-")).all()
