"""Start the native forwarding proxy (probes/proxy-core) in front of cluster processes, or its
packet tap (daskprobe-tap, same crate), which records the same capture from the wire, proxy-less."""

from __future__ import annotations

import contextlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .base import HELPER_NICE, missing_binary, native_binary
from .procs import spawn, stop


@dataclass(frozen=True)
class Route:
    """Connections to `listen` are forwarded to `upstream`, the process called `label`."""

    listen: str
    upstream: str
    label: str


def proxy_binary(name: str = "daskprobe-proxy") -> str:
    path = native_binary(name)
    if path is None:
        raise FileNotFoundError(missing_binary(name))
    return path


def start_proxy(capture: Path, routes: list[Route], log: Path, delay_us: int = 0,
                allow_uids: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start one proxy process serving every route; returns once all routes listen.
    delay_us holds each burst of bytes that starts a message that long (what-if); with allow_uids it
    serves only connections those users' processes opened."""
    cmd = [proxy_binary(), "--capture", str(capture), "--delay-us", str(delay_us)]
    if allow_uids:
        cmd += ["--allow-uids", ",".join(map(str, allow_uids))]
    for r in routes:
        cmd += ["--route", f"{r.listen},{r.upstream},{r.label}"]
    return _started(cmd, log)


def start_tap(capture: Path, ports: dict[int, str], log: Path, loopback: bool = False) -> subprocess.Popen:
    """Start the packet tap on the listening ports (port -> the label of what listens there);
    returns once it captures. It needs root or CAP_NET_RAW. stop_proxy stops it too. loopback: every
    member runs on this host, so their packets pass loopback alone (which costs each packet less)."""
    cmd = [proxy_binary("daskprobe-tap"), "--capture", str(capture), *(["--loopback"] if loopback else [])]
    for port, label in ports.items():
        cmd += ["--port", f"{port}={label}"]
    return _started(cmd, log, nice=HELPER_NICE)  # not on the data path, unlike the proxy; 64 MiB of ring


def _started(cmd: list[str], log: Path, nice: int = 0) -> subprocess.Popen:
    proc = spawn(cmd, log, nice=nice, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # it runs until its stdin ends
    line = proc.stdout.readline().strip()
    if line != b"ready":
        proc.kill()
        raise RuntimeError(f"{Path(cmd[0]).name} failed to start: {log.read_text()[-2000:]}")
    return proc


def stop_proxy(proc: subprocess.Popen, grace: float = 5.0) -> list[subprocess.Popen]:
    """End its stdin: it records every connection still open as closed now, with the bytes it
    forwarded, writes what it has queued and exits; SIGTERM, then SIGKILL, if it has not within
    `grace` seconds. Returns it if it had to be killed."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(grace)
        return []
    except subprocess.TimeoutExpired:
        return stop([proc], 0.5)
