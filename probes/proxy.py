"""Start the native forwarding proxy (probes/proxy-core) in front of cluster processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from daskprobe.tracer.procs import spawn


@dataclass(frozen=True)
class Route:
    """Connections to `listen` are forwarded to `upstream`, the process called `label`."""

    listen: str
    upstream: str
    label: str


def proxy_binary() -> str:
    """The proxy installed by setup.sh next to this interpreter, or on PATH."""
    candidates = [os.environ.get("DASKPROBE_PROXY"), str(Path(sys.prefix) / "bin" / "daskprobe-proxy"),
                  shutil.which("daskprobe-proxy")]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        "daskprobe-proxy is not built: run ./setup.sh (it builds probes/proxy-core with cargo)"
    )


def start_proxy(capture: Path, routes: list[Route], log: Path, timeout: float = 10.0) -> subprocess.Popen:
    """Start one proxy process serving every route; returns once all routes listen."""
    cmd = [proxy_binary(), "--capture", str(capture)]
    for r in routes:
        cmd += ["--route", f"{r.listen},{r.upstream},{r.label}"]
    proc = spawn(cmd, log, stdout=subprocess.PIPE)
    line = proc.stdout.readline().strip()
    if line != b"ready":
        proc.kill()
        raise RuntimeError(f"proxy failed to start: {log.read_text()[-2000:]}")
    return proc
