"""Where a run directory may be made (nowhere another user could swap it for a symlink), and how its
files are written (whole, or not at all)."""

import os

import pytest

from daskprobe.probes.rundir import RunDir, open_whole

NOBODY = 65534


def test_a_group_writable_parent_of_ours_is_fine(tmp_path):  # umask 002, the default on many systems
    (tmp_path / "runs").mkdir(mode=0o775)
    os.chmod(tmp_path / "runs", 0o775)
    run = RunDir.create(str(tmp_path / "runs" / "a"), ["x"])
    assert (run / "captures").is_dir()


def test_a_parent_anyone_may_write_without_the_sticky_bit_is_refused_before_anything_is_made(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(PermissionError, match="anyone may write"):
        RunDir.create(str(open_dir / "deeper" / "run"), ["x"])
    assert not (open_dir / "deeper").exists()
    os.chmod(open_dir, 0o1777)  # sticky, as /tmp: others cannot move what is ours
    assert RunDir.create(str(open_dir / "run"), ["x"]).path.is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_another_users_directory_or_symlink_is_refused_but_the_sudo_user_is_trusted(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    monkeypatch.delenv("SUDO_UID", raising=False)
    with pytest.raises(PermissionError, match="another user"):
        RunDir.create(str(theirs / "run"), ["x"])
    link = tmp_path / "link"
    (tmp_path / "ours").mkdir()
    link.symlink_to(tmp_path / "ours")
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match="symlink another user owns"):
        RunDir.create(str(link / "run"), ["x"])
    monkeypatch.setenv("SUDO_UID", str(NOBODY))  # root through sudo, in that user's own checkout
    run = RunDir.create(str(theirs / "run"), ["x"])
    assert run.path.is_dir() and run.path == theirs.resolve() / "run"


def test_a_file_interrupted_while_written_leaves_no_part_and_no_stale_copy(tmp_path):
    path = tmp_path / "trace.pftrace"
    path.write_bytes(b"an older build's")
    with pytest.raises(KeyboardInterrupt):
        with open_whole(path) as f:
            f.write(b"half")
            raise KeyboardInterrupt
    assert sorted(tmp_path.iterdir()) == [], "neither the part nor the older file"
    with open_whole(path) as f:
        f.write(b"whole")
    assert path.read_bytes() == b"whole" and sorted(tmp_path.iterdir()) == [path]


def test_run_json_keeps_its_last_whole_version_and_symlinks_are_replaced_not_followed(tmp_path):
    run = RunDir(tmp_path)
    run.update_meta(exit_code=1)
    with pytest.raises(KeyboardInterrupt):  # run.json is rewritten as update_meta does it: not fresh
        with open_whole(tmp_path / "run.json", fresh=False) as f:
            f.write(b"{")
            raise KeyboardInterrupt
    assert run.meta() == {"exit_code": 1}
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "report.html").symlink_to(victim)
    (tmp_path / "report.html.partial").symlink_to(victim)
    run.write_file("report.html", "<html>")
    assert victim.read_text() == "precious" and (tmp_path / "report.html").read_text() == "<html>"



def test_runs_started_at_once_get_directories_of_their_own_named_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as pool:  # at once, as two `daskprobe run` started together
        at_once = list(pool.map(lambda _: RunDir.create(None, ["python", "flow.py"]).path, range(12)))
    serial = [RunDir.create(None, ["python", "flow.py"]).path for _ in range(12)]  # many in one second
    made = at_once + serial
    assert len(set(made)) == len(made), "each run a directory of its own"
    assert all(p.parent == tmp_path / "runs" and (p / "captures").is_dir() for p in made)
    assert sorted(serial) == serial, "names sort in the order the runs started"
    assert len({p.name[:15] for p in serial}) < len(serial), "the test made no two in one second"
