"""`daskprobe attach`: record a cluster that is already running, without restarting it, finalize."""

from __future__ import annotations

import re
import shutil

from . import options

HELP = "record a running cluster without restarting it (members on other hosts through agents it deploys)"
EXAMPLES = """examples:
  daskprobe attach tcp://127.0.0.1:8786 -- python my_flow.py    # while a command runs against it
  daskprobe attach tcp://127.0.0.1:8786 --duration 30            # 30 s of whatever it does
  daskprobe attach tcp://127.0.0.1:8786                          # until Ctrl-C
"""
DEFAULT_PROBES = "tap,pyspy,proc,cpu,gil,offcpu,tcp"


def add_arguments(p) -> None:
    p.usage = "daskprobe attach ADDRESS [options] [-- COMMAND ...]"
    p.add_argument("address", help="the scheduler's address, as clients connect to it (tcp://HOST:PORT; tls:// "
                                   "with Dask's TLS config: samples and Dask's task stream, no messages but with "
                                   "--comm-dir)")
    p.add_argument("--duration", type=options.bounded(*options.DURATION_S),
                   help=f"seconds to record when no command is given, {options.span(options.DURATION_S)} (default: until Ctrl-C)")
    p.add_argument("--probes", default=DEFAULT_PROBES,
                   help=f"comma-separated probes; the tap records the messages (root; without it: samples and Dask's "
                        f"task stream) (default {DEFAULT_PROBES})")
    options.sampling(p)
    p.add_argument("--comm-dir", metavar="DIR",
                   help="where the cluster's processes write the comm tap's files (they were started with "
                        "--preload PATH/daskprobe/probes/comm_tap.py and DASKPROBE_COMM_TAP_DIR=DIR): their messages, "
                        "tls:// ones too, read from there at the end, instead of the tap's")
    p.add_argument("--no-agents", action="store_true",
                   help="do not deploy agents (Dask plugins) to sample the members on other hosts: only their "
                        "messages are recorded")
    p.add_argument("--out", help="run directory (default runs/<time>-attach)")
    options.user(p, "the command")
    p.add_argument("--no-trace", action="store_true", help="leave trace.pftrace out ('daskprobe build' writes it later)")


def main(args, command: list[str]) -> int:
    from ...probes import registry
    from ...probes.base import is_root
    from ...probes import rates
    from ...probes.rundir import RunDir
    from ..capture.attached import Attached, AttachSpec
    from ..pipeline.build import finalize
    from ..capture.own_cluster import remind
    from ..capture.say import say
    from ..capture.session import Signals, attach

    probes = [p for p in options.parse_probes(args.probes) if p not in registry.WIRE]
    # a rate the user chose is kept (fixed), here and by the agents on other hosts
    sampling = rates.Sampling(args.sample_rate or rates.SAMPLE_RATE, args.cpu_hz, args.sample_rate is not None)
    if not re.fullmatch(r"(tcp|tls)://(\[[0-9a-fA-F:.]+\]|[^:/\s\[\]]+):\d{1,5}", args.address):
        raise SystemExit(f"daskprobe: {args.address}: give the scheduler's address as tcp://HOST:PORT or "
                         "tls://HOST:PORT (its messages cannot be read: samples and Dask's task stream only)")
    user = None
    if command:
        options.check_command(command)
        user = options.runs_as(args.user, command, _tls_files(args.address), [], "your command")
    made = options.missing_parents(args.out, command or ["attach"])
    run_dir = options.new_run(RunDir, args.out, command or ["attach"])
    with Signals() as signals:
        cluster = Attached(AttachSpec(args.address, tap=is_root() and not args.comm_dir, agents=not args.no_agents,
                                      comm_dir=args.comm_dir), run_dir)
        recorder = ["comm"] if args.comm_dir else [] if cluster.unread else ["tap"]
        code = attach(cluster, command, args.duration, run_dir, [*recorder, *probes],
                      registry.make(probes, sampling.rate, False, sampling.cpu_hz, sampling.fixed), signals,
                      sampling=sampling, user=user)
        if not cluster.members:  # it never attached (said why): nothing was recorded, nothing to keep
            shutil.rmtree(run_dir.path, ignore_errors=True)
            return code
        try:
            finalize(run_dir, trace=not args.no_trace)
            remind(run_dir)
        finally:
            options.hand_over(run_dir.path, made)
    say(f"run directory: {run_dir.path}")
    return code


def _tls_files(address: str) -> list[str]:
    """The TLS files a client of a tls:// cluster reads (Dask's config): the command's user must read them."""
    import dask
    keys = ("ca-file", "client.cert", "client.key")
    return [f for k in keys if (f := dask.config.get(f"distributed.comm.tls.{k}", None))] \
        if address.startswith("tls://") else []
