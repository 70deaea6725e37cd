"""Dask's local schedulers, as the client hook recorded them (client_hook/daskprobe_hook_local_scheduler.py
writes the capture and defines it, LINES): the copy of the command's files into the run directory,
and their reader, into tables local_jobs and local_tasks.

The command's processes write into a directory of their user's, which may be another user than
daskprobe (root): each file there is opened without following a link, only if it is a regular file of
that user's, and read up to MAX_BYTES; what it holds is text, parsed field by field."""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from .base import as_int, capture_lines
from .client_hook.daskprobe_hook_local_scheduler import ENV_DIR, LINES, PREFIX, SUFFIX
from .rundir import open_new

if TYPE_CHECKING:  # imported by read_local: starting a run needs no pandas
    import pandas as pd

MAX_BYTES = 1 << 30  # per file: about 10 million tasks
MAX_FILES = 4096     # the command's processes that used dask
_FIELDS = {kind: [f.split(":") for f in spec.split()] for kind, (spec, _) in LINES.items()}
JOB_COLUMNS = ["job", "pid", "tid", "local", "start_ns", "end_ns", "errored", "graph_tasks"]
TASK_COLUMNS = ["job", "key", "deps", "pid", "tid", "sent_ns", "done_ns", "worker_id", "exec_pid", "exec_tid",
                "ident", "enter_ns", "loaded_ns", "computed_ns", "exit_ns", "failed"]


def collect(src: Path, captures: Path, uid: int | None = None) -> list[str]:
    """Copy the command's capture files from `src` (a directory of its user's, `uid`; None: ours) into
    `captures`; what was refused or cut ("NAME: why")."""
    said = []
    try:
        dir_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        return [f"{src}: {e.strerror}"] if e.errno != 2 else []
    try:
        names = sorted(n for n in os.listdir(dir_fd) if n.startswith(PREFIX) and n.endswith(SUFFIX))
        for name in names[:MAX_FILES]:
            if why := _copy(dir_fd, name, captures / name, os.geteuid() if uid is None else uid):
                said.append(f"{name}: {why}")
        said += [f"{len(names) - MAX_FILES} more files: not read"] if len(names) > MAX_FILES else []
    finally:
        os.close(dir_fd)
    return said


def _copy(dir_fd: int, name: str, dest: Path, uid: int) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        return e.strerror
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
            return "not a regular file of the command's user: not read"
        with open(fd, "rb", closefd=False) as f, open_new(dest) as out:
            data = f.read(MAX_BYTES)
            out.write(data[:data.rfind(b"\n") + 1] if len(data) == MAX_BYTES else data)
        return f"cut at {MAX_BYTES} bytes" if st.st_size > MAX_BYTES else None
    finally:
        os.close(fd)


def files(captures: Path) -> list[Path]:
    return sorted(captures.glob(f"{PREFIX}*{SUFFIX}"))


