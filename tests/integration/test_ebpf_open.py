"""The eBPF probe's side of `open` (write the intervals still open, at an agent's read): an answer
that comes after its timeout is not taken for the agent's last word. The agent here is a stand-in
that speaks the same lines: ready, open (late), done on SIGTERM."""

import subprocess
import sys

from daskprobe.probes.ebpf import Ebpf
from daskprobe.probes.procs import EXITING

STAND_IN = """
import signal, sys, time
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
print("ready", flush=True)
assert sys.stdin.readline().strip() == "open"
time.sleep(0.5)  # slower than the probe waits: its answer comes after the SIGTERM
print("open", flush=True)
while not stopping:
    time.sleep(0.01)
print("done", flush=True)
"""

def test_a_late_answer_to_open_does_not_cut_the_agents_end():
    probe = Ebpf(["offcpu"])
    probe.proc = subprocess.Popen([sys.executable, "-c", STAND_IN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  start_new_session=True)
    try:
        probe.ready()
        probe.write_open(timeout=0.05)
        assert probe.unanswered == 1
        probe.stop(grace=5.0)
        assert probe.proc in EXITING, "its 'done' was read: it wrote everything and was not killed"
    finally:
        EXITING.pop(probe.proc, None)
        if probe.proc.poll() is None:
            probe.proc.kill()
        probe.proc.wait()
