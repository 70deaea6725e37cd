"""Options that several verbs share, declared once, and their checks."""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
from pathlib import Path

from ...probes import rates
from ...probes.rundir import RunDir


def bounded(kind, low: float, high: float, above: bool = False):
    """An argparse type: a finite number of `kind` from `low` (or, with `above`, above it) to `high`.
    The bounds keep a slip of the keyboard from starving the machine (a sampler at 1e9 Hz) or
    failing later with a traceback (a delay of 1e300 ms)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(v) or v < low or (above and v == low) or v > high:
            raise argparse.ArgumentTypeError(f"{text} is out of range: {'above' if above else 'from'} {low:g} to {high:g}")
        return v
    return parse


def bounded_list(kind, low: float, high: float):
    """An argparse type: a comma-separated list of at least one item, each as `bounded` checks it."""
    one = bounded(kind, low, high)

    def parse(text: str) -> list:
        if not comma_list(text):
            raise argparse.ArgumentTypeError("an empty list")
        return [one(t) for t in comma_list(text)]
    return parse


# every numeric option of run, attach and bench, with its bounds (docs/usage.md says them)
WORKERS = (int, 1, 1024)  # beyond MAX_PROCESSES only with several workers per process
THREADS = (int, 1, 256)
SAMPLE_RATE = (float, 1, 1000)  # Hz: each sample costs the sampled process a tick
CPU_HZ = (int, 1, 1000)
DELAY_MS = (float, 0, 60_000)
START_TIMEOUT_S = (float, 0, 3600, True)  # True: above the low bound
DURATION_S = (float, 0, 7 * 86400, True)
RUN_TIMEOUT_S = (float, 0, 7 * 86400, True)
REPEAT = (int, 1, 1000)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_size(text: str) -> int:
    """An argparse type: bytes as Dask writes them (4GB, 4 GiB, 4e9; 0: no limit), at most 1 PiB."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not m or m[2] not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (4GB, 4GiB, 4000000000; 0: no limit)")
    try:
        value = int(float(m[1]) * _UNITS[m[2]])
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size") from None
    if value > 2**50:
        raise argparse.ArgumentTypeError(f"{text} is out of range: at most 1 PiB")
    return value


def span(bounds: tuple) -> str:
    """The range a help text gives: "1-1000", or "up to 3600" where the low bound is open."""
    _, low, high, *above = bounds
    return f"up to {high:g}" if above else f"{low:g}-{high:g}"


def cluster(p: argparse.ArgumentParser, threads: int | None = None) -> None:
    """What the cluster's processes run with (run and bench)."""
    p.add_argument("--threads", type=bounded(*THREADS), default=threads,
                   help=f"threads per worker, {span(THREADS)} (default {threads})" if threads else
                   f"threads per worker, {span(THREADS)} (default: as LocalCluster, the machine's cores / workers, rounded up)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter that runs the scheduler and workers (default: this one)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="Dask config for every process (and the command), e.g. "
                        "distributed.scheduler.worker-saturation=inf; repeatable")
    p.add_argument("--scheduler-cpu", type=bounded(int, 0, 4095), default=None, metavar="CPU",
                   help="the scheduler alone on this CPU, the workers and the command on the others: its own core, "
                        "as on a cluster where it has a machine (hundreds of workers on this one then cannot take "
                        "its CPU; docs/scaling.md) (default: any process on any CPU)")


def probes(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--probes", default=default,
                   help="comma-separated probes: proxy (or tap), pyspy, proc, cpu, gil, offcpu, tcp; 'all' (every "
                        "probe but tap; "
                        "those this machine cannot run are skipped and recorded); 'default' (every probe, the "
                        "messages from the wire by the tap as root, else inside Dask's comms by the comm tap, through "
                        "the proxy with --delay-ms, --server-cmd, --nanny or --python) or 'none' for an untraced "
                        f"baseline (default {default})")


def sampling(p: argparse.ArgumentParser) -> None:
    """The samplers' rates, their defaults defined once (probes/rates.py)."""
    p.add_argument("--sample-rate", type=bounded(*SAMPLE_RATE), default=None,
                   help=f"Python stack samples per second and process, {span(SAMPLE_RATE)} "
                        f"(default {rates.SAMPLE_RATE:g}; {rates.PYSPY_SAMPLE_RATE:g} where py-spy reads the "
                        "cluster's interpreter, which costs more). Without root the default is lowered while "
                        "reading at it would cost over 1.5%% of the cluster's CPU; a rate given is kept")
    p.add_argument("--cpu-hz", type=bounded(*CPU_HZ), default=rates.CPU_HZ,
                   help=f"eBPF CPU samples per second per CPU, {span(CPU_HZ)} (default {rates.CPU_HZ})")


