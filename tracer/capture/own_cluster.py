"""The command made its own cluster (LocalCluster(...), Client(n_workers=...)) and the client hook
(probes/client_hook/daskprobe_hook_own_cluster.py) gave it the recorded cluster instead: said at once,
with what differs from what it asked and the `run` options that would match, and again after the
summary; kept in run.json's `own_clusters`. So are the clusters and schedulers it used beside the
recorded one, and its scale() calls. A report comes from the command (its user's process): every
field is checked, and what is shown is cut short and stripped of control characters."""

from __future__ import annotations

import re
import shlex

from .cluster import ClusterSpec, machine_memory
from .say import record, say

MAX_TEXT = 80


def heard(report: dict, ctx) -> None:
    """An own-cluster report: said, kept. `ctx` is a client_hook.Listener."""
    via, asked = _text(report.get("via"), 40), _asked(report.get("asked"))
    call = f"{via}({', '.join(f'{k}={v}' for k, v in asked.items())})"
    if report.get("routed") is not True:
        say(f"your command started its own {via} (not a LocalCluster daskprobe can stand in for): it runs beside "
            f"{_recorded(ctx)}, which records none of its work, and both share the CPUs")
        _keep(ctx, {"via": via, "routed": False})
        return
    listed = report.get("ignored")
    ignored = [k for k in listed if isinstance(k, str) and k in asked] if isinstance(listed, list) else []
    shape, spec = _shape(report.get("shape")), ctx.spec
    if spec is None:  # attach: the cluster is not daskprobe's to shape
        differs = [_wanted(shape) if shape else "a shape LocalCluster would refuse"] + \
            ([f"{', '.join(f'{k}={asked[k]}' for k in ignored)} (ignored)"] if ignored else [])
        match, ours = None, "the attached cluster instead, which records its work"
    else:
        differs = _differs(shape, spec, asked, ignored) if shape else ["a shape LocalCluster would refuse"]
        match, ours = _match(shape, spec, ctx.command, asked) if shape else None, \
            f"daskprobe's cluster instead, which records its work: {_ours(spec)}"
    say(f"your command's {call} runs on {ours}; "
        "its scheduler in a process of its own (LocalCluster's runs in your script's)"
        + (f"\n  it asked for {'; '.join(differs)}" if differs else "\n  its workers are as it asked")
        + (f"\n  to match: {match}" if match else ""))  # one write: the command's own lines stay apart
    _keep(ctx, {"via": via, "routed": True, "asked": asked, "shape": shape, "differs": differs, "match": match})


def elsewhere(report: dict, ctx) -> None:
    """A Client given another scheduler than the recorded one: said once per address, kept."""
    where = _text(report["address"], 120) if "address" in report else \
        f"the scheduler its scheduler file names ({_text(report.get('scheduler_file'), 120)})"
    if where in ctx.elsewhere:
        return
    ctx.elsewhere.add(where)
    say(f"your command's Client connects to {where}, not {_recorded(ctx)}: nothing of it is recorded (a plain "
        f"Client() connects to {_recorded(ctx)}; a cluster already running: daskprobe attach ADDRESS -- ...)")
    _keep(ctx, {"via": "Client", "routed": False, "elsewhere": where})


def remind(run) -> None:
    """After the summary: its figures are of the cluster the command got, not of the one it asked for (said
    at once too, but scrolled away since), nor of what ran elsewhere. From run.json, as written above."""
    said = []
    for e in run.meta().get("own_clusters", []):
        if e.get("routed") is True and e.get("differs"):
            line = (f"note: the figures above are of the cluster your command got, not of its {e.get('via')} as asked "
                    f"({'; '.join(e['differs'])})" + (f"; to match: {e['match']}" if e.get("match") else ""))
        elif e.get("routed") is False:
            line = f"note: your command's {e.get('elsewhere') or e.get('via')} is not in the figures above (it ran " \
                   "beside the recorded cluster)"
        else:
            continue
        if line not in said:
            said.append(line)
            say(line)


def scaled(report: dict, ctx) -> None:
    """scale() or adapt() on the cluster daskprobe stands in: said, kept; nothing changes."""
    spec, via = ctx.spec, _text(report.get("via"), 40)
    n = report.get("n")
    asked = f"{n} worker(s)" if _count(n) is not None else "adaptive scaling" if "adapt" in report else "a scale"
    if spec is None:
        say(f"your command's {via} asked for {asked}: the attached cluster stays as it is")
    else:
        say(f"your command's {via} asked for {asked}: daskprobe's cluster stays at {spec.workers} worker(s)"
            + (f" (daskprobe run --workers {n} ... to have them)" if _count(n) and n != spec.workers else ""))
    _keep(ctx, {"via": via, "scale": _text(n, 20) if "n" in report else "adapt"})


