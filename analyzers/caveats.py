"""What a run's numbers cannot be trusted for, in sentences for the terminal and the report: a
run still recording, a partial run, what the captures lost, jobs whose end was not recorded,
workers that ended during the makespan. From run.json and the summary only (pure)."""

from __future__ import annotations


def caveats(meta: dict, summary: dict, live_pid: int | None = None) -> list[str]:
    out = []
    if live_pid:
        out.append(f"built while the run was still recording (daskprobe pid {live_pid}): its captures end "
                   "mid-run; build it again once it has ended")
    elif meta.get("partial"):
        out.append("the run is partial: " + (_why_partial(meta) or "it did not end cleanly (run.json)"))
    for probe, lost in meta.get("lost", {}).items():
        out += _lost(probe, lost, meta)
    if n := meta.get("events_lost", {}).get("ebpf"):
        out.append(_ebpf_lost(n, meta.get("probes") or []))
    jobs = summary.get("jobs", [])
    if cut := [j for j in jobs if not j.get("complete", True)]:
        out.append(f"{len(cut)} of {len(jobs)} job(s) have no recorded end ({sum(j['untold'] for j in cut)} keys "
                   f"asked for were never told to the client: job(s) {', '.join(str(j['job']) for j in cut[:10])}): "
                   "their time after their last told key is uncategorized, not the client's")
    if n := summary.get("local_scheduler", {}).get("ignored_jobs"):
        out.append(f"{n} job(s) of a local scheduler ({', '.join(summary['local_scheduler']['schedulers'])}) ran "
                   "beside the cluster's and are not in the split (tables local_jobs and local_tasks have them)")
    for worker, at in summary.get("workers_ended_s", {}).items():
        out.append(f"{worker} ended at {at:.2f} s (its connections closed: it died or was retired): its idle "
                   "time counts until then")
    return out


def _why_partial(meta: dict) -> str:
    why = [f"{name} stopped early ({error})" for name, error in meta.get("probe_errors", {}).items()]
    if meta.get("killed"):
        why.append(f"{', '.join(meta['killed'])} had to be killed")
    if (code := meta.get("exit_code")) and code > 128:
        why.append(f"interrupted (exit code {code})")
    return "; ".join(why)


# What each eBPF kind's events feed: the figures a run that lost some of them cannot be trusted for.
EBPF_FIGURES = {
    "cpu": "the CPU samples (CPU by category, the scheduler's CPU from samples, the split of compute and "
           "bookkeeping)",
    "gil": "the GIL waits (gil_contention)",
    "offcpu": "the off-CPU intervals (thread states: cpu_starvation, runnable and blocked time)",
    "tcp": "the TCP segments (network time read from them)",
}


def _ebpf_lost(n: int, probes: list[str]) -> str:
    """The eBPF agent's events share one ring buffer: a loss may be of any kind it ran."""
    figures = [EBPF_FIGURES[k] for k in EBPF_FIGURES if k in probes] or list(EBPF_FIGURES.values())
    return (f"the eBPF agent lost {n:,} events (its ring buffer was full): not to be trusted: {'; '.join(figures)}. "
            "Unaffected: the messages and the critical path's times, and CPU from /proc (scheduler_cpu_per_task_s). "
            "Fewer workers or a lower --cpu-hz lose fewer")


def _lost(probe: str, lost: dict, meta: dict) -> list[str]:
    out = []
    if lost.get("gaps") or lost.get("packets_dropped"):
        out.append(f"the {probe} lost {lost['gaps']} stretch(es) of {lost['connections']} connection(s): the kernel "
                   f"dropped {lost['packets_dropped']} packets ({lost['bytes_never_seen']:,} bytes never seen, "
                   f"{lost['bytes_unread']:,} bytes unread until the next message): their messages are missing")
    if stopped := lost.get("stopped"):
        anchor = meta.get("command_started_ns") or meta.get("probes_ready_ns")
        when = f" {(stopped['t_ns'] - anchor) / 1e9:.2f} s into the command" if anchor else ""
        out.append(f"the {probe}'s capture stopped{when}, at {stopped['at_bytes']:,} bytes ({stopped['reason']}): "
                   "nothing after it was recorded")
    return out
