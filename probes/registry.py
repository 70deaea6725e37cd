"""Every probe daskprobe knows, by the name `--probes` uses."""

from __future__ import annotations

from . import rates
from .base import Probe, is_root
from .ebpf import KINDS as EBPF_KINDS, Ebpf
from .sampler import KINDS as SAMPLER_KINDS, Sampler

DESCRIPTIONS = {
    "proxy": "every protocol message, through a sniffing proxy in front of each process",
    "tap": "every protocol message, from the wire (packet capture on the cluster's ports, root), no proxy in "
           "the way: instead of proxy",
    "comm": "every protocol message, recorded inside Dask's processes by a preload that taps their comms (tcp, "
            "tls, ws, ucx, inproc): instead of proxy; what records a tls:// or ws:// run (run --protocol)",
    "pyspy": "Python stacks of every process (our CPython 3.10–3.13 reader, py-spy for others), --sample-rate per second",
    "proc": "CPU% and RSS of every process from /proc, 5 per second",
    "cpu": "CPU samples with native and kernel stacks (eBPF, cpu-clock), --cpu-hz per second",
    "gil": "time each thread waited to take the GIL (eBPF: take_gil's sleeps on the GIL's condition)",
    "offcpu": "off-CPU intervals per thread, runnable vs blocked (eBPF, sched tracepoints)",
    "tcp": "TCP segments received on the cluster's connections (eBPF, tcp:tcp_probe)",
}
NAMES = tuple(DESCRIPTIONS)
# 'all': the tap and the comm tap record what the proxy does, one of them at a time
ALL = tuple(n for n in NAMES if n not in ("tap", "comm"))
WIRE = ("proxy", "tap", "comm")  # part of the cluster, not probe objects: they record the messages


def make(names: list[str], sample_rate: float = rates.SAMPLE_RATE, native: bool = False,
         cpu_hz: int = rates.CPU_HZ, fixed_rate: bool = False) -> list[Probe]:
    """Probe objects for the chosen names (the proxy and the taps are part of the cluster, not listed here);
    the eBPF kinds share one agent, stacks and /proc one sampler. fixed_rate: a rate the user chose, kept
    even where polling at it costs more than the sampler's share of the cluster's CPU."""
    sampled, kinds = [n for n in names if n in SAMPLER_KINDS], [n for n in names if n in EBPF_KINDS]
    return ([Sampler(sampled, sample_rate, native, fixed_rate)] if sampled else []) + ([Ebpf(kinds, cpu_hz)] if kinds else [])


def doctor() -> list[tuple[str, str | None, str]]:
    """(probe, why it cannot run here or None, what it captures) for every probe."""
    from .proxy import proxy_binary
    rows = []
    for name, what in DESCRIPTIONS.items():
        if name == "comm":
            problem = None  # a Python file the cluster loads
        elif name in WIRE:
            try:
                proxy_binary(f"daskprobe-{name}")
                problem = None if name == "proxy" or is_root() else "the tap needs root (a packet socket)"
            except FileNotFoundError as e:
                problem = str(e)
        else:
            probe = make([name])[0]
            problem = probe.available() or probe.partly_skipped().get(name)
        rows.append((name, problem, what))
    return rows
