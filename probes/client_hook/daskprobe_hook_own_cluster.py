"""A command's own cluster, run on daskprobe's: the client hook's feature for `LocalCluster(...)` and
`Client(n_workers=..., ...)` (a Client given LocalCluster's keywords makes one).

Left alone, such a command would start a second cluster beside daskprobe's (which then sits idle,
its processes competing for the CPUs) and go unrecorded; and a Client with LocalCluster's keywords
fails outright, since daskprobe's DASK_SCHEDULER_ADDRESS makes distributed refuse them. Once the
command imports distributed, this feature makes LocalCluster(...) return a DaskprobeCluster (a
distributed Cluster whose scheduler is daskprobe's, already running, with its workers), and gives a
Client with cluster keywords one of those. It reports what was asked (the keywords, and the shape
LocalCluster would have made of them) to daskprobe, which says at once what it did and what differs.

Closing the DaskprobeCluster (close(), its `with` block, the Client that made it, Client.shutdown())
closes only its connections: daskprobe's cluster runs on to the end of the run. scale() and adapt()
are reported and change nothing. A LocalCluster subclass, or any other cluster manager, is not
replaced (its own code may need its own processes): it is reported as running beside daskprobe's
cluster; so is a Client given another scheduler's address or a scheduler file.
"""

from __future__ import annotations

import os

import daskprobe_hook as hook

SHAPE = ("n_workers", "threads_per_worker", "processes", "memory_limit", "worker_class")  # what daskprobe compares
KEPT = ("asynchronous", "loop", "name", "scheduler_sync_interval", "silence_logs")  # honoured, or no matter


def install() -> None:
    scheduler = os.environ.get(hook.ENV_SCHEDULER)
    if scheduler:
        hook.on_import("distributed", lambda _: _patch(scheduler))


def _patch(scheduler: str) -> None:
    import inspect

    from distributed.client import Client
    from distributed.deploy.cluster import Cluster
    from distributed.deploy.local import LocalCluster

    routed = _cluster_class(scheduler, LocalCluster)
    new = LocalCluster.__new__

    def __new__(cls, *args, **kwargs):
        if cls is LocalCluster:
            return routed("LocalCluster", *args, **kwargs)  # not a LocalCluster: Python skips its __init__
        return new(cls) if new is object.__new__ else new(cls, *args, **kwargs)

    LocalCluster.__new__ = staticmethod(__new__)

    cluster_init = Cluster.__init__

    def cluster__init__(self, *args, **kwargs):
        # any other cluster manager (a LocalCluster subclass, SpecCluster, SSHCluster...) runs as written
        if not isinstance(self, routed):
            hook.send("own-cluster", via=type(self).__name__, routed=False)
        cluster_init(self, *args, **kwargs)

    cluster__init__.__wrapped__ = cluster_init
    Cluster.__init__ = cluster__init__

    init = Client.__init__
    signature = inspect.signature(init)
    extra = next(p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD)

    def __init__(self, *args, **kwargs):
        try:
            bound = signature.bind_partial(self, *args, **kwargs)
        except TypeError:
            bound = None  # Client's own error, below
        a = bound.arguments if bound else {}
        if not (a.get(extra) and a.get("address") is None and a.get("scheduler_file") is None):
            _elsewhere(a.get("address"), a.get("scheduler_file"), scheduler)
            return init(self, *args, **kwargs)  # a plain Client(), or one given an address: as ever
        asked = a.pop(extra)
        a["address"] = routed("Client", **{k: a[k] for k in ("asynchronous", "loop") if k in a}, **asked)
        init(*bound.args, **bound.kwargs)
        self._start_arg = None  # the client closes it as it would the LocalCluster it made

    __init__.__wrapped__ = init
    __init__.__doc__ = init.__doc__
    Client.__init__ = __init__


def _elsewhere(address, scheduler_file, scheduler: str) -> None:
    """Report a Client given another scheduler's address (or a scheduler file): nothing of it is recorded."""
    if scheduler_file is not None:
        hook.send("elsewhere", scheduler_file=str(scheduler_file)[:200])
    elif isinstance(address, str) and _resolved(address) != _resolved(scheduler):
        hook.send("elsewhere", address=address[:200])


def _resolved(address: str) -> str:
    from distributed.comm.addressing import normalize_address, resolve_address
    try:
        return resolve_address(normalize_address(address))
    except Exception:  # noqa: BLE001 - an address Dask cannot parse: the Client says so itself
        return address


