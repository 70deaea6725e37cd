"""The client hook's pipe as daskprobe reads it (probes/client_hook: Channel): the command's reports are
plain JSON lines with caps; and the words said of an own cluster (tracer/capture/own_cluster.py)."""

from __future__ import annotations

import json
import os

from daskprobe.probes.client_hook import HOOK_DIR, MAX_LINE, MAX_REPORTS, Channel
from daskprobe.probes.client_hook.daskprobe_hook import ENV_PIPE, ENV_SCHEDULER
from daskprobe.tracer.capture import own_cluster
from daskprobe.tracer.capture.cluster import ClusterSpec


def _write(channel: Channel, data: bytes) -> None:
    os.write(channel.pass_fds[0], data)


def test_reports_are_whole_json_lines():
    c = Channel()
    try:
        _write(c, b'{"kind": "own-cluster", "via": "LocalCluster"}\n{"kind": "sc')
        assert c.read() == [{"kind": "own-cluster", "via": "LocalCluster"}]
        _write(c, b'ale", "n": 4}\n')
        assert c.read() == [{"kind": "scale", "n": 4}] and c.reports == 2 and c.dropped == 0
    finally:
        c.close()


def test_what_is_not_a_report_is_counted_never_parsed_whole():
    c = Channel()
    try:
        bad = [b"not json", b"[1, 2]", b'{"no": "kind"}', b'{"kind": 3}', b"[" * 3000 + b"]" * 3000,
               b'{"kind": "x", "pad": "' + b"a" * MAX_LINE + b'"}']
        _write(c, b"\n".join(bad) + b"\n")
        assert c.read() == [] and c.dropped == len(bad) and c.reports == 0
    finally:
        c.close()


def test_a_line_longer_than_the_cap_is_dropped_before_its_end():
    c = Channel()
    try:
        _write(c, b"x" * (MAX_LINE + 10))  # no newline yet: not kept growing
        assert c.read() == [] and c.dropped == 1
    finally:
        c.close()


def test_reports_past_the_cap_are_dropped():
    c = Channel()
    try:
        _write(c, b"".join(json.dumps({"kind": "k", "i": i}).encode() + b"\n" for i in range(MAX_REPORTS + 5)))
        assert [r["i"] for r in c.read()] == list(range(MAX_REPORTS)) and c.dropped == 5
    finally:
        c.close()


def test_the_end_of_the_pipe_is_seen_once_the_writers_are_gone():
    c = Channel()
    c.started()  # our write end closed: no one else holds it
    assert c.read() == [] and not c.open
    assert c.read() == []
    c.close()


def test_the_commands_environment_has_the_hook_first_and_the_pipe():
    c = Channel()
    try:
        env = c.env({"PYTHONPATH": "/theirs", "X": "1"}, "tcp://127.0.0.1:1234")
        assert env["PYTHONPATH"] == f"{HOOK_DIR}{os.pathsep}/theirs" and env["X"] == "1"
        fd, inode = env[ENV_PIPE].split(":")
        assert int(fd) == c.pass_fds[0] and int(inode) == os.fstat(c.fileno()).st_ino
        assert env[ENV_SCHEDULER] == "tcp://127.0.0.1:1234"
        assert c.env({})["PYTHONPATH"] == str(HOOK_DIR)
    finally:
        c.close()


