"""The client hook, daskprobe's side: what it adds to the command's environment, and the pipe it
reads the command's reports from (daskprobe_hook.py is the command's side, and says how it works).

The command runs unprivileged (probes/users.py) and daskprobe may be root: its reports are plain
JSON lines, read without blocking, each at most MAX_LINE bytes and at most MAX_REPORTS of them;
the rest is counted, never parsed. Nothing is unpickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .daskprobe_hook import ENV_PIPE, ENV_SCHEDULER, MAX_LINE

HOOK_DIR = Path(__file__).parent  # first on the command's PYTHONPATH: its sitecustomize.py loads the hook
MAX_REPORTS = 64


class Channel:
    """The pipe the command's hook writes to. `env()` and `pass_fds` go to the command's Popen, then
    `started()` closes our copy of the write end (the end of the command's processes is then the
    pipe's end). `fileno()` is for select; `read()` returns the reports that came."""

    def __init__(self):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)  # the command's side: a full pipe drops a report, never blocks it
        self._partial = b""
        self.reports = 0
        self.dropped = 0  # lines too long, malformed, or past MAX_REPORTS
        self.open = True

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self._w,)

    def env(self, env: dict[str, str], scheduler: str | None = None) -> dict[str, str]:
        """`env` with the hook first on PYTHONPATH, the pipe, and daskprobe's cluster's address."""
        path = env.get("PYTHONPATH")
        out = dict(env, PYTHONPATH=os.pathsep.join([str(HOOK_DIR)] + ([path] if path else [])),
                   **{ENV_PIPE: f"{self._w}:{os.fstat(self._w).st_ino}"})
        return out | ({ENV_SCHEDULER: scheduler} if scheduler else {})

    def started(self) -> None:
        if self._w is not None:
            os.close(self._w)
            self._w = None

    def fileno(self) -> int:
        return self._r

    def read(self) -> list[dict]:
        """The whole lines that came since the last read, parsed; none once the pipe has ended."""
        if not self.open:
            return []
        chunks = []
        while True:
            try:
                chunk = os.read(self._r, 65536)
            except BlockingIOError:
                break
            if not chunk:
                self.open = False
                break
            chunks.append(chunk)
        data = self._partial + b"".join(chunks)
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) >= MAX_LINE:  # a line this long is never one of the hook's
            self.dropped += 1
            self._partial = b""
        return [r for line in lines if (r := self._parse(line)) is not None]

    def _parse(self, line: bytes) -> dict | None:
        if len(line) >= MAX_LINE or self.reports >= MAX_REPORTS:
            self.dropped += 1
            return None
        try:
            report = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            report = None
        if not isinstance(report, dict) or not isinstance(report.get("kind"), str):
            self.dropped += 1
            return None
        self.reports += 1
        return report

    def close(self) -> None:
        self.started()
        if self._r is not None:
            os.close(self._r)
            self._r = None
        self.open = False
