"""daskprobe's side of the client hook while the command runs (probes/client_hook: the hook in the
command's Python, and the pipe it reports on): each report, by its kind, to the handler that says
and records it. A feature of the hook that reports adds its handler to HANDLERS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...probes.client_hook import MAX_REPORTS, Channel
from ...probes.rundir import RunDir
from . import own_cluster
from .cluster import ClusterSpec
from .say import record, say


@dataclass
class Listener:
    """The pipe, and what a handler may use: the run it records into, daskprobe's cluster (None: an
    attached one), the command."""
    run: RunDir
    spec: ClusterSpec | None
    command: list[str]
    channel: Channel = field(default_factory=Channel)
    own_clusters: list[dict] = field(default_factory=list)  # run.json's own_clusters
    elsewhere: set[str] = field(default_factory=set)        # other schedulers the command's Clients went to
    errors: list[dict] = field(default_factory=list)        # the hook's features that failed

    def hear(self) -> None:
        """Hand the reports that came to their handlers (a kind no handler knows is ignored). A report
        comes from the command, and a handler failing on it must not cost the run: said, and on."""
        for report in self.channel.read():
            if handler := HANDLERS.get(report["kind"]):
                try:
                    handler(report, self)
                except Exception as e:
                    say(f"a client hook report ({report['kind']}) not understood: {type(e).__name__}: {e}")

    def ended(self) -> None:
        """The last reports, once the command has ended; what was dropped, said and kept in run.json.
        Whatever fails here must not cost the run."""
        try:
            self.hear()
            if self.channel.dropped:
                say(f"the client hook's reports: {self.channel.dropped} dropped "
                    f"(malformed, too long, or past {MAX_REPORTS})")
            self.record()
        except Exception as e:
            say(f"reading the client hook's reports failed: {type(e).__name__}: {e}")
        finally:
            self.channel.close()

    def record(self) -> None:
        """run.json's client_hook: reports read and dropped, the features that failed."""
        record(self.run, client_hook={"reports": self.channel.reports, "dropped": self.channel.dropped,
                                      "errors": self.errors})


def _error(report: dict, listener: Listener) -> None:
    # the hook said it on the command's stderr already; run.json keeps it
    listener.errors.append({"what": str(report.get("what"))[:200], "error": str(report.get("error"))[:500]})
    listener.record()


HANDLERS: dict[str, Callable[[dict, Listener], None]] = {
    "own-cluster": own_cluster.heard,
    "scale": own_cluster.scaled,
    "elsewhere": own_cluster.elsewhere,
    "hook-error": _error,
}
