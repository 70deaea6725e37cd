"""The run directory: the contract between capture, decoding, analysis and reports.

    run.json        metadata; `partial` stays true until the run is finalized
    captures/       raw, append-only files written by the probes while the run goes
    logs/           stdout and stderr of every cluster process
    tables/         parquet tables decoded from captures (re-buildable)
    trace.pftrace   Perfetto trace built from the tables (re-buildable)
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pandas as pd


class RunDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)

    @classmethod
    def create(cls, out: str | None, command: list[str]) -> "RunDir":
        if out is None:
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", " ".join(Path(c).name for c in command[:3]))[:40]
            out = Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{slug.strip('-') or 'demo'}"
        run = cls(out)
        if run.path.exists() and any(run.path.iterdir()):
            raise FileExistsError(f"run directory {run.path} exists and is not empty")
        for sub in ("captures", "logs", "tables"):
            (run.path / sub).mkdir(parents=True, exist_ok=True)
        return run

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def proxy_capture(self) -> Path:
        return self.path / "captures" / "proxy.bin"

    @property
    def trace(self) -> Path:
        return self.path / "trace.pftrace"

    def log(self, name: str) -> Path:
        return self.path / "logs" / f"{name}.log"

    def meta(self) -> dict:
        return json.loads((self.path / "run.json").read_text())

    def update_meta(self, **fields) -> dict:
        """Merge fields into run.json, atomically: a kill never leaves half a file."""
        path = self.path / "run.json"
        meta = json.loads(path.read_text()) if path.exists() else {}
        meta.update(fields)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=2, default=str))
        os.replace(tmp, path)
        return meta

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        path = self.path / "tables" / f"{name}.parquet"
        path.parent.mkdir(exist_ok=True)
        df.to_parquet(path, index=False)
        return path

    def table(self, name: str) -> pd.DataFrame:
        return pd.read_parquet(self.path / "tables" / f"{name}.parquet")

    def has_table(self, name: str) -> bool:
        return (self.path / "tables" / f"{name}.parquet").exists()