def test_what_differs_from_the_local_cluster_asked_for_and_the_options_that_match():
    spec = ClusterSpec(workers=2, threads=1)
    asked = {"n_workers": "4", "threads_per_worker": "2", "dashboard_address": "':9999'"}
    auto = spec.memory_limit() * 2 // 4  # LocalCluster's "auto" for 4 workers: what --workers 4 gives too
    shape = {"workers": 4, "threads": 2, "processes": True, "memory_limit": auto}
    differs = own_cluster._differs(shape, spec, asked, ["dashboard_address"])
    assert differs == ["4 worker(s)", "2 thread(s) each", "its workers under nannies (as LocalCluster's processes)",
                       "dashboard_address=':9999' (ignored)"]
    assert own_cluster._match(shape, spec, ["python", "my flow.py"], asked) == \
        "daskprobe run --workers 4 --threads 2 --nanny -- python 'my flow.py'"
    # a memory limit of its own: said, and matched by --memory-limit (0: none)
    small, mine = {**shape, "memory_limit": 2**30}, {**asked, "memory_limit": "'1GiB'"}
    assert own_cluster._differs(small, spec, mine, [])[-1] == "1.0 GiB per worker"
    assert own_cluster._match(small, spec, ["x"], mine) == "daskprobe run --workers 4 --threads 2 --nanny " \
        "--memory-limit 1073741824 -- x"
    unlimited = {**shape, "memory_limit": None}
    assert own_cluster._differs(unlimited, spec, mine, [])[-1] == "no memory limit per worker"
    assert own_cluster._match(unlimited, spec, ["x"], mine).endswith("--memory-limit 0 -- x")
    given = ClusterSpec(workers=4, threads=2, nanny=True, memory=2**30)
    assert own_cluster._differs(small, given, mine, []) == [] and own_cluster._match(small, given, ["x"], mine) is None
    same = {"workers": 2, "threads": 1, "processes": True, "memory_limit": spec.memory_limit()}
    nanny = ClusterSpec(workers=2, threads=1, nanny=True)
    assert own_cluster._differs(same, nanny, {}, []) == [] and own_cluster._match(same, nanny, ["x"], {}) is None


def test_memory_limit_option_reads_sizes_as_dask_writes_them():
    import argparse

    import pytest

    from daskprobe.tracer.commands.options import byte_size
    assert [byte_size(t) for t in ("4GB", "4 GiB", "4e9", "0", "1.5kb", "512MiB")] == \
        [4 * 10**9, 4 * 2**30, 4 * 10**9, 0, 1500, 512 * 2**20]
    for bad in ("", "4 GX", "-1GB", "lots", "2PiB", "1e400"):
        with pytest.raises(argparse.ArgumentTypeError):
            byte_size(bad)
    assert ClusterSpec(workers=2, memory=0).memory_limit() == 0
    assert ClusterSpec(workers=2, memory=5 * 2**30).memory_limit() == 5 * 2**30


def test_a_reported_shape_is_shown_only_if_every_field_fits():
    good = {"workers": 1, "threads": 2, "processes": False, "memory_limit": None}
    assert own_cluster._shape(good) == good
    for bad in ({**good, "workers": "1"}, {**good, "workers": True}, {**good, "processes": 1},
                {**good, "memory_limit": -5}, {**good, "threads": 10**9}, [good], None):
        assert own_cluster._shape(bad) is None, bad
    assert own_cluster._text("a\x1b[2Jb" + "c" * 100, 20) == "a?[2Jbccccccccccc..."


def test_any_report_the_command_sends_is_said_safely_or_not_at_all(tmp_path, capsys):
    """The command is another user's process: whatever it writes, daskprobe neither fails nor prints its
    control characters; well-formed reports land in run.json."""
    from daskprobe.probes.rundir import RunDir
    from daskprobe.tracer.capture.client_hook import Listener
    listener = Listener(RunDir.create(str(tmp_path / "run"), ["x"]), ClusterSpec(workers=2, threads=1), ["x"])
    reports = [
        {"kind": "own-cluster", "routed": True, "via": "LocalCluster\x1b[31m", "asked": {"n_workers": "3"},
         "shape": {"workers": 3, "threads": 1, "processes": True, "memory_limit": None}, "ignored": [[1], 2, None]},
        {"kind": "own-cluster", "routed": True, "via": ["x"], "asked": [1], "shape": {"workers": "many"}},
        {"kind": "own-cluster", "asked": {"a" * 500: {"b": 1}}, "ignored": "n_workers"},
        {"kind": "scale", "n": 10**30}, {"kind": "scale", "adapt": {"minimum": "1"}}, {"kind": "scale", "n": -1},
        {"kind": "hook-error", "what": {"x": 1}, "error": "e" * 1000}, {"kind": "unknown to daskprobe"},
    ]
    with os.fdopen(os.dup(listener.channel.pass_fds[0]), "wb") as w:
        w.write(b"".join(json.dumps(r).encode() + b"\n" for r in reports))
    listener.channel.started()
    listener.ended()
    err = capsys.readouterr().err
    assert "\x1b" not in err and "not understood" not in err, err
    assert "LocalCluster?[31m(n_workers=3) runs on daskprobe's cluster" in err
    meta = listener.run.meta()
    assert len(meta["own_clusters"]) == 6 and meta["client_hook"]["reports"] == len(reports)
    assert len(meta["client_hook"]["errors"][0]["error"]) == 500
