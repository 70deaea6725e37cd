"""run.json: what a run directory says about its run, key by key (probes/json_schema.py). RunDir
writes it (update_meta: a key or type not defined here is a bug) and reads it (meta: a Meta,
checked, with each key's default where an older daskprobe did not write it);
docs/run_json.md is rendered from here."""

from __future__ import annotations

from typing import Any

from . import rates
from .json_schema import Checked, Key as K, obj

NS = "ns on the run's clock (CLOCK_MONOTONIC)"

PROCESS = obj("process", "A process of the run, as the `processes` table has it.", *(
    K("name", str, "its name in the tables (scheduler, worker-0, proxy, client, probe:NAME, ...)"),
    K("role", str, "scheduler, worker, nanny, proxy, client or probe"),
    K("pid", int | None, "its pid (on another host, k·2^22 + its pid there); null if not found"),
    K("listen", str | None, "the address it listens on"),
    K("contact", str | None, "the proxy's address in front of it, where the others connect"),
    K("command", list[str] | None, "its command line"),
    K("host", str | None, "local, or the host it runs on (an attached cluster's member elsewhere)"),
    K("found_ns", int | None, f"when an attached recording found it ({NS}); null if there from the start"),
    K("left_ns", int | None, f"when an attached recording saw it gone ({NS}); null if it stayed"),
    K("joined_ns", int | None, "when it joined its host's agent, on that host's clock (ns)"),
))

CLUSTER = obj("cluster", "The cluster as asked for (run) or found (attach).", *(
    K("workers", int, "number of workers"),
    K("threads", int | None, "threads per worker; null if the workers differ (attach)"),
    K("nanny", bool | None, "workers under nannies; null if not known (attach)"),
    K("workers_per_process", int, "workers sharing one process (run --workers-per-process; its others' processes "
      "rows have no pid)", 1),
    K("memory_limit", int | None, "bytes per worker, 0 for none (run: --memory-limit, else the machine's memory / "
      "workers); null if not known (attach)"),
    K("proxy_delay_us", int, "delay the proxy added to each message, µs (--delay-ms)", 0),
    K("protocol", str, "the comms: tcp, tls, ws or ucx (run --protocol; off tcp, its messages are the comm "
      "tap's)", "tcp"),
    K("scheduler", str, "the scheduling policy (--scheduler: ws, random, ...)", "ws"),
    K("worker", str, "the worker mode (--worker: normal, zero)", "normal"),
    K("server_cmd", str | None, "the scheduler's own command (--server-cmd), if not Dask's"),
    K("scheduler_cpu", int | None, "the CPU the scheduler had to itself, the others' CPUs apart (run "
      "--scheduler-cpu); null: every process on any CPU"),
    K("worker_environ", dict[str, str] | None, "what each worker's environment held when it started, of what "
      "Dask's nanny sets first (distributed.nanny.pre-spawn-environ: OMP_NUM_THREADS, ...; daskprobe sets it "
      "in workers without a nanny); null if not known (attach)"),
    K("python", str, "the interpreter the cluster ran under (--python)"),
    K("user", str | None, "the user the cluster and the command ran as; null: as daskprobe"),
    K("uid", int, "that user's uid"),
    K("attached", str, "the scheduler's address, for an attached recording"),
))

CLOCK_ANCHOR = obj("clock_anchor", "One instant on both clocks: maps the run's ns to wall time.", *(
    K("monotonic_ns", int, "the instant on CLOCK_MONOTONIC, ns"),
    K("wall_ns", int, "the same instant on the wall clock (CLOCK_REALTIME), ns since the epoch"),
))

VERSIONS = obj("versions", "Versions of what ran.", *(
    K("daskprobe", str, "daskprobe's"),
    K("host", str, "the operating system (platform.platform())"),
    K("cluster", dict[str, str | None], "the cluster's interpreter: python, executable, and the versions of dask, "
      "distributed, tornado and msgpack (null: not installed)"),
))

CAPTURE = obj("capture", "What decoding the captures found (the tables stage).", *(
    K("messages", int, "Dask messages decoded"),
    K("ops", int, "ops in them (each op of a batch counts)"),
    K("dispatches", int, "compute-task ops (the attempts table's rows)"),
    K("malformed_streams", int, "directions of connections that sent bytes outside Dask's framing"),
    K("undecodable_messages", int, "messages whose ops could not be decoded"),
    K("torn_bytes", int, "bytes of a message cut by the capture's end"),
    K("lost_connections", int, "connections whose capture lost bytes"),
    K("arrived_before_sent", int, "messages between hosts whose arrival, on the run's clock, came before "
      "their sending (the hosts' clocks disagree)"),
    K("malformed_lines", dict[str, int], "per capture file (its path in the run directory), lines left out as "
      "malformed", {}),
))

