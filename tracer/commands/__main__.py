"""`python -m daskprobe.tracer.commands`: the `daskprobe` command, where the script is not on PATH."""

from . import entry

entry()
