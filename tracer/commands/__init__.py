"""The `daskprobe` command line: one module per verb.

A verb module has HELP (one line), EXAMPLES, add_arguments(parser) and
main(args, command) -> exit code, where `command` is what followed `--`.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import shlex
import sys

VERBS = {name: f"{__name__}.{name}_verb" for name in ("run", "attach", "build", "report", "explain", "open", "compare",
                                                         "whatif", "bench", "doctor")}


def verbs() -> dict[str, str]:
    return VERBS


def parser() -> tuple[argparse.ArgumentParser, dict]:
    p = argparse.ArgumentParser(prog="daskprobe", description="Trace and profile Dask clusters: every protocol "
                                "message, on one clock.", epilog="'daskprobe VERB --help' shows the verb's "
                                "options and examples.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    subs = {}
    for name, module in verbs().items():
        m = importlib.import_module(module)
        v = sub.add_parser(name, help=m.HELP, description=m.HELP, epilog=m.EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        m.add_arguments(v)
        v.set_defaults(module=m)
        subs[name] = v
    return p, subs


def _unknown(verb: argparse.ArgumentParser, extra: list[str]) -> str:
    """What to say about arguments the verb does not know: the option meant, or where a command goes."""
    if extra[0].startswith("-"):
        name = extra[0].split("=")[0]
        known = [o for a in verb._actions for o in a.option_strings]
        near = difflib.get_close_matches(name, known, n=1)
        return f"unknown option {name}" + (f": did you mean {near[0]}?" if near else "")
    return f"unexpected {shlex.join(extra)}: the command to profile goes after '--', as in: " \
           f"{verb.prog} -- {shlex.join(extra)}"


def _verb_typo(argv: list[str]) -> str | None:
    first = next((a for a in argv if not a.startswith("-")), None)
    if first is None or first in verbs():
        return None
    near = difflib.get_close_matches(first, list(verbs()), n=1)
    return f"daskprobe: no verb {first!r}" + (f": did you mean '{near[0]}'?" if near else "") + \
        f" (verbs: {', '.join(verbs())})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    if why := _verb_typo(argv):
        raise SystemExit(why)
    p, subs = parser()
    args, extra = p.parse_known_args(argv)
    if extra:
        subs[args.verb].error(_unknown(subs[args.verb], extra))
    return args.module.main(args, command)


def entry() -> None:
    """The console script: main(), then an exit that skips the interpreter's teardown of pandas,
    pyarrow and plotly (0.35 s after a run's finalize, measured); every file is closed by then."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # read by a pager or `head` that stopped reading: not an error of ours
        code = 0
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    os._exit(int(code or 0))
