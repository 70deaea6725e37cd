"""The `daskprobe` command line (the verbs are in tracer/commands)."""

from .commands import entry

if __name__ == "__main__":
    entry()
