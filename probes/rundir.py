"""The run directory: the contract between capture, decoding, analysis and reports.

    run.json        metadata; `partial` stays true until the run is finalized
    captures/       raw, append-only files written by the probes while the run goes
    hosts/HOST/     an attached run's agent on another host: its captures, on its clock (probes/agent.py)
    logs/           stdout and stderr of every cluster process
    tables/         parquet tables decoded from captures (re-buildable)
    trace.pftrace   Perfetto trace built from the tables (re-buildable)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .json_schema import check_written
from .run_json import RUN_JSON, Meta

if TYPE_CHECKING:  # imported where tables are read and written: starting a run needs neither (0.7 s)
    import pandas as pd


def default_out(command: list[str]) -> Path:
    """Where a default run directory goes, to check its parent before anything is made: the name
    new_default then makes may have a suffix."""
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{slug(command)}"


class RunDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    @classmethod
    def create(cls, out: str | None, command: list[str]) -> "RunDir":
        if out is None:
            out = new_default(slug(command))
        path = Path(os.path.abspath(out))
        _refuse_if_others_can_move(path.parent)  # before anything is made there
        path.parent.mkdir(parents=True, exist_ok=True)
        run = cls(path.parent.resolve() / path.name)  # no later open goes through a symlink
        try:
            run.path.mkdir(mode=0o700)
        except FileExistsError:
            _refuse_unless_ours_and_empty(run.path)
        for sub in ("captures", "logs", "tables"):
            (run.path / sub).mkdir(mode=0o700, exist_ok=True)
        (run.path / "scratch").mkdir(mode=0o700, exist_ok=True)  # Dask's local directory: private to the run
        return run

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def proxy_capture(self) -> Path:
        return self.path / "captures" / "proxy.bin"

    @property
    def tap_capture(self) -> Path:
        return self.path / "captures" / "tap.bin"

    @property
    def comm_capture(self) -> Path:
        """The comm tap's capture (probes/comm_capture.py merges its files into it): a tls:// run's."""
        return self.path / "captures" / "comm.bin"

    @property
    def task_stream(self) -> Path:
        """Dask's own task stream, as the scheduler gave it (a JSON object per line): an attached
        recording's that cannot read the messages (tls://, no root)."""
        return self.path / "captures" / "task_stream.jsonl"

    @property
    def messages_capture(self) -> Path:
        """The run's messages: the proxy's capture, or the tap's or the comm tap's (the same format) in a
        proxy-less run."""
        if self.proxy_capture.exists():
            return self.proxy_capture
        return next((p for p in (self.tap_capture, self.comm_capture) if p.exists()), self.proxy_capture)

    @property
    def trace(self) -> Path:
        return self.path / "trace.pftrace"

    def log(self, name: str) -> Path:
        return self.path / "logs" / f"{name}.log"

    def meta(self) -> Meta:
        """run.json, checked (probes/run_json.py): meta.KEY gives a key, or its default where an older
        daskprobe did not write it."""
        return Meta.parse((self.path / "run.json").read_text())

    @property
    def scratch(self) -> Path:
        return self.path / "scratch"

    def update_meta(self, **fields) -> dict:
        """Merge fields into run.json, atomically: a kill never leaves half a file. Each field is then
        checked against its definition (probes/run_json.py): one that does not fit is written all the
        same, and said (raised in the tests)."""
        path = self.path / "run.json"
        meta = json.loads(path.read_text()) if path.exists() else {}
        meta.update(fields)
        text = json.dumps(meta, indent=2, default=str)
        write_new(path, text.encode(), fresh=False)
        check_written(text, RUN_JSON, "run.json", only=fields)
        return meta

    def write_file(self, name: str, text: str) -> Path:
        write_new(self.path / name, text.encode())
        return self.path / name

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        """Write table `name`, checked against and cast to its schema (probes/schema.py):
        a table or column that does not fit it is a SchemaError, and nothing is written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from . import schema
        df = schema.conform(name, df)
        path = self.path / "tables" / f"{name}.parquet"
        path.parent.mkdir(exist_ok=True)
        try:
            table = pa.Table.from_pandas(df, schema=schema.arrow_schema(name), preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise schema.SchemaError(f"table {name!r}: " + "; ".join(map(str, e.args))) from None
        with open_whole(path) as f:  # without dictionaries: half the time to write, 4% larger (10K tasks)
            pq.write_table(table, f, use_dictionary=False)
        return path

    def table(self, name: str, missing_ok: bool = False, columns: list[str] | None = None) -> pd.DataFrame:
        """A table (or some of its columns); with missing_ok, one this run directory lacks (decoded by
        an older daskprobe) is empty."""
        import pandas as pd

        from . import schema
        path = self.path / "tables" / f"{name}.parquet"
        if missing_ok and not path.exists():
            return schema.arrow_schema(name).empty_table().to_pandas()[columns or slice(None)]
        return pd.read_parquet(path, columns=columns)

    def has_table(self, name: str) -> bool:
        return (self.path / "tables" / f"{name}.parquet").exists()


def slug(command: list[str]) -> str:
    """The command in a few characters a directory name may hold."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", " ".join(Path(c).name for c in command[:3]))[:40]
    return text.strip("-") or "demo"


