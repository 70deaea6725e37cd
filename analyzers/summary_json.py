"""summary.json: the analysis' numbers, key by key (probes/json_schema.py). Its writer (write) checks
what it wrote against these, its readers (read) get a Summary: checked, each key's default where
an older daskprobe did not write it. DEFINITIONS (copied into summary.json, shown by `daskprobe
explain`) and docs/summary_json.md are rendered from here."""

from __future__ import annotations

import json
from typing import Any

from ..probes.json_schema import Checked, Key as K, check_written, obj
from ..probes.rundir import RunDir

SCHEMA = 2  # summary.json's own version, in it
FEW_SAMPLES = 20  # a share resting on fewer samples is marked as such

INTERVAL = obj("interval", "The samples a category's seconds rest on, and their 90% interval.", *(
    K("samples", int | None, "samples behind the shares taken from samples; null where none were (exact)"),
    K("lo", float, "the interval's low end, s"),
    K("hi", float, "its high end, s"),
    K("few_samples", bool, f"it rests on fewer than {FEW_SAMPLES} samples", False),
))

RECOMPUTED_PREFIX = obj("recomputed prefix", "A prefix's keys that finished again.", *(
    K("keys", int, "keys"),
    K("times", int, "extra computations"),
    K("compute_s", float, "their compute seconds"),
))

RECOMPUTED = obj("recomputed", "Keys that finished again after having finished before.", *(
    K("keys", int, "how many keys", 0),
    K("times", int, "how many extra computations", 0),
    K("compute_s", float, "their compute seconds", 0.0),
    K("by_prefix", dict[str, RECOMPUTED_PREFIX], "the same by prefix, most recomputed first", {}),
))

JOB = obj("job", "A computation the client submitted (see `jobs`).", *(
    K("job", int, "its number (the jobs table's job)"),
    K("start_s", float, "its start, seconds from the session's start"),
    K("makespan_s", float, "its makespan, s"),
    K("graphs", int, "update-graphs in it"),
    K("graph_bytes", int, "their bytes on the wire", 0),
    K("requested", int, "keys its graphs asked for"),
    K("tasks", int, "its tasks"),
    K("dispatches", int, "its compute-task messages"),
    K("end_key", str | None, "the key whose arrival at the client ended it"),
    K("complete", bool, "every key it asked for was told to the client", True),
    K("untold", int, "keys never told to the client", 0),
    K("recomputed", RECOMPUTED, "its recomputed keys", {}),
    K("critical_path_s", dict[str, float], "as the summary's, for this job", {}),
    K("critical_path_interval_s", dict[str, INTERVAL], "as the summary's, for this job", {}),
    K("critical_path_parts_s", dict[str, float], "as the summary's, for this job", {}),
))

CPU_CHECK = obj("cpu check", "A process's CPU seconds from samples against the kernel's.", *(
    K("reported_s", float, "CPU seconds from samples (cpu_by_category_s summed)"),
    K("proc_s", float | None, "CPU seconds from the kernel (the proc table); null without it"),
    K("ratio", float | None, "reported_s / proc_s"),
    K("on_cpu_samples", int, "the on-CPU samples behind reported_s"),
    K("samples_alone_s", float, "seconds of reported_s from samples without eBPF thread states"),
))

OVERHEAD = obj("overhead", "A distribution over finished tasks, seconds ({} without one).", *(
    K("mean", float, "mean"), K("p50", float, "median"), K("p90", float, "90th percentile"),
    K("p99", float, "99th percentile"), K("max", float, "largest"),
))

MOVED_KIND = obj("moved kind", "Task data moved by one kind of message.", *(
    K("bytes", int, "bytes on the wire"),
    K("messages", int, "messages"),
    K("mb_per_s", float | None, "MB/s over their time on the wire; null where that was under 1 ms in all"),
))

MOVED = obj("moved", "Task data sent from one worker to another.", *(
    K("bytes", int, "bytes on the wire", 0),
    K("by_kind", dict[str, MOVED_KIND], "by kind (get_data, shuffle_receive)", {}),
))

