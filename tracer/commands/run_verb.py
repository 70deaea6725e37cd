"""`daskprobe run`: start a cluster behind the probes, run a command against it, finalize."""

from __future__ import annotations

import sys

from . import options
from .. import variants
from ..capture.protocols import PRIVATE_NETWORK, PROTOCOLS

HELP = "start a cluster behind the probes and run a command against it"
EXAMPLES = """examples:
  daskprobe run                                   # built-in demo on 2 workers
  daskprobe run --workers 2 --threads 1 -- python my_flow.py
  daskprobe run --workers 4 --config distributed.scheduler.worker-saturation=inf -- python my_flow.py
  daskprobe run --probes none -- python my_flow.py          # same cluster, no capture (baseline)
  daskprobe run --server-cmd 'rsds-scheduler --port {port}' --python /path/to/old-env/bin/python -- python flow.py
"""


def add_arguments(p) -> None:
    p.usage = "daskprobe run [options] [-- COMMAND ...]"
    p.add_argument("--workers", type=options.bounded(*options.WORKERS), default=2,
                   help=f"number of workers, {options.span(options.WORKERS)}; more than {variants.MAX_PROCESSES} only with "
                        "--workers-per-process (default 2)")
    p.add_argument("--workers-per-process", type=options.bounded(int, 1, 1024), default=1, metavar="K",
                   help="run K workers in each process, sharing its event loop and GIL (as "
                        "LocalCluster(processes=False)): hundreds of workers, each its own connections, "
                        "before one scheduler; with --worker zero, see docs/scaling.md (default 1)")
    options.cluster(p)
    p.add_argument("--memory-limit", type=options.byte_size, default=None, metavar="SIZE",
                   help="memory limit per worker, e.g. 4GB or 4GiB; 0: none (default: as LocalCluster, the "
                        "machine's memory / workers)")
    p.add_argument("--nanny", action="store_true", default=False,
                   help="start workers under a nanny (default: no nanny)")
    p.add_argument("--protocol", choices=list(PROTOCOLS), default="tcp",
                   help="the cluster's comms: tcp; tls with a certificate made for the run; ws (websockets); "
                        "ucx (distributed-ucxx in --python's environment; root: the run gets a loopback-only "
                        "network of its own). Other than tcp, their messages are recorded by the comm tap "
                        "inside Dask's processes (the proxy and the tap cannot read them) (default tcp)")
    p.add_argument("--server-cmd", help="scheduler command instead of dask's, with {host} and {port} placeholders")
    options.probes(p, "default")
    options.sampling(p)
    p.add_argument("--native", action="store_true",
                   help="read Python stacks with py-spy, native frames too (pauses each process while it reads)")
    p.add_argument("--delay-ms", type=options.bounded(*options.DELAY_MS), default=0.0,
                   help="what-if: links with this much latency: the proxy hands every byte on this long after "
                        f"it read it, {options.span(options.DELAY_MS)} (default 0)")
    p.add_argument("--scheduler", default="ws", choices=list(variants.SCHEDULERS),
                   help="; ".join(f"{k}: {v.help}" for k, v in variants.SCHEDULERS.items()) + " (default ws)")
    p.add_argument("--worker", default="normal", choices=list(variants.WORKERS),
                   help="; ".join(f"{k}: {v.help}" for k, v in variants.WORKERS.items()) + " (default normal)")
    p.add_argument("--out", help="run directory (default runs/<time>-<command>)")
    options.user(p, "the cluster and the command")
    p.add_argument("--no-trace", action="store_true",
                   help="leave trace.pftrace out (it takes longest to write; 'daskprobe build' writes it later)")
    p.add_argument("--start-timeout", type=options.bounded(*options.START_TIMEOUT_S), default=60.0,
                   help=f"seconds for each process to start, {options.span(options.START_TIMEOUT_S)} (default 60)")


def main(args, command: list[str]) -> int:
    from ...probes import registry
    from ...probes.rundir import RunDir
    from ..pipeline.build import finalize, warm_up
    from ..capture.own_cluster import remind
    from ..capture.say import say
    from ..capture.session import Signals, default_command, run

    probes = options.parse_probes(args.probes)
    probes = _wire(probes, args, say) if args.probes == "default" else probes
    probes = _comm_tap(probes, args, say)
    spec, command = _spec(args, probes), command or default_command()
    options.check_command(command)
    user = options.runs_as(args.user, command, [spec.python], [], "the cluster and your command")
    if spec.protocol in PRIVATE_NETWORK:
        _private_network(spec, user, say)
    if spec.server_cmd:
        say("warning: the --server-cmd server's own port serves whoever connects: only its proxy checks who")
    rate = args.sample_rate or _default_rate(probes, args.native, spec.python, user, say)
    made = options.missing_parents(args.out, command)
    run_dir = options.new_run(RunDir, args.out, command)
    with Signals() as signals:
        code = run(spec, command, run_dir, probes, registry.make(probes, rate, args.native, args.cpu_hz, args.sample_rate is not None),
                   signals, sample_rate=rate, cpu_hz=args.cpu_hz, warm_up=warm_up, user=user)
        try:
            finalize(run_dir, trace=not args.no_trace)
            remind(run_dir)
        finally:
            _reap(run_dir, signals.grace)
            options.hand_over(run_dir.path, made)
    if signals.signum and not code:  # interrupted while finalizing a run that had ended well
        code = 128 + signals.signum
    say(f"run directory: {run_dir.path}")
    return code


