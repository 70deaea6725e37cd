"""Who runs what: root runs only the probes; the cluster daskprobe starts and the user's command run
as an unprivileged user. A Dask cluster runs code for anyone who can reach it, and a Dask client
unpickles what the cluster sends: as root, either would hand root to whoever reaches the cluster."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEDICATED = "daskprobe"  # the user a root daskprobe runs the cluster as when no one ran it through sudo


@dataclass(frozen=True)
class User:
    uid: int
    gid: int
    name: str
    home: str
    groups: tuple[int, ...] = ()

    @property
    def is_us(self) -> bool:
        return self.uid == os.geteuid()

    def popen(self) -> dict:
        """subprocess.Popen's arguments that start a process as this user (none when it is us)."""
        if self.is_us:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def env(self, env: dict[str, str]) -> dict[str, str]:
        """`env` as this user's login sets it: root's HOME would be unreadable to it."""
        if self.is_us:
            return env
        return env | {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def of(entry: pwd.struct_passwd) -> User:
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    return User(entry.pw_uid, entry.pw_gid, entry.pw_name, entry.pw_dir, groups)


def invoking() -> User | None:
    """The user who ran daskprobe through sudo (SUDO_UID), else whoever runs it unless root."""
    sudo = os.environ.get("SUDO_UID", "")
    uid = int(sudo) if sudo.isdigit() and int(sudo) != 0 else os.geteuid()
    if uid == 0:
        return None
    try:
        return of(pwd.getpwuid(uid))
    except KeyError:
        return User(uid, os.getegid() if uid == os.geteuid() else uid, str(uid), "/")


def cluster_user(name: str | None = None) -> User:
    """Who runs the cluster and the command: `name` (--user), else the invoking user, else (root with no
    sudo) the dedicated user, made once as a system user with no login and no home."""
    if name is not None:
        try:
            user = of(pwd.getpwnam(name) if not name.isdigit() else pwd.getpwuid(int(name)))
        except KeyError:
            raise ValueError(f"--user {name}: no such user") from None
        if user.uid == 0:
            raise ValueError("--user root: daskprobe never runs a cluster as root (anyone who reaches a "
                             "Dask scheduler runs code as its user)")
        if not user.is_us and os.geteuid() != 0:
            raise ValueError(f"--user {name}: only root can run the cluster as another user")
        return user
    return invoking() or dedicated()


def dedicated() -> User:
    try:
        entry = pwd.getpwnam(DEDICATED)
    except KeyError:
        useradd = shutil.which("useradd")
        made = useradd and subprocess.run([useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent",
                                           "--shell", "/usr/sbin/nologin", DEDICATED],
                                          capture_output=True, text=True)
        if not made or made.returncode not in (0, 9):  # 9: made meanwhile by another run
            raise RuntimeError(f"cannot make the user {DEDICATED!r} to run the cluster as "
                               f"({made.stderr.strip() if made else 'no useradd'}): run daskprobe through sudo, "
                               "or give --user NAME")
        entry = pwd.getpwnam(DEDICATED)
    return of(entry)


def unreadable(user: User, dirs: list[str], paths: list[str]) -> list[str]:
    """Of `dirs` (the nearest existing one on the way to each) and of the files among `paths`, those
    `user` cannot enter or read."""
    if user.is_us:
        return []
    dirs = [next(str(d) for d in [Path(p).absolute(), *Path(p).absolute().parents] if d.exists()) for p in dirs]
    files = [os.path.abspath(p) for p in paths if os.path.isfile(p)]  # checked from /, not from here
    script = 'n=$1; shift; while [ $n -gt 0 ]; do cd "$1" 2>/dev/null || echo "$1"; shift; n=$((n-1)); done; ' \
             'for p; do [ -r "$p" ] || echo "$p"; done'
    out = subprocess.run(["/bin/sh", "-c", script, "sh", str(len(dirs)), *dirs, *files], capture_output=True,
                         text=True, cwd="/", **user.popen())
    return out.stdout.split("\n")[:-1]


def work_as_owner_of(path: Path) -> User | None:
    """Root working in a directory another user owns becomes that user first (None: nothing to do): root
    writing there would write through any link its owner plants, and reading there, it would put into
    that user's files what only root may read."""
    st = os.stat(path)
    if os.geteuid() != 0 or st.st_uid == 0:
        return None
    try:
        user = of(pwd.getpwuid(st.st_uid))
    except KeyError:
        user = User(st.st_uid, st.st_gid, str(st.st_uid), "/")
    os.setgroups(list(user.groups))
    os.setgid(user.gid)
    os.setuid(user.uid)
    os.environ.update(user.env({}))
    return user


def hand_over(path: Path, user: User | None) -> None:
    """Give a finished run directory to `user` (None: keep it ours), private to them: directories 0700,
    files 0600. Walked by directory fds (os.fwalk), nothing followed: a process of the cluster's user
    still running cannot swap a directory for a link to one of root's meanwhile."""
    uid, gid = (user.uid, user.gid) if user else (os.geteuid(), os.getegid())
    for _, dirs, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        for name in dirs + files:
            _own(name, uid, gid, dir_fd)
    _own(str(path), uid, gid, None)


def _own(name: str, uid: int, gid: int, dir_fd: int | None) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            return  # a link changes nothing; a FIFO or socket a member left in its scratch space stays as it is
        directory = stat.S_ISDIR(st.st_mode)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_DIRECTORY if directory else 0),
                     dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o700 if directory else 0o600 | (st.st_mode & 0o100))
        finally:
            os.close(fd)
    except OSError:  # gone meanwhile
        pass