STOPPED = obj("stopped", "Where a capture's writer stopped.", *(
    K("t_ns", int, f"when ({NS})"),
    K("at_bytes", int, "the capture's size then"),
    K("reason", str, "why (a full disk, ...)"),
))

LOST = obj("lost", "What a recorder's capture says it lost.", *(
    K("packets_dropped", int, "packets the kernel dropped (tap)"),
    K("gaps", int, "stretches of a connection's bytes not seen"),
    K("connections", int, "connections those gaps cut"),
    K("bytes_never_seen", int, "bytes in the gaps"),
    K("bytes_unread", int, "bytes after a gap left unread up to the next message boundary"),
    K("stopped", STOPPED, "where its writer stopped, and why"),
))

HOST = obj("host", "Another host whose agent captured its members (an attached recording).", *(
    K("number", int, "k: its processes' pids are k·2^22 + their pids there"),
    K("offset_ns", int, "our clock minus its, ns"),
    K("uncertainty_ns", int, "half the offset's spread, ns"),
    K("rtt_ns", int, "the shortest round trip of the clock exchanges, ns"),
    K("rtt_offset_ns", int, "the offset from the round trips, before the messages corrected it, ns"),
    K("clock_from", str, "messages: offset_ns was corrected by messages seen at both ends"),
    K("clock_stamps_set_aside", int, "stamps the messages' correction set aside"),
    K("timens_ns", int, "its agent's time namespace offset, ns"),
    K("complete", bool, "its captures were read to the end", False),
    K("error", str, "why not"),
    K("truncated", str, "its captures passed the size read from one host"),
    K("failed_reads", int, "reads of it that failed", 0),
    K("bad_replies", int, "replies of its agent refused as malformed", 0),
    K("members", list[PROCESS], "the processes its agent saw, its pids", []),
    K("skipped", dict[str, str], "probes its agent could not run there, and why", {}),
    K("sockets", dict[str, int], "address: pid of the sockets its agent saw", {}),
    K("host", str, "its host name"),
    K("agent_pid", int, "its agent's pid"),
    K("dir", str, "where its agent keeps its captures there"),
))

CLIENT_HOOK = obj("client_hook", "The client hook in the command (a run): what it reported.", *(
    K("reports", int, "reports read from it", 0),
    K("dropped", int, "reports dropped: malformed, too long, or too many", 0),
    K("errors", list[dict[str, str]], "its features that failed: what, and the error", []),
))

OWN_SHAPE = obj("own_cluster_shape", "The workers LocalCluster would have made of the keywords the command gave.", *(
    K("workers", int, "worker count"),
    K("threads", int | None, "threads per worker; null for no workers"),
    K("processes", bool, "true: worker processes (under nannies); false: threads of the command's process"),
    K("memory_limit", int | None, "bytes per worker; null: no limit"),
))

OWN_CLUSTER = obj("own_cluster", "A cluster the command made itself (the client hook's own-cluster feature; "
                  "tracer/capture/own_cluster.py), a scale of it, or another scheduler one of its Clients was given.", *(
    K("via", str, "what made it: LocalCluster, Client (with LocalCluster's keywords), or another cluster "
      "manager's class"),
    K("routed", bool, "true: it was given the recorded cluster instead; false: it ran as written, beside the "
      "recorded cluster, unrecorded"),
    K("asked", dict[str, str], "the keywords as the command wrote them (their reprs, cut short)"),
    K("shape", OWN_SHAPE | None, "the workers it asked for; null if LocalCluster would refuse the keywords"),
    K("differs", list[str], "what it asked for that the recorded cluster is not; [] if nothing"),
    K("match", str | None, "the run command whose cluster would be as asked; null if it is already (or attach)"),
    K("elsewhere", str, "the other scheduler a Client was given: its address, or its scheduler file"),
    K("scale", str, "a scale() on it (the workers asked for) or 'adapt': the recorded cluster stayed as it was"),
))

TRACE = obj("trace", "What writing the trace found.", *(
    K("samples_without_native_tid", int, "samples of a thread whose kernel tid was unknown"),
))