TASK_STREAM = obj("task stream", "What Dask's own task stream says.", *(
    K("tasks", int, "distinct keys computed"),
    K("span_s", float, "from the first compute span's start to the last's end, on the workers' wall clocks, s"),
    K("compute_s", float, "compute spans, summed, s"),
    K("compute_s_by_worker", dict[str, float], "the same by worker", {}),
    K("compute_s_by_prefix", dict[str, float], "the same by prefix (the 10 largest)", {}),
))

SAVING = obj("saving", "What a finding's advice would save, as the what-if model predicts it (docs/whatif.md): "
             "the measured makespan less the saving, or why the model cannot say (no number).", *(
    K("change", str | None, "the change of the model the advice amounts to, in words"),
    K("measured_s", float | None, "the run's makespan, s (the model's: the first job's start to the last's end)"),
    K("makespan_s", float | None, "the makespan predicted after the advice: measured_s less saving_s"),
    K("interval_s", list[float] | None, "its 90% interval [lo, hi], s: the replays' spread with resampled "
      "durations, widened by the unchanged replay's error"),
    K("saving_s", float | None, "seconds saved: the model's replay of the run unchanged less its replay changed "
      "(the same durations), so a change that alters nothing saves 0"),
    K("replay_error", float | None, "how far the unchanged replay was from the run (replay / measured - 1)"),
    K("not_modelled", str | None, "why the model cannot predict this advice's saving (then no number)"),
))

FINDING = obj("finding", "A cause the split says to change.", *(
    K("id", str, "what it is (recomputed, gil, ...)"),
    K("seconds", float, "seconds of the session it took"),
    K("interval_s", list[float] | None, "their 90% interval [lo, hi] where they rest on samples"),
    K("share", float, "seconds / session_s"),
    K("title", str, "what it is, in words"),
    K("evidence", str, "what shows it"),
    K("advice", str, "what to change"),
    K("what_if", dict[str, Any] | None, "the change of the what-if model the advice amounts to, as "
      "analyzers/whatif's Changes (workers, threads, cores, load, gil, network, decisions, blocked, client, "
      "at_median); null where the model cannot express it"),
    K("saving", SAVING, "what the advice would save, predicted once in the analysis", {}),
))

LOCAL_JOB = obj("local job", "Which local scheduler ran a job.", *(
    K("scheduler", str, "threads, processes or sync: where its tasks ran (other threads of the loop's process, "
      "other processes, the loop's own thread)"),
    K("pool", int, "threads or processes seen running its tasks"),
    K("per_task_mean_s", dict[str, float | None], "as local_scheduler's, over its tasks", {}),
    K("overhead_per_task_s", float | None, "as local_scheduler's, over its tasks"),
))

LOCAL_SCHEDULER = obj("local scheduler", "A run of Dask's local schedulers (no cluster).", *(
    K("schedulers", list[str], "the schedulers that ran its jobs", []),
    K("pool", int, "the largest pool among them", 0),
    K("by_job", dict[str, LOCAL_JOB], "per job (its number)", {}),
    K("tasks_timed", int, "finished tasks whose run in the pool was recorded", 0),
    K("per_task_mean_s", dict[str, float | None], "means over those tasks, s: ready_to_dispatch_s (ready to "
      "dispatched: waiting for a pool thread), hand_over_s (dispatched to its thread taking it), unpack_s, "
      "compute_s, pack_s, take_in_s (its result leaving the pool to the loop having taken it in); wall time, "
      "waits for the GIL or a CPU included", {}),
    K("overhead_per_task_s", float | None, "hand_over_s + unpack_s + pack_s + take_in_s: a task's time around its "
      "compute, from its dispatch to its result taken in"),
    K("ignored_jobs", int, "in a run with a cluster's jobs too: the local jobs, not analysed (tables local_jobs, "
      "local_tasks)", 0),
))

