"""eBPF probes (CPU samples with native and kernel stacks, GIL waits, off-CPU
intervals, TCP segments), run by one agent process under Debian's python3,
which has bcc. See ebpf_agent.py for what is captured."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from . import rates
from .base import HELPER_NICE, Probe, is_root
from .procs import EXITING, lower, spawn, stop
from .rundir import RunDir

AGENT = Path(__file__).with_name("ebpf_agent.py")
# Debian's python3, which python3-bpfcc installs bcc for ($DASKPROBE_BCC_PYTHON to change)
SYSTEM_PYTHON = os.environ.get("DASKPROBE_BCC_PYTHON", "/usr/bin/python3")
TRACEFS = Path("/sys/kernel/tracing")
KINDS = ("cpu", "gil", "offcpu", "tcp")
# Where GIL waits are timed by traps (--gil-traps, or a kernel without bpf_task_pt_regs) the uprobes
# are attached per process, so that no other process traps; but each adds its check to the traps of
# every watched process, about 90 ns a call of pthread_cond_timedwait (+2.2 µs with one, +5.0 with
# 32, +2.0 with one probe for the whole machine). Past this many, one does.
GIL_PER_PROCESS_MAX = 8
INIT_PID_NS = 0xEFFFFFFC  # the inode of the kernel's first pid namespace (PROC_PID_INIT_INO)


def environment_problem() -> str | None:
    """Why eBPF cannot run here, or None. Each answer names what to do."""
    if not is_root():
        return "eBPF needs root"
    if os.stat("/proc/self/ns/pid").st_ino != INIT_PID_NS:
        return "in a pid namespace of its own (a container): eBPF would see the kernel's pids, not these"
    if not os.access(SYSTEM_PYTHON, os.X_OK) or subprocess.run(
            [SYSTEM_PYTHON, "-c", "import bcc"], capture_output=True).returncode != 0:
        return f"bcc is not installed for {SYSTEM_PYTHON} (Debian's python3-bpfcc; ./setup.sh installs it)"
    build = Path(f"/lib/modules/{os.uname().release}/build")
    if not build.exists():
        return f"no kernel headers at {build} (./setup.sh installs and links Debian's)"
    if not (TRACEFS / "events").is_dir():
        return f"tracefs is not mounted at {TRACEFS} (mount -t tracefs tracefs {TRACEFS}; ./setup.sh does)"
    return None


def kind_problem(kind: str) -> str | None:
    needs = {"offcpu": "sched/sched_switch", "tcp": "tcp/tcp_probe"}.get(kind)
    if needs and not (TRACEFS / "events" / needs).is_dir():
        return f"this kernel has no tracepoint {needs.replace('/', ':')}"
    return None


def _runs_python(pid: int) -> bool:
    """Its executable is a Python interpreter (a --server-cmd scheduler such as RSDS is not)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return True  # gone already: nothing will be sampled either way


class Ebpf(Probe):
    def __init__(self, kinds: list[str], cpu_hz: int = rates.CPU_HZ, gil_traps: bool = False):
        self.kinds, self.cpu_hz, self.gil_traps = list(kinds), cpu_hz, gil_traps
        self.unanswered = 0  # write_open requests the agent has not answered yet
        self.name = ",".join(self.kinds)

    def available(self) -> str | None:
        return environment_problem()

    def partly_skipped(self) -> dict[str, str]:
        """Kinds this kernel lacks; dropped at start, the others still run."""
        return {k: why for k in self.kinds if (why := kind_problem(k))}

    def start(self, run: RunDir, ports: set[int] = frozenset()) -> None:
        self.kinds = [k for k in self.kinds if k not in self.partly_skipped()]
        cmd = [SYSTEM_PYTHON, str(AGENT), "--out", str(run / "captures")]
        cmd += ["--cpu", str(self.cpu_hz)] * ("cpu" in self.kinds)
        cmd += ["--gil", "--gil-per-process", str(GIL_PER_PROCESS_MAX)] * ("gil" in self.kinds)
        cmd += ["--gil-traps"] * (self.gil_traps and "gil" in self.kinds)
        cmd += ["--offcpu"] * ("offcpu" in self.kinds)
        if "tcp" in self.kinds:
            cmd += ["--tcp", ",".join(map(str, sorted(ports)))]
        self.proc = spawn(cmd, run.log("ebpf"), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.log = run.log("ebpf")

    def ready(self) -> None:
        if self.proc.stdout.readline().strip() != b"ready":
            stop([self.proc])
            raise RuntimeError(f"the eBPF agent did not start: see {self.log}")
        # compiling is on the way to the user's command, beside the cluster's start: at a low priority
        # it finished last, well after the cluster was up
        lower(self.proc.pid, HELPER_NICE)

    def watch(self, proc: dict) -> None:
        self.watch_as(proc["pid"], "python" if _runs_python(proc["pid"]) else "native", proc["name"])

    def watch_as(self, pid: int, kind: str, name: str) -> None:
        """kind python: GIL waits probed, user stacks walked by frame pointers in BPF;
        native: user stacks copied, to unwind from .eh_frame after the run."""
        self.proc.stdin.write(f"{pid} {kind} {name}\n".encode())
        self.proc.stdin.flush()

    def write_open(self, timeout: float) -> None:
        """The intervals off a CPU not ended yet, written up to now (BPF emits one only when its thread
        comes back; a reader that saw none would count a sleeping thread as running). Its reader keeps
        the longest of an interval's records."""
        if "offcpu" not in self.kinds or not self.proc or self.proc.poll() is not None:
            return
        self.proc.stdin.write(b"open\n")
        self.proc.stdin.flush()
        self.unanswered += 1
        deadline = time.monotonic() + timeout
        while self.unanswered and self._line(deadline) == b"open\n":
            self.unanswered -= 1

    def _line(self, deadline: float) -> bytes:
        """The agent's next line by the deadline (b"" if none), read a byte at a time: nothing past it
        is buffered where a select would not see it."""
        line, fd = b"", self.proc.stdout.fileno()
        while not line.endswith(b"\n") and select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            if not (byte := os.read(fd, 1)):
                break
            line += byte
        return line

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM: the agent drains its buffers, writes the sums and says "done"; its exit goes on
        in the background (the kernel detaching its probes takes about 0.5 s) until reap_exiting."""
        if not self.proc or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        told = time.monotonic()
        while (line := self._line(told + 3 * grace)) == b"open\n":  # a write_open's answer after its timeout
            pass
        if line == b"done\n":
            EXITING[self.proc] = told
        else:
            stop([self.proc], grace=grace)