def _reap(run_dir, grace: float) -> None:
    """Reap what was left exiting; name (and record in run.json) what had to be killed."""
    from ...probes.procs import reap_exiting
    from ..capture.session import note_killed
    note_killed(run_dir, reap_exiting(grace), f"still running {grace:g} s after SIGTERM (a thread that is not a daemon?)")


def _default_rate(probes: list[str], native: bool, python: str, user, say) -> float:
    """The Python sampler's rate when none was asked for: lower where py-spy's reader reads the cluster
    (--native, or a CPython ours does not know), which costs 4-5 times the CPU per sample."""
    from ...probes import rates
    from ..capture.cluster import ask_versions
    if "pyspy" not in probes:
        return rates.SAMPLE_RATE
    version = ".".join(map(str, sys.version_info[:3])) if python == sys.executable else \
        ask_versions(python, user)().get("python") or ""
    (lo, hi), ours = rates.OUR_READER, tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
    if not native and (not ours or lo <= ours <= hi):
        return rates.SAMPLE_RATE
    why = "--native" if native else f"the cluster's CPython {version}"
    say(f"py-spy's reader reads {why} at about 4-5 times our reader's CPU per sample (5.6% of a 3.9 cluster's "
        f"CPU at {rates.SAMPLE_RATE:g}/s): sampling at {rates.PYSPY_SAMPLE_RATE:g}/s (--sample-rate to choose)")
    return rates.PYSPY_SAMPLE_RATE


def _wire(probes: list[str], args, say) -> list[str]:
    """The default's message recorder, off the messages' path where it can be (the costs:
    docs/measurements.md): the tap as root; else the comm tap inside Dask's processes. The proxy stays
    for --delay-ms (it holds the bytes), --server-cmd (not Dask's comms; it checks who connects),
    --nanny (a nanny ends its worker by SIGTERM: the comm tap would lose its last 200 ms) and another
    interpreter (--python: the comm tap hooks the Dask that daskprobe runs on). Off tcp:// it is
    _comm_tap's choice."""
    from ...probes.base import is_root, native_binary
    if args.delay_ms or args.server_cmd or args.protocol != "tcp":
        return probes
    if is_root() and native_binary("daskprobe-tap") is not None:
        return ["tap" if p == "proxy" else p for p in probes]
    keep = "--nanny" if args.nanny else "--python" if args.python != sys.executable else None
    if keep:
        say(f"messages: through the proxy, with {keep} (without either the comm tap, off their path, records them)")
        return probes
    return ["comm" if p == "proxy" else p for p in probes]


def _comm_tap(probes: list[str], args, say) -> list[str]:
    """Off tcp:// the comm tap records the messages in place of the proxy or the tap (which asked for)."""
    from ...probes.registry import WIRE
    if args.protocol == "tcp" or "comm" in probes:
        return probes
    if args.delay_ms or args.server_cmd:
        raise SystemExit(f"daskprobe: --delay-ms and --server-cmd need the proxy, which cannot read {args.protocol}://")
    if any(p in WIRE for p in probes):  # proxy or tap
        say(f"{args.protocol}://: the messages are recorded by the comm tap inside Dask's processes (the proxy "
            "and the tap cannot read them)")
        return [p for p in probes if p not in WIRE] + ["comm"]
    return probes


def _private_network(spec, user, say) -> None:
    """ucx:// (PRIVATE_NETWORK): the run in a network namespace of its own, loopback only, before any
    thread or process starts (they inherit it); the cluster's Python must have distributed-ucxx."""
    import subprocess
    import threading
    from ...probes.base import is_root
    from ...probes.procs import own_network
    if not is_root():
        raise SystemExit(f"daskprobe: {spec.protocol}:// needs root: its listeners bind every interface and check "
                         "no peer, so the cluster and your command run in a network namespace of their own")
    if subprocess.run([spec.python, "-c", "import distributed_ucxx"], capture_output=True,
                      **(user.popen() if user else {})).returncode:
        raise SystemExit(f"daskprobe: {spec.protocol}:// needs distributed-ucxx in the cluster's Python "
                         f"({spec.python}): give one that has it with --python, and run your command with it")
    if threading.active_count() > 1:  # a thread started before would stay outside, and so its children
        raise SystemExit("daskprobe: internal error: threads started before the run's network namespace")
    own_network()
    say(f"{spec.protocol}://: the cluster and your command run in a network namespace of their own, loopback "
        "only (UCX listens on every interface and checks no peer): your command reaches no other host")


def _spec(args, probes: list[str]):
    from ...probes.base import is_root
    from ..capture.cluster import ClusterSpec
    if "tap" in probes and not is_root():
        raise SystemExit("daskprobe: the tap reads packets, which needs root (or CAP_NET_RAW): run as root, "
                         "or record through the proxy (--probes proxy,...)")
    try:
        return ClusterSpec(workers=args.workers, threads=args.threads, nanny=args.nanny, python=args.python,
                           server_cmd=args.server_cmd, config=options.parse_config(args.config),
                           proxy="proxy" in probes, tap="tap" in probes, proxy_delay_us=round(args.delay_ms * 1000),
                           start_timeout=args.start_timeout, scheduler=args.scheduler, worker=args.worker,
                           memory=args.memory_limit, protocol=args.protocol, comm_tap="comm" in probes,
                           workers_per_process=args.workers_per_process, scheduler_cpu=args.scheduler_cpu)
    except ValueError as e:
        raise SystemExit(f"daskprobe: {e}")