SUMMARY = obj("summary.json", "Every key of summary.json. A run without a job (or whose messages could not be "
              "read) has `error` and few others; a reader takes a missing key's value from the column *if absent*.", *(
    K("schema", int, "summary.json's version", SCHEMA),
    K("definitions", dict[str, str], "the definitions below and the categories', as text", {}),
    K("run", str | None, "the run directory"),
    K("error", str | None, "why there is nothing to measure (no job, no messages)"),
    K("caveats", list[str], "what the reader of these numbers must know (a partial run, lost messages, ...)", []),
    K("task_stream", TASK_STREAM,
      "where the messages could not be read (attach to tls://, or without root), what Dask's own task "
      "stream says: tasks (distinct keys computed), span_s (seconds from the first compute span's start "
      "to the last's end, on the workers' wall clocks), compute_s (seconds of compute spans, summed), "
      "compute_s_by_worker and compute_s_by_prefix (the 10 largest), in seconds", {}),
    K("command_s", float | None,
      "seconds from the command's start to its process's exit (wall time, on run's clock; not for an "
      "attach), with its interpreter's start and imports: what a run without probes (--probes none) "
      "still measures"),
    K("session_s", float | None,
      "seconds from the client's first byte to its last at the proxy (widened to hold every job): the "
      "span the critical-path split covers"),
    K("session_window_ns", list[int] | None, "the session's start and end, ns on the run's clock"),
    K("makespan_s", float | None,
      "seconds from the first byte of the client's first update-graph at the proxy to the end of its "
      "last job (the last key that job asked for reaching the client)"),
    K("window_ns", list[int] | None, "the makespan's start and end, ns on the run's clock"),
    K("jobs", list[JOB],
      "the computations the client submitted: a job runs from the first byte of an update-graph until "
      "the last key it asks for is told to the client; graphs in the cluster at the same time (a futures "
      "loop) are one job. Each has its own makespan_s, tasks, critical_path_s and recomputed keys; "
      "complete is false when, in a run that did not record every message, some of its keys (untold) "
      "were never told: its end may be among what was lost, and its time after its last told key, to "
      "the next job or the client's last message, is uncategorized", []),
    K("tasks", int | None, "computations of a key in a job (a key computed in two jobs counts twice), over all jobs"),
    K("dispatches", int | None,
      "compute-task messages the scheduler sent (a task stolen or rescheduled is dispatched again)"),
    K("aot_s", float | None,
      "average overhead per task as in Böhm & Beránek: the jobs' makespans (summed; the client's time "
      "between jobs left out) / tasks, in seconds"),
    K("compute_s", float | None,
      "sum over finished dispatches of the worker's compute span (stop - start), in seconds"),
    K("messages", int | None, "Dask messages seen by the proxy in the makespan window (a batch counts once)"),
    K("ops", int | None, "ops in those messages (each op of a batch counts)"),
    K("ops_by_name", dict[str, int], "those ops by op", {}),
    K("messages_per_task", float | None, "messages / tasks"),
    K("bytes_per_task", float | None, "bytes on the wire (framing included) in the makespan window / tasks"),
    K("critical_path_s", dict[str, float],
      "the session split along each job's critical path, plus the client's time between jobs, "
      "in seconds per category; they sum to session_s", {}),
    K("critical_path_interval_s", dict[str, INTERVAL],
      "per category: the count of samples its seconds rest on and their 90% interval "
      "(sampling error of the shares taken from samples; exact where samples=0)", {}),
    K("critical_path_parts_s", dict[str, float],
      "the same split by finer part (kind: part) and category, in seconds", {}),
    K("recomputed", RECOMPUTED,
      "keys that finished again after having finished before (in an earlier job or earlier in the "
      "same job): how many keys, how many extra computations, their compute seconds, by prefix", {}),
    K("cpu_by_category_s", dict[str, dict[str, float]],
      "per process, CPU seconds in the makespan window by category: on-CPU samples, each "
      "standing for the time since its process's previous read (Python sampler) or 1/cpu_hz "
      "(eBPF); a worker's samples inside a task's compute span on its thread are compute", {}),
    K("cpu_check", dict[str, CPU_CHECK],
      "per process, CPU seconds in the makespan window from samples (cpu_by_category_s summed) and "
      "from the kernel (the process's CPU clock, as the proc table has it), their ratio, and the on-CPU "
      "samples behind the first", {}),
    K("worker_idle_s", dict[str, float],
      "per worker, seconds of the makespan in which it held no task (between a compute-task "
      "arriving and its task-finished leaving); a worker that ended in it, only until then", {}),
    K("workers_ended_s", dict[str, float],
      "workers whose every connection closed before the makespan's end (died, or retired): "
      "when the last closed, in seconds from the session's start", {}),
    K("task_overhead_s", OVERHEAD,
      "distribution over finished tasks of their overhead, in seconds: (task-finished reaching the "
      "scheduler - the task being ready) less its compute span and its waiting (from ready to its "
      "compute-task leaving the scheduler, and on the worker from its arrival and inputs to its "
      "start); ready = the later of its last dependency's task-finished reaching the scheduler and "
      "its graph's last byte", {}),
    K("moved", MOVED,
      "task data sent from one worker to another (table transfers: get_data replies, P2P shuffle and "
      "rechunk shuffle_receive requests): bytes on the wire, and by kind bytes, messages and MB/s over their "
      "time on the wire (first to last byte; null where that was under 1 ms in all)", {}),
    K("scheduler_cpu_per_task_s", float | None,
      "scheduler CPU seconds (the proc table's: its CPU clock) in the makespan window / tasks"),
    K("findings", list[FINDING],
      "what the split says to change: each cause that took at least 10% of the session (and any "
      "recomputed keys), with its seconds (90% interval where they rest on samples), share of "
      "session_s, evidence and advice; ordered by seconds", []),
    K("thread_states", str | None,
      "where the split of time inside processes took the event-loop thread's state from: 'ebpf' "
      "(on/off-CPU and GIL waits, exact) or 'samples' (the sampler's flag; GIL waits and CPU "
      "starvation then cannot be told apart from idle)"),
    K("local_scheduler", LOCAL_SCHEDULER, "a run whose command computed with a local scheduler (threads, processes, "
      "sync) instead of daskprobe's cluster: what ran it, and a task's time from its dispatch to its result "
      "(analyzers/local.py)", {}),
))

