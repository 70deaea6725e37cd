"""daskprobe: where did the makespan of a Dask workflow go?

The repository's root is the `daskprobe` package; its folders are the layers,
each importing only from those before it:

    probes       what captures, the formats it writes, the run directory
    analyzers    tables in, results out (pure)
    dashboards   read-only renderers of a run directory (the trace among them)
    tracer       the running tool, a package per stage: capture, decode, pipeline,
                 commands (the CLI); variants (random scheduler, zero worker, demo), bench
    experiments  benchmarks
"""

from .tracer.capture.record import record  # noqa: E402,F401  (stdlib only: `import daskprobe` stays cheap)
