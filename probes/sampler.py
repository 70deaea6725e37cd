"""daskprobe-sampler (probes/sampler-core), for two probes that share its wake-ups: Python
stacks ("pyspy": pyspy.py defines the capture) and /proc readings ("proc": procfs.py). A
timed wait costs a VM 60-110 µs of CPU, more than a reading of every process's /proc: read
in a thread of daskprobe's own, they were a fifth of what measuring cost on 10 ms tasks."""

from __future__ import annotations

import contextlib
import select
import subprocess
import time
from pathlib import Path

from . import ebpf_format, procfs, pyspy, rates
from .base import CLUSTER_ROLES, LAST_READ_TIMEOUT, SAMPLER_NICE, Probe, is_root, missing_binary, native_binary
from .procs import spawn, stop
from .rundir import RunDir, open_append

KINDS = ("pyspy", "proc")
STACK_ROLES = CLUSTER_ROLES - {"proxy"}  # native code: the eBPF CPU sampler covers it
PROC_ROLES = CLUSTER_ROLES | {"probe"}  # the probes' own cost is measured too


def _ptrace_allowed() -> bool:
    """Yama 0 (classic) and 1 (ancestors, and those a process names: daskprobe's children
    name daskprobe, see procs.our_child) let the sampler read the cluster; 2 and 3 do not."""
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip() in ("0", "1")
    except FileNotFoundError:
        return True


class Sampler(Probe):
    """One daskprobe-sampler for the kinds chosen (KINDS), named after them (`pyspy,proc`)."""

    def __init__(self, kinds: list[str], rate: float = rates.SAMPLE_RATE, native: bool = False, fixed: bool = False):
        self.kinds, self.rate, self.native, self.fixed = [k for k in KINDS if k in kinds], rate, native, fixed
        self.name = ",".join(self.kinds)
        self.roles = (STACK_ROLES if "pyspy" in self.kinds else set()) | (PROC_ROLES if "proc" in self.kinds else set())

    def available(self) -> str | None:
        if native_binary("daskprobe-sampler") is None:
            return missing_binary("daskprobe-sampler")
        return self.partly_skipped().get("pyspy") if self.kinds == ["pyspy"] else None

    def partly_skipped(self) -> dict[str, str]:
        if "pyspy" in self.kinds and not is_root() and not _ptrace_allowed():
            return {"pyspy": "reading other processes' stacks needs root here (kernel.yama.ptrace_scope is 2 or 3)"}
        return {}

    def start(self, run: RunDir, ports: set[int] = frozenset()) -> None:
        self.stacks = "pyspy" in self.kinds and not self.partly_skipped()
        cap = self.captures = run / "captures"
        cmd = [native_binary("daskprobe-sampler"), "--rate", str(self.rate)] + (["--native"] if self.native else [])
        cmd += ["--fixed"] if self.fixed else []
        cmd += ["--out", str(cap / pyspy.CAPTURE)] if self.stacks else []
        cmd += ["--proc", str(cap / procfs.CAPTURE), "--threads", str(cap / procfs.THREADS)] * ("proc" in self.kinds)
        self.log = run.log("sampler")
        # unbuffered: a readline takes one line, so select() sees what is left (last_read)
        self.proc = spawn(cmd, self.log, nice=SAMPLER_NICE, group=False, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.said: list[str] = []  # its stdout's lines before the end, read with last_read's answer
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the sampler failed to start: see {self.log}")

    def watch(self, proc: dict) -> None:
        """Each kind whose roles hold the process's (a row without one: each kind)."""
        role = proc.get("role")
        lines = f"{proc['pid']} {proc['name']}\n" * (self.stacks and role in STACK_ROLES | {None})
        lines += f"proc {proc['pid']}\n" * ("proc" in self.kinds and role in PROC_ROLES | {None})
        self.proc.stdin.write(lines.encode())
        self.proc.stdin.flush()

    def last_read(self, timeout: float = LAST_READ_TIMEOUT) -> None:
        """Every thread read once more: those off a CPU are read every 200 ms, so a thread started
        since (a worker's executor thread, at its first tasks) and never ticked would go unread,
        and its compute slices without its name."""
        if not (self.proc and self.stacks) or self.proc.poll() is not None:
            return
        try:
            self.proc.stdin.write(b"read\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it has ended: stop() says why
            return
        end = time.monotonic() + timeout
        while select.select([self.proc.stdout], [], [], max(0.0, end - time.monotonic()))[0]:
            line = self.proc.stdout.readline()  # it writes whole lines
            if line.strip() == b"read" or not line:
                return
            self.said.append(line.decode(errors="replace").rstrip("\n"))
        raise TimeoutError(f"no answer within {timeout:g} s: a thread started in the session's last "
                           "200 ms may have no name or Python ident")

    def stop(self, grace: float = 5.0) -> None:
        if self.proc:
            self._program_costs()
            stop([self.proc], grace)
            self.error = self.error or self._capture_stopped()

    def _capture_stopped(self) -> str | None:
        """Why it stopped writing a capture (a full disk), as it said on stdout before it ended."""
        if self.proc.poll() is None:  # not ended: what it said cannot be read to its end
            return None
        said = self.said + self.proc.stdout.read().decode(errors="replace").splitlines()
        return next((ln.removeprefix("capture stopped: ") for ln in said if ln.startswith("capture stopped")), None)

    def _program_costs(self) -> None:
        """Its BPF tick programs' cost so far, where the kernel counts it, beside the eBPF agent's."""
        with contextlib.suppress(OSError):  # it has ended, or the disk is full: the run goes on
            if self.proc.poll() is None and (lines := ebpf_format.program_costs(self.proc.pid, {}, "sampler_tick")):
                with open_append(self.captures / ebpf_format.PROGRAMS, text=True) as f:
                    f.write(lines)