# What `daskprobe explain` and summary.json's `definitions` say: the numbers, not the file's bookkeeping.
DEFINITIONS = {k.name: k.doc for k in SUMMARY.keys.values() if k.name not in ("schema", "definitions", "run")}


class Summary(Checked):
    """summary.json as read (read)."""
    KEYS = SUMMARY
    WHAT = "summary.json"


def dumps(summary: dict) -> str:
    return json.dumps(summary, indent=2, default=_json)


def _json(v):
    """numpy's numbers as JSON's; NaN (not equal to itself) as null."""
    return None if v != v else (int(v) if hasattr(v, "__int__") else str(v))


def write(run: RunDir, summary: dict) -> None:
    """summary.json, written whole, then checked: a key that does not fit costs no number (it is said;
    raised in the tests)."""
    text = dumps(summary)
    run.write_file("summary.json", text)
    check_written(text, SUMMARY, "summary.json")


def read(run: RunDir) -> Summary:
    return Summary.parse((run / "summary.json").read_text())


def markdown() -> str:
    """docs/summary_json.md."""
    from ..probes.json_schema import markdown as page
    return page(SUMMARY, "summary.json", "A run directory's `summary.json`: the analysis' numbers (`daskprobe "
                "explain NAME` says one). `daskprobe build` and `report` check each key they write against "
                "these definitions; readers check what they read.", "python -m daskprobe.dashboards.reference")
