"""The `daskprobe` command line: one module per verb.

A verb module has HELP (one line), EXAMPLES, add_arguments(parser) and
main(args, command) -> exit code, where `command` is what followed `--`.
Verbs of the experiments layer (bench) come from its registry, by name.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..registry import experiments

VERBS = {name: f"{__name__}.{name}_verb" for name in ("run", "build", "report", "explain", "open", "compare", "doctor")}


def verbs() -> dict[str, str]:
    return VERBS | experiments().VERBS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="daskprobe", description="Trace and profile Dask clusters: every protocol "
                                "message, on one clock.", epilog="'daskprobe VERB --help' shows the verb's "
                                "options and examples.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, module in verbs().items():
        m = importlib.import_module(module)
        v = sub.add_parser(name, help=m.HELP, description=m.HELP, epilog=m.EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        m.add_arguments(v)
        v.set_defaults(module=m)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    args = parser().parse_args(argv)
    return args.module.main(args, command)
