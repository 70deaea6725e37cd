"""The samplers' default rates, defined once: the CLI's defaults (run, attach), the probes', and
what a run.json without them (an older daskprobe's) was sampled at."""

from typing import NamedTuple

SAMPLE_RATE = 100.0  # Hz: the Python sampler's stacks per second and process
# Hz: eBPF's CPU samples per second and CPU; off a round 100, as perf's habit, so as not to tick in
# step with periodic work
CPU_HZ = 99
# Hz: the Python sampler's default where py-spy's reader reads the cluster (CPython outside OUR_READER,
# or --native): 4-5 times our reader's CPU per thread sample. At 100 Hz it took 5.6% of a CPython 3.9
# cluster's CPU (docs/measurements.md, 2026-11-28) and 11-15% of RSDS's 3.8 one: a third keeps it near 5%
PYSPY_SAMPLE_RATE = 30.0
OUR_READER = ((3, 10), (3, 13))  # the CPython versions our own stack reader knows, first and last


class Sampling(NamedTuple):
    """How a host's probes sample, as the user asked (an attach's agents on other hosts take it along):
    fixed, a rate the user chose, kept even where polling at it costs more than the sampler's share."""
    rate: float = SAMPLE_RATE
    cpu_hz: int = CPU_HZ
    fixed: bool = False