RUN_JSON = obj("run.json", "Every key of run.json. All may be absent: a run cut short (a signal, a full disk) "
               "has those written so far; a run directory from an older daskprobe lacks later keys. A reader "
               "takes a missing key's value from the column *if absent*.", *(
    K("partial", bool, "true until the session ended cleanly: a run cut short, or a probe stopped early", True),
    K("synthetic", bool, "made by experiments/synthetic.py from a model, not recorded", False),
    K("command", list[str], "the user's command ([] for an attach without one)", []),
    K("attached", str | None, "the scheduler's address, for an attached recording; null for a run"),
    K("started", str | None, "when the session started (local time, ISO 8601)"),
    K("ended", str | None, "when the session ended; null if it has not (or daskprobe was killed)"),
    K("clock_anchor", CLOCK_ANCHOR, "one instant on the run's clock and on wall time"),
    K("config", dict[str, Any], "Dask config set for the cluster (--config, the scheduler policy's)", {}),
    K("probes", list[str], "the probes asked for", []),
    K("skipped", dict[str, str], "probe (or messages): why it did not run", {}),
    K("sample_rate", float, "the Python sampler's rate, Hz (--sample-rate)", rates.SAMPLE_RATE),
    K("cpu_hz", float, "eBPF's CPU samples per second and CPU (--cpu-hz)", rates.CPU_HZ),
    K("cpus", int | None, "CPUs daskprobe could run on"),
    K("cluster", CLUSTER, "the cluster", {}),
    K("versions", VERSIONS, "versions of what ran", {}),
    K("processes", list[PROCESS], "the run's processes: the cluster, daskprobe, its probes' helpers, the command",
      []),
    K("scheduler_address", str | None, "where the command's client connected (DASK_SCHEDULER_ADDRESS)"),
    K("probes_ready_ns", int | None, f"from when the probes other than the proxy (which starts with the cluster) "
      f"cover the run ({NS})"),
    K("command_started_ns", int | None, f"when the command started ({NS})"),
    K("command_ended_ns", int | None, f"when the command's process was seen to exit, or recording ended (attach) "
      f"({NS})"),
    K("startup_s", dict[str, float], "wall seconds of each phase of starting", {}),
    K("teardown_s", dict[str, float], "wall seconds of each step of stopping", {}),
    K("interrupted", str | None, "the signal that ended the run early, with 'during start-up: the command never "
      "ran' if it came before the command started"),
    K("interrupted_after_s", float | None, "an attach --duration cut short: seconds recorded"),
    K("exit_code", int | None, "the command's exit code (128 + the signal if interrupted)"),
    K("killed", list[str], "cluster processes killed for not stopping within the grace after SIGTERM (5 s): a "
      "task still running, or a thread that is not a daemon keeping an interpreter up", []),
    K("probe_errors", dict[str, str], "probe (or agent@HOST): why it stopped early", {}),
    K("left", list[str], "workers that left an attached cluster while recording", []),
    K("unverified", dict[str, str], "members of an attached cluster not profiled: why", {}),
    K("agents_error", str | None, "why agents on other hosts could not start or be read"),
    K("hosts", dict[str, HOST], "host: its agent's entry (an attached recording with agents)", {}),
    K("task_stream_missing", int | None, "tasks that fell out of Dask's task stream before it was read"),
    K("task_stream_error", str | None, "why Dask's task stream could not be read"),
    K("skipped_per_process", list[str], "processes a sampler could not probe: 'PROCESS: why'", []),
    K("unread_files", list[str], "mapped files daskprobe-unwind did not read: 'PATH: why'", []),
    K("capture", CAPTURE, "what decoding the captures found", {}),
    K("lost", dict[str, LOST], "recorder (proxy or tap): what its capture lost; {} if nothing", {}),
    K("events_lost", dict[str, int], "probe (ebpf): events it took and lost (its ring buffer was full), all hosts'; "
      "{} if none", {}),
    K("both_ends_error", str | None, "why the agents' messages could not be merged with ours"),
    K("trace", TRACE, "what writing the trace found", {}),
    K("own_clusters", list[OWN_CLUSTER], "clusters the command made itself (LocalCluster(...), Client(n_workers=...)), "
      "given the recorded cluster instead or run beside it, and other schedulers its Clients were given", []),
    K("client_hook", CLIENT_HOOK, "what the client hook in the command reported", {}),
    K("finalize_errors", dict[str, str], "each stage of the last build that failed: its error", {}),
    K("finalize_seconds", dict[str, float], "each stage of the last build: its wall seconds (the trace's, written in "
      "a child beside the analysis, without its wait for the analysis' tables)", {}),
    K("finalized", bool, "every finalize stage ran", False),
))


class Meta(Checked):
    """run.json as read (RunDir.meta)."""
    KEYS = RUN_JSON
    WHAT = "run.json"


def markdown() -> str:
    """docs/run_json.md."""
    from .json_schema import markdown as page
    return page(RUN_JSON, "run.json", "A run directory's `run.json`: what the run was and what happened to it. "
                "`RunDir.update_meta` checks each key it writes against these definitions, `RunDir.meta` each "
                "key it reads. Times in ns are on the run's clock unless said.",
                "python -m daskprobe.dashboards.reference")