def _recorded(ctx) -> str:
    return "the attached cluster" if ctx.spec is None else "daskprobe's cluster"


def _wanted(shape: dict) -> str:
    """The workers LocalCluster would have made, in words."""
    how = "processes under nannies" if shape["processes"] else "threads of your script's process, over inproc://"
    return f"{shape['workers']} worker(s) x {shape['threads']} thread(s) as {how}, {_size(shape['memory_limit'])} each"


def _ours(spec: ClusterSpec) -> str:
    return (f"{spec.workers} worker process(es) x {spec.threads} thread(s), {'under nannies' if spec.nanny else 'no nanny'}, "
            f"{_size(spec.memory_limit())} each, over tcp://")


def _differs(shape: dict, spec: ClusterSpec, asked: dict, ignored: list[str]) -> list[str]:
    out = []
    if shape["workers"] is not None and shape["workers"] != spec.workers:
        out.append(f"{shape['workers']} worker(s)")
    if shape["threads"] is not None and shape["threads"] != spec.threads:
        out.append(f"{shape['threads']} thread(s) each")
    if not shape["processes"]:
        out.append("its workers as threads of your script's process, over inproc:// (daskprobe's are processes "
                   "of their own, each profiled)")
    elif not spec.nanny:
        out.append("its workers under nannies (as LocalCluster's processes)")
    # both the machine's memory / workers ("auto"): --workers makes them the same
    if (_memory_option(shape, asked) is not None or spec.memory is not None) and \
            not _near(shape["memory_limit"] or 0, spec.memory_limit()):
        out.append(f"{_size(shape['memory_limit'])} per worker")
    if ignored:
        out.append(f"{', '.join(f'{k}={asked[k]}' for k in ignored)} (ignored)")
    return out


def _match(shape: dict, spec: ClusterSpec, command: list[str], asked: dict) -> str | None:
    """The run options that give the workers asked for (as near as daskprobe goes: its workers are
    always processes), or None if they are those already."""
    workers = shape["workers"] or spec.workers
    threads = shape["threads"] or spec.threads
    nanny = shape["processes"]
    memory = _memory_option(shape, asked)
    same_memory = memory == spec.memory or (memory is not None and spec.memory is not None and _near(memory, spec.memory))
    if (workers, threads, nanny) == (spec.workers, spec.threads, spec.nanny) and same_memory:
        return None
    opts = f"--workers {workers} --threads {threads}" + (" --nanny" if nanny else "") + \
        (f" --memory-limit {memory}" if memory is not None else "")
    return f"daskprobe run {opts} -- {_text(shlex.join(command), 200)}"


def _memory_option(shape: dict, asked: dict) -> int | None:
    """--memory-limit's value for the memory asked for (0: none), or None where run's default (the
    machine's memory / workers, LocalCluster's "auto") gives it."""
    if shape["memory_limit"] is None:
        return 0 if "memory_limit" in asked else None
    auto = machine_memory() // (shape["workers"] or 1)
    return None if _near(shape["memory_limit"], auto) else shape["memory_limit"]


def _near(a: int, b: int) -> bool:
    # Dask's memory is cgroup-aware, ours /proc/meminfo's: the same share differs by a little
    return abs(a - b) <= 0.02 * max(a, b)


def _keep(ctx, entry: dict) -> None:
    ctx.own_clusters.append(entry)
    record(ctx.run, own_clusters=ctx.own_clusters)


def _asked(value) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {_text(k, 40): _text(v, MAX_TEXT) for k, v in list(value.items())[:30]}


def _shape(value) -> dict | None:
    """The shape reported, if every field is what it must be; else None (nothing of it is shown)."""
    if not isinstance(value, dict):
        return None
    shape = {"workers": _count(value.get("workers")), "threads": _count(value.get("threads")),
             "processes": value.get("processes"), "memory_limit": value.get("memory_limit")}
    ok = (isinstance(shape["processes"], bool) and shape["workers"] is not None
          and (value.get("threads") is None or shape["threads"] is not None)
          and (shape["memory_limit"] is None or (type(shape["memory_limit"]) is int and 0 < shape["memory_limit"] < 2**60)))
    return shape if ok else None


def _count(value) -> int | None:
    return value if type(value) is int and 0 <= value <= 100_000 else None


def _text(value, limit: int) -> str:
    text = re.sub(r"[^\x20-\x7e]", "?", str(value))  # the command's text on our terminal: no escapes
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _size(nbytes: int | None) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes else "no memory limit"