def read_local(paths: list[Path], malformed: Counter | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(local_jobs, local_tasks) from the hook's files. Jobs are numbered in the order they began, over
    all processes. A task's row joins its dispatch (P) with the pool's run of it (X: the latest
    run of that key entered after the dispatch) and its result (T: the first after the dispatch, by
    the same thread and job). A torn or malformed line is left out, counted in malformed[file name]."""
    import pandas as pd
    rows = {kind: [] for kind in LINES}
    for path in paths:
        bad = 0
        for text in capture_lines(path):
            try:
                kind, *fields = text.split("\t")
                rows[kind].append(_parse(kind, fields))
            except (ValueError, KeyError):
                bad += 1
        if malformed is not None and bad:
            malformed[path.name] += bad
    frame = {k: pd.DataFrame(v, columns=[n for n, _ in _FIELDS[k]]).astype(
        {n: {"int": "int64", "flag": "bool"}.get(t, object) for n, t in _FIELDS[k]}) for k, v in rows.items()}
    jobs = _jobs(frame["J"], frame["F"])
    return jobs, _tasks(frame["P"], frame["X"], frame["T"], jobs)


def _parse(kind: str, fields: list[str]) -> tuple:
    spec = _FIELDS[kind]
    if len(fields) != len(spec):
        raise ValueError(kind)
    return tuple(_value(t, v) for (_, t), v in zip(spec, fields))


def _value(kind: str, text: str):
    if kind == "int":
        return as_int(text)
    if kind == "flag":
        if text not in ("0", "1"):
            raise ValueError(text)
        return text == "1"
    if kind == "keys":
        return [k for k in text.split("\x1f") if k]
    return text


def _jobs(j: pd.DataFrame, f: pd.DataFrame) -> pd.DataFrame:
    j = j.sort_values("t_ns", kind="stable").drop_duplicates(["pid", "job"]).reset_index(drop=True)
    f = f.drop_duplicates(["pid", "job"]).rename(columns={"t_ns": "end_ns", "job": "local"})
    out = j.rename(columns={"job": "local", "t_ns": "start_ns", "tasks": "graph_tasks"}).assign(job=j.index)
    out = out.merge(f[["pid", "local", "end_ns", "errored"]], on=["pid", "local"], how="left")
    out["end_ns"] = out.end_ns.astype("Int64")
    out["errored"] = out.errored.astype("boolean")
    return out[JOB_COLUMNS]


def _tasks(p: pd.DataFrame, x: pd.DataFrame, t: pd.DataFrame, jobs: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd
    if p.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in TASK_COLUMNS})
    p = p.merge(jobs[["pid", "local", "job"]], left_on=["pid", "job"], right_on=["pid", "local"],
                suffixes=("_local", ""))
    p = p.rename(columns={"t_ns": "sent_ns"}).sort_values("sent_ns", kind="stable")
    t = t.rename(columns={"t_ns": "done_ns", "job": "local", "worker": "worker_id"}).sort_values("done_ns",
                                                                                                 kind="stable")
    p = pd.merge_asof(p, t[["pid", "tid", "local", "key", "done_ns", "worker_id"]], left_on="sent_ns",
                      right_on="done_ns", by=["pid", "tid", "local", "key"], direction="forward")
    x = x.rename(columns={"pid": "exec_pid", "tid": "exec_tid"}).sort_values("enter_ns", kind="stable")
    p = pd.merge_asof(p, x, left_on="sent_ns", right_on="enter_ns", by="key", direction="forward",
                      allow_exact_matches=True)
    for c in ("done_ns", "exec_pid", "exec_tid", "ident", "enter_ns", "loaded_ns", "computed_ns", "exit_ns"):
        p[c] = p[c].astype("Int64")
    p["failed"] = p.failed.astype("boolean")
    # a run of the key entered after this task's result was in is another dispatch's
    late = (p.enter_ns > p.done_ns).fillna(False).to_numpy(bool)
    for c in ("exec_pid", "exec_tid", "ident", "enter_ns", "loaded_ns", "computed_ns", "exit_ns", "failed"):
        p[c] = p[c].mask(late)
    p["computed_ns"] = p.computed_ns.mask((p.computed_ns == 0).fillna(False).to_numpy(bool))
    return p[TASK_COLUMNS].sort_values(["job", "sent_ns"], kind="stable").reset_index(drop=True)


class CommandCaptures:
    """The directory the command's processes write these captures into (ENV_DIR names it to them): under
    the system's temporary directory, its user's (the run directory may be where only daskprobe may
    go); copied into the run's captures once the command has ended, then removed."""

    def __init__(self, user=None):
        import tempfile
        self.dir = Path(tempfile.mkdtemp(prefix="daskprobe-local-"))
        self.uid = None if user is None or user.is_us else user.uid
        if self.uid is not None:
            os.chown(self.dir, user.uid, user.gid)

    def env(self) -> dict[str, str]:
        return {ENV_DIR: str(self.dir)}

    def writers(self) -> set[int]:
        """The processes that have begun their capture (they imported Dask's local scheduler)."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return set()
        pids = (n[len(PREFIX):-len(SUFFIX)] for n in names if n.startswith(PREFIX) and n.endswith(SUFFIX))
        return {int(p) for p in pids if p.isdigit()}

    def collect(self, captures: Path) -> list[str]:
        """Copy them into `captures` and remove the directory; what was refused or cut."""
        import shutil
        try:
            return collect(self.dir, captures, self.uid)
        finally:  # rmtree follows no link the command's user left there
            shutil.rmtree(self.dir, ignore_errors=True)


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (its children's children too), as /proc has them now."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def pool_process(pid: int, parent: int) -> bool:
    """Whether a descendant of `parent` is a pool process its Python made (multiprocessing's spawn or
    forkserver children say so on their command line; a fork has its parent's), not a program it ran
    (a `dask worker` the script started is a member of the cluster, not the command's pool)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f, open(f"/proc/{parent}/cmdline", "rb") as g:
            line, theirs = f.read(), g.read()
    except OSError:
        return False
    return b"multiprocessing" in line or line == theirs


def runs_as(pid: int, uid: int) -> bool:
    """Every uid of the process (real, effective, saved, filesystem) is `uid`: the command's user's own,
    no setuid program's."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next(ln for ln in f if ln.startswith("Uid:"))
    except (OSError, StopIteration):
        return False
    return {int(u) for u in line.split()[1:]} == {uid}