def _cluster_class(scheduler: str, LocalCluster):
    import asyncio
    import atexit
    import inspect
    import weakref

    from distributed.core import Status, rpc
    from distributed.deploy.cluster import Cluster
    from distributed.security import Security

    signature = inspect.signature(LocalCluster.__init__)
    instances = weakref.WeakSet()

    class DaskprobeCluster(Cluster):
        """The LocalCluster the command asked for, standing on daskprobe's cluster (already running):
        its scheduler and workers are daskprobe's, recorded; closing this closes its connections only."""

        def __init__(self, via: str, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)  # LocalCluster's own TypeError for a wrong call
            asked = {k: v for k, v in bound.arguments.items() if k != "self"}
            asked.update(asked.pop(next(p.name for p in signature.parameters.values()
                                        if p.kind is p.VAR_KEYWORD), None) or {})
            shape = _shape(asked)
            self.processes = shape["processes"] if shape else asked.get("processes") is not False
            self.security = Security()
            self._name = "DaskprobeCluster"
            super().__init__(asynchronous=asked.get("asynchronous", False), loop=asked.get("loop"),
                             name=asked.get("name"), scheduler_sync_interval=asked.get("scheduler_sync_interval", 1))
            self.scheduler_comm = rpc(scheduler, connection_args=self.security.get_connection_args("client"))
            self._via = via
            hook.send("own-cluster", via=via, routed=True, scheduler=scheduler, asked=_said(asked), shape=shape,
                      ignored=[k for k in _said(asked) if k not in SHAPE + KEPT])
            instances.add(self)
            if not self.called_from_running_loop:
                self._loop_runner.start()
                self.sync(self._start)

        def __await__(self):
            async def start():
                if self.status == Status.created:
                    await self._start()
                return self
            return start().__await__()

        async def _start(self):
            if self.status != Status.created:
                return
            self.status = Status.starting
            try:  # a --server-cmd scheduler may not know the ops a Cluster watches its workers with
                await asyncio.wait_for(super()._start(), 30)
            except Exception as e:  # noqa: BLE001
                hook.send("hook-error", what="DaskprobeCluster: watching the workers", error=repr(e)[:500])
            self.status = Status.running

        def close(self, timeout=None):
            aw = super().close(timeout)
            if not self.asynchronous:
                self._loop_runner.stop()
            return aw

        def scale(self, n: int = 0, memory=None, cores=None) -> None:
            hook.send("scale", via=self._via, n=n if isinstance(n, int) else repr(n)[:80])

        def adapt(self, *args, **kwargs):
            hook.send("scale", via=self._via, adapt=_said(kwargs))
            return None

    @atexit.register
    def _close_all():
        for c in list(instances):
            if c.status == Status.running:
                try:
                    c.close(timeout=10)
                except Exception:  # noqa: BLE001 - at exit, as SpecCluster's own
                    pass

    return DaskprobeCluster


def _said(asked: dict) -> dict[str, str]:
    """The keywords as the command wrote them (reprs, cut short): daskprobe shows them, never parses them."""
    return {str(k)[:40]: repr(v)[:80] for k, v in list(asked.items())[:30]}


def _shape(asked: dict) -> dict | None:
    """The workers LocalCluster would have started for these keywords (its own rules, distributed's
    functions): count, threads each, processes or threads of the command's, memory limit each. None
    for keywords LocalCluster itself would refuse (it is not there to say so: daskprobe says them)."""
    try:
        return _shape_of(asked)
    except Exception:  # noqa: BLE001
        return None


def _shape_of(asked: dict) -> dict:
    import logging

    from dask.system import CPU_COUNT
    from distributed.deploy.utils import nprocesses_nthreads
    from distributed.nanny import Nanny
    from distributed.worker_memory import parse_memory_limit

    n, threads = asked.get("n_workers"), asked.get("threads_per_worker")
    processes = asked.get("processes")
    if processes is None:
        cls = asked.get("worker_class")
        processes = cls is None or (isinstance(cls, type) and issubclass(cls, Nanny))
    if n is None and threads is None:
        n, threads = nprocesses_nthreads() if processes else (1, CPU_COUNT)
    if n is None:
        n = max(1, CPU_COUNT // threads) if processes else 1
    if threads is None:
        threads = max(1, -(-CPU_COUNT // n)) if n else None
    quiet = logging.getLogger("daskprobe.hook")
    try:
        memory = (parse_memory_limit(asked["memory_limit"], threads or 1, logger=quiet) if "memory_limit" in asked
                  else parse_memory_limit("auto", 1, n, logger=quiet) if n else None)
    except Exception:  # noqa: BLE001 - what the worker would refuse; daskprobe says what was asked
        memory = None
    return {"workers": n, "threads": threads, "processes": bool(processes), "memory_limit": memory}