def run_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory (daskprobe run --out, or runs/<time>-<command>)")


def rules(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="extra function-to-category rules (TOML, see analyzers/rules/dask.toml); repeatable")


def parse_probes(text: str) -> list[str]:
    from ...probes.registry import ALL, NAMES, WIRE
    if text in ("all", "default"):  # run's default picks its message recorder later (run_verb._wire)
        return list(ALL)
    if text == "none":
        return []
    chosen = comma_list(text)
    unknown = sorted(set(chosen) - set(NAMES))
    if unknown:
        raise SystemExit(f"daskprobe: unknown probe(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    if len(set(WIRE) & set(chosen)) > 1:
        raise SystemExit(f"daskprobe: {', '.join(WIRE)} each record the messages: choose one")
    return chosen


def parse_config(pairs: list[str]) -> dict[str, str]:
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise SystemExit(f"daskprobe: --config wants KEY=VALUE, got {bad[0]!r}")
    return dict(p.split("=", 1) for p in pairs)


def comma_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def existing_run(path: str) -> RunDir:
    """A run directory to read or rebuild; as root in another user's, this process becomes that user."""
    from ...probes import users
    run = RunDir(path)
    if not (run / "run.json").exists():
        raise SystemExit(f"daskprobe: {run.path} is not a run directory (no run.json)")
    if who := users.work_as_owner_of(run.path):
        from ..capture.say import say
        say(f"{run.path} is {who.name}'s: working as {who.name}")
    return run


def new_run(RunDir, out: str | None, command: list[str]):
    """A new run directory, or a clear refusal (see RunDir.create)."""
    try:
        return RunDir.create(out, command)
    except OSError as e:  # exists, not ours, not a directory, a read-only or full filesystem
        raise SystemExit(f"daskprobe: --out: {e}")


def user(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--user", help=f"run {what} as this user (default: the user who ran sudo, else yourself; as "
                                  "root with no sudo, the system user 'daskprobe'); never root")


def runs_as(name: str | None, command: list[str], programs: list[str], dirs: list[str], what: str):
    """Who runs `what` (the user's command, and with run the cluster), once they can use the command, its
    files, `programs` and `dirs`: said before anything starts, or a clear refusal."""
    from ...probes import users
    from ..capture.say import say
    try:
        user = users.cluster_user(name)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"daskprobe: {e}")
    if user.is_us:
        return user
    needed = [shutil.which(command[0]) or command[0], *command[1:], *(shutil.which(x) or x for x in programs)]
    if cannot := users.unreadable(user, [os.getcwd(), *dirs], needed):
        raise SystemExit(f"daskprobe: {what} {_verb(what)} as user {user.name} (a Dask cluster runs code for whoever "
                         f"reaches it, and a client unpickles what it sends: never as root), who cannot use "
                         f"{', '.join(cannot)}. Run daskprobe through sudo from your own account, give --user NAME, "
                         "or make these readable (and directories searchable) by that user.")
    say(f"{what} {_verb(what)} as user {user.name} (uid {user.uid})")
    return user


def _verb(subject: str) -> str:
    return "run" if " and " in subject else "runs"


def missing_parents(out: str | None, command: list[str]) -> list[Path]:
    """The directories on the way to the run directory that do not exist yet (RunDir.create makes them)."""
    from ...probes.rundir import default_out
    path = Path(os.path.abspath(out or default_out(command))).parent
    return [d for d in [path, *path.parents] if not d.exists()]


def hand_over(path: Path, made: list[Path]) -> None:
    """Give the finished run directory, and the directories made on the way to it, to the user who ran
    daskprobe (through sudo: root's otherwise), private to them."""
    from ...probes import users
    owner = users.invoking()
    users.hand_over(path, owner)
    for d in made:
        if owner and d.is_dir() and not d.is_symlink():
            os.lchown(d, owner.uid, owner.gid)


def check_command(command: list[str]) -> None:
    """Refuse a command that cannot start before a cluster is started for it."""
    exe = command[0]
    if not (shutil.which(exe) or (os.sep in exe and os.access(exe, os.X_OK))):
        raise SystemExit(f"daskprobe: {exe}: no such command")
    script = next((a for a in command[1:] if not a.startswith("-")), None)
    if re.fullmatch(r"python[\d.]*", Path(exe).name) and script and command[1] == script \
            and not Path(script).exists():
        raise SystemExit(f"daskprobe: {script}: no such file (the script {exe} would run)")
