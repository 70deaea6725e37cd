"""Who runs the cluster, and handing a finished run directory to its user without following links."""

from __future__ import annotations

import os
import pwd

import pytest

from daskprobe.probes import users


def test_the_cluster_runs_as_the_user_who_ran_sudo(monkeypatch):
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setenv("SUDO_UID", str(nobody.pw_uid))
    assert users.cluster_user().uid == (nobody.pw_uid if os.geteuid() == 0 else os.geteuid())
    monkeypatch.setenv("SUDO_UID", "0")  # sudo from root is root: not a user to hand the cluster to
    assert users.invoking() is None if os.geteuid() == 0 else users.invoking().uid == os.geteuid()


def test_never_root(monkeypatch):
    with pytest.raises(ValueError, match="never"):
        users.cluster_user("root")
    with pytest.raises(ValueError, match="no such user"):
        users.cluster_user("no-such-user-here")


def test_a_user_gets_its_own_home_and_name_in_the_environment():
    u = users.User(12345, 12345, "alice", "/home/alice")
    env = u.env({"HOME": "/root", "USER": "root", "PATH": "/bin"})
    assert env == {"HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice", "PATH": "/bin"}
    assert u.popen() == {"user": 12345, "group": 12345, "extra_groups": []}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_hand_over_makes_the_run_private_to_its_user_and_follows_no_link(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "tables").mkdir(parents=True, mode=0o755)
    (run / "tables" / "t.parquet").write_bytes(b"x")
    (run / "tables" / "t.parquet").chmod(0o644)
    outside.write_text("root's")
    outside.chmod(0o644)
    (run / "planted").symlink_to(outside)
    os.mkfifo(run / "fifo")  # never opened: hand_over would hang on it
    u = users.User(54321, 54321, "u", "/")
    users.hand_over(run, u)
    for p in [run, run / "tables", run / "tables" / "t.parquet"]:
        st = os.lstat(p)
        assert (st.st_uid, st.st_gid) == (54321, 54321), p
        assert st.st_mode & 0o077 == 0, p
    assert os.lstat(run / "fifo").st_uid == 54321  # inside a directory only its owner may enter
    assert os.lstat(run / "planted").st_uid == 54321  # the link itself, never what it points to
    st = os.stat(outside)
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)
