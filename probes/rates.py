"""The samplers' default rates, defined once: the CLI's defaults (run, attach), the probes', and
what a run.json without them (an older daskprobe's) was sampled at."""

SAMPLE_RATE = 100.0  # Hz: the Python sampler's stacks per second and process
# Hz: eBPF's CPU samples per second and CPU; off a round 100, as perf's habit, so as not to tick in
# step with periodic work
CPU_HZ = 99