def new_default(what: str, parent: Path | str = "runs") -> Path:
    """A default run directory, made here: parent/<time>-<what>, with -02, -03... after it if a run
    started in the same second has that name. mkdir's exclusivity gives two runs started at once
    two directories (a name found free, then made, could be both's). Names sort by the second a
    run started in; the same name's later runs in that second sort after it."""
    parent = Path(os.path.abspath(parent))
    _refuse_if_others_can_move(parent)  # before anything is made there
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        path = parent / f"{stamp}-{what}{f'-{n:02d}' if n > 1 else ''}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return path


def _refuse_unless_ours_and_empty(path: Path) -> None:
    """An existing --out is used only if it is an empty directory of ours that nobody
    else can write to: daskprobe runs as root, and a directory another user controls
    could hold (or later get) a symlink that root would then write through."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} exists and is not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path} exists and belongs to another user or is writable by others; "
                              "give a new path and daskprobe makes it")
    if any(path.iterdir()):
        raise FileExistsError(f"{path} exists and is not empty")


def _refuse_if_others_can_move(parent: Path) -> None:
    """A directory on the way to the run that another user owns, or that anyone may write to without
    the sticky bit, lets them swap the run directory for a symlink after daskprobe made it. Trusted:
    root, us, and the user who ran sudo (root profiling a checkout in their home)."""
    trusted = {0, os.geteuid()} | ({int(os.environ["SUDO_UID"])} if os.environ.get("SUDO_UID", "").isdigit() else set())
    existing = parent
    while not existing.exists():
        existing = existing.parent
    for link in [d for d in [existing, *existing.parents] if d.is_symlink()]:  # its owner can re-point it
        if os.lstat(link).st_uid not in trusted:
            raise PermissionError(f"{link} is a symlink another user owns: give an --out elsewhere")
    for d in [existing.resolve(), *existing.resolve().parents]:
        st = os.stat(d)
        if st.st_uid not in trusted or (st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX):
            raise PermissionError(f"{d} belongs to another user or anyone may write to it: a run directory under "
                                  "it could be swapped for a symlink; give an --out elsewhere")


def open_new(path: Path, mode: int = 0o600):
    """A file opened afresh for writing (binary) without following a symlink planted where it goes."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode), "wb")


def open_append(path: Path, text: bool = False):
    """A capture or log file opened for appending; a symlink where it goes is refused (ELOOP)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "a" if text else "ab")


@contextlib.contextmanager
def open_whole(path: Path, mode: int = 0o600, fresh: bool = True):
    """A file written afresh that appears at `path` only once complete: written beside it (without
    following a symlink planted there) and renamed over it at the end. A failure, a signal or a
    full disk leaves no part of it at `path`; nor, if fresh, an older file (else the older one)."""
    if fresh:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    part = path.with_name(path.name + ".partial")
    try:
        with open_new(part, mode) as f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    os.replace(part, path)


def write_new(path: Path, data: bytes, mode: int = 0o600, fresh: bool = True) -> None:
    """Write a whole file afresh (open_whole)."""
    with open_whole(path, mode, fresh) as f:
        f.write(data)
