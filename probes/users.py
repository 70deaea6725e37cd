"""Who runs what: root runs only the probes; the cluster daskprobe starts and the user's command run
as an unprivileged user. A Dask cluster runs code for anyone who can reach it, and a Dask client
unpickles what the cluster sends: as root, either would hand root to whoever reaches the cluster."""

from __future__ import annotations

import os
import pwd
import shutil
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
    dirs = [next(str(d) for d in [Path(p), *Path(p).parents] if d.exists()) for p in dirs]
    files = [p for p in paths if os.path.isfile(p)]
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
    files 0600. Nothing is followed: a symlink planted inside is itself chowned, never its target."""
    uid, gid = (user.uid, user.gid) if user else (os.geteuid(), os.getegid())
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            _own(os.path.join(root, name), uid, gid)
    _own(str(path), uid, gid)


def _own(p: str, uid: int, gid: int) -> None:
    try:
        st = os.lstat(p)
        if st.st_uid != uid or st.st_gid != gid:
            os.lchown(p, uid, gid)
        if not os.path.islink(p):
            mode = 0o700 if os.path.isdir(p) else 0o600 | (st.st_mode & 0o100)
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_DIRECTORY if mode == 0o700 else 0))
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
    except OSError:  # gone meanwhile, or a FIFO a member left in its scratch space
        pass
