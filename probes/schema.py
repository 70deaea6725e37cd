"""The tables of a run directory: what a row of each is and, per column, its dtype,
unit and definition. RunDir.write_table checks every table against these on write
(conform), and docs/tables.md is rendered from them (its intro says what the dtypes
and units mean):

    python -m daskprobe.probes.schema          # rewrite docs/tables.md
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
from pandas.api.types import infer_dtype

from .json_schema import SchemaError  # one error for tables and JSON files

DOC = Path(__file__).resolve().parent.parent / "docs" / "tables.md"
MONO = "monotonic ns"


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str
    unit: str
    doc: str


@dataclass(frozen=True)
class Table:
    doc: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


C = Column
PID = C("pid", "int64", "", "process id")
TID = C("tid", "int64", "", "thread id (the kernel's; on another host, as its pid: k·2^22 + the tid there)")
PROCESS = C("process", "str", "", "the process's name in `processes`; null if the pid is none of the run's")
HOST = C("host", "str", "", "the host the process ran on: local (daskprobe's), or the host of its address "
         "(run.json `hosts`: the agent there and its clock offset)")
CAPTURED_ON = C("host", "str", "", "the host whose capture it comes from: local (daskprobe's), or another host "
                "whose agent captured it (run.json `hosts`)")
# Pids are the run's: pid P on the k-th host with an agent (run.json `hosts`, `number`) is k·HOST_PID + P,
# since two hosts may run processes with the same pid (containers: every worker may be pid 7). Linux pids
# are below 2^22 (PID_MAX_LIMIT), and so the run's stay in the int32 that Perfetto's pids are, up to 511 hosts.
HOST_PID = 1 << 22
ATTEMPT = (
    C("key", "str", "", "the task's key, as a string"),
    C("attempt", "int64", "", "0 for the key's first dispatch, 1 for its second, …"),
    C("run_id", "Int64", "", "the scheduler's run_id for this dispatch; null where the protocol has none "
      "(distributed before 2022)"),
    C("worker", "str", "", "the worker it was sent to"),
    C("deps", "list[str]", "", "keys of its dependencies (the compute-task's who_has)"),
    C("compute_sent_ns", "int64", MONO, "the compute-task's first byte at the proxy"),
    C("compute_recv_ns", "int64", MONO, "the compute-task's last byte at the proxy"),
    C("finished_sent_ns", "Int64", MONO, "its task-finished's (or task-erred's) first byte at the proxy; null "
      "without a result"),
    C("finished_recv_ns", "Int64", MONO, "that result's last byte at the proxy"),
    C("nbytes", "Int64", "bytes", "size of the result, as the worker reported it"),
    C("thread", "Int64", "", "Python identifier (threading.get_ident) of the worker thread that ran it, as "
      "samples.ident"),
    C("compute_start_ns", "Int64", MONO, "start of the worker's compute span (its startstops, on the run's clock, "
      "scheduler_delay_ns taken off); null if not reported or impossible"),
    C("compute_stop_ns", "Int64", MONO, "end of that compute span"),
    C("transfer_start_ns", "Int64", MONO, "start of the worker's span fetching the task's inputs; null if none"),
    C("transfer_stop_ns", "Int64", MONO, "end of that transfer span"),
    C("outcome", "str", "", "finished, erred, stolen, rescheduled, released (free-keys before a result) or "
      "unfinished"),
    C("moved_ns", "Int64", MONO, "first byte of the steal-request, reschedule or free-keys that ended it; null "
      "unless stolen, rescheduled or released"),
    C("prefix", "str", "", "the key's prefix (dask's key_split)"),
    C("scheduler_delay_ns", "int64", "ns", "what was taken off its startstops: the worker's own estimate of "
      "the scheduler's clock offset, rebuilt from the captured heartbeats"),
)

DECODED = {
    "processes": Table("One row per process of the run: scheduler, workers, nannies, proxy, the user's command "
                       "(client), daskprobe and its probes' helpers.", (
        C("pid", "Int64", "", "process id; on the k-th host with an agent (run.json `hosts`), k·2^22 + its pid "
          "there; null if it was not found (a nanny's worker, a member on a host without an agent)"),
        C("name", "str", "", "its name in the other tables (scheduler, worker-0, proxy, client, …)"),
        C("role", "str", "", "scheduler, worker, nanny, proxy, client or probe"),
        C("listen", "str", "", "address it listens on; null for a process that does not"),
        C("contact", "str", "", "the proxy's address in front of it, where the others connect; null if none"),
        C("command", "str", "", "its command line, space-joined"),
        C("python", "str", "", "Python version of the cluster's interpreter (scheduler, workers, nannies); null "
          "for the others"),
        C("distributed", "str", "", "distributed's version (workers, nannies, a Dask scheduler); null for the "
          "others and a --server-cmd scheduler"),
        HOST,
        C("found_ns", "Int64", MONO, "when an attached recording found this worker, up to 2 s after it joined; "
          "null for those there from the start, and in a run"),
        C("left_ns", "Int64", MONO, "when an attached recording saw this worker gone, up to 2 s after it left; "
          "null if it stayed"),
    )),
    "connections": Table("One row per TCP connection the proxy accepted (captures/proxy.bin).", (
        C("conn", "int64", "", "the proxy's number for the connection"),
        C("listen", "str", "", "the proxy's address it was accepted on"),
        C("peer_addr", "str", "", "address of the connecting end"),
        C("upstream", "str", "", "address of the process the proxy fronts there"),
        C("upstream_local", "str", "", "the proxy's own address on its connection upstream; null in captures "
          "before daskprobe 0.1"),
        C("opened_ns", "int64", MONO, "when the proxy accepted it"),
        C("peer_pid", "int64", "", "pid of the connecting process (the run's, as processes.pid: from another "
          "host's agent for its members' sockets); -1 if unknown"),
        C("closed_ns", "Int64", MONO, "when its last direction closed; null if open when the capture ended"),
        C("bytes_to_upstream", "int64", "bytes", "bytes the peer sent, as counted at close (0 if never closed)"),
        C("bytes_from_upstream", "int64", "bytes", "bytes sent to the peer, as counted at close (0 if never "
          "closed)"),
        C("peer", "str", "", "name of the connecting process; client for a pid not in processes (the user's "
          "command or a child of it)"),
        C("peer_role", "str", "", "role of the connecting process"),
        C("upstream_name", "str", "", "name of the process the proxy fronts"),
        C("upstream_role", "str", "", "role of that process"),
        C("malformed", "int64", "count", "its directions that sent bytes not in Dask's framing (forwarded "
          "unparsed from there on) or ended inside a message"),
    )),
    "messages": Table("One row per op of a Dask message through the proxy: a batch has a row per op, all with "
                      "its msg_id.", (
        C("msg_id", "int64", "", "the message's number, in order of first byte"),
        C("conn", "int64", "", "its connection (connections.conn)"),
        C("direction", "int64", "", "0: from the connecting process to the one the proxy fronts; 1: back"),
        C("src", "str", "", "name of the sender; ? if its connection is unknown"),
        C("src_role", "str", "", "role of the sender"),
        C("dst", "str", "", "name of the receiver"),
        C("dst_role", "str", "", "role of the receiver"),
        C("t_first_ns", "int64", MONO, "when the proxy (or the tap) saw the message's first byte; with both_ends, "
          "when it left the sender's host"),
        C("t_last_ns", "int64", MONO, "when the proxy (or the tap) saw its last byte; with both_ends, when it "
          "reached the receiver's host"),
        C("both_ends", "bool", "", "a message between hosts seen by the taps at both of its ends (an attached "
          "recording with agents): its first byte is the sender's host's, its last the receiver's, both "
          "on the run's clock"),
        C("op", "str", "", "the op; handshake, reply (to a request on its connection), value (neither) or "
          "undecodable (see error)"),
        C("key", "str", "", "the op's key; null if it has none"),
        C("n_keys", "int64", "count", "keys the op names (its keys, else 1 for a key, else 0)"),
        C("msg_bytes", "int64", "bytes", "size of the whole message on the wire, framing included"),
        C("nframes", "int64", "count", "frames of the message"),
        C("batch_index", "int64", "", "the op's place in its batch, from 0"),
        C("batch_size", "int64", "count", "ops in its batch (1 if not batched, 0 for an empty batch)"),
        C("stimulus_id", "str", "", "the op's stimulus_id; null if none"),
        C("reply_to", "Int64", "", "msg_id of the request a reply answers; null for other ops"),
        C("error", "str", "", "why the message could not be decoded (op undecodable); else null"),
    )),
    "attempts": Table("One row per compute-task the scheduler sent (a dispatch), with how it ended on that "
                      "worker.", ATTEMPT),
    "graphs": Table("One row per update-graph.", (
        C("msg_id", "int64", "", "its message (messages.msg_id)"),
        C("src", "str", "", "name of the sender"),
        C("src_role", "str", "", "role of the sender"),
        C("t_first_ns", "int64", MONO, "its first byte at the proxy"),
        C("t_last_ns", "int64", MONO, "its last byte at the proxy"),
        C("msg_bytes", "int64", "bytes", "size of the message on the wire"),
        C("keys", "list[str]", "", "the keys it asks for"),
        C("graph_id", "int64", "", "the graph's number, in order of arrival"),
    )),
    "samples": Table("One row per sample of a thread: its Python stack (source pyspy, captures/pyspy.tsv) or "
                     "its native and kernel stack (source ebpf, on-CPU, captures/ebpf_cpu.tsv).", (
        C("t_ns", "int64", MONO, "the CPU tick at which BPF copied the Python stack, or when the sampler read the "
          "process's stacks (the read's midpoint), or when the kernel sampled the thread"),
        PID,
        TID,
        C("thread_name", "str", "", "the Python thread's name; null for ebpf"),
        C("active", "bool", "", "the thread was running (found on a CPU by a tick, or per /proc; and not parked "
          "in a known wait); true for ebpf"),
        C("owns_gil", "boolean", "", "the thread held the GIL; null for ebpf"),
        C("stack_id", "int64", "", "its stack (stacks.stack_id)"),
        C("ident", "Int64", "", "the Python thread identifier (threading.get_ident), as attempts.thread; 0 when "
          "unknown (and in captures before it was recorded), null for ebpf"),
        C("stale", "boolean", "", "the stack was read at an earlier sample (up to 100 ms before; 1 s with ticks) "
          "and the thread, off a CPU at this one, ran since: what it did then, not now; null for ebpf"),
        C("tick", "boolean", "", "read because a CPU's clock tick (at the sampling rate) found the thread on it: "
          "it stands for period_ns of its CPU time; false where the sampler polled every thread, null for ebpf"),
        C("period_ns", "Int64", "ns", "for a tick's sample, the CPU time it stands for: the period its CPU's clock "
          "ticked at then, drawn at random about 1/rate; where the sampler polled every thread, the mean interval "
          "between its reads then (1/rate, longer where reads at the rate would cost over 1.5% of the cluster's "
          "CPU); 0 for other samples, null for ebpf and in captures before it was recorded (then 1/rate)"),
        C("source", "str", "", "pyspy (the Python sampler) or ebpf (the CPU sampler)"),
        C("cpu", "Int64", "", "the CPU it was on; null for pyspy"),
        PROCESS,
        HOST,
    )),
    "stacks": Table("One row per distinct stack.", (
        C("stack_id", "int64", "", "the stack's number"),
        C("frame_ids", "list[int64]", "", "its frames (frames.frame_id), leaf first; eBPF's kernel frames "
          "before its user frames"),
        CAPTURED_ON,
    )),
    "frames": Table("One row per distinct frame.", (
        C("frame_id", "int64", "", "the frame's number"),
        C("function", "str", "", "function (qualified name for Python, symbol for native and kernel)"),
        C("filename", "str", "", "source file (Python), module (native) or [kernel]"),
        C("line", "int64", "", "line number; 0 for native and kernel frames"),
        C("kind", "str", "", "python, native or kernel"),
        CAPTURED_ON,
    )),
    "gil_waits": Table("One row per wait of at least 5 µs to take the GIL (eBPF: take_gil's sleeps on the GIL's condition); shorter "
                       "ones are summed in short_waits.", (
        PID,
        TID,
        C("start_ns", "int64", MONO, "when the thread, in take_gil, went off its CPU to sleep on the GIL's condition "
                                     "or mutex (kernels before 5.15, or --gil-traps: when it called "
                                     "pthread_cond_timedwait)"),
        C("end_ns", "int64", MONO, "when it was back on a CPU after that sleep (woken to take the GIL, or the "
                                   "switch interval, 5 ms, over and the next sleep follows; before 5.15: when the "
                                   "call returned)"),
        C("wait_ns", "int64", "ns", "end_ns - start_ns"),
        PROCESS,
        HOST,
    )),
    "offcpu": Table("One row per stretch of at least 50 µs a thread was off a CPU (eBPF sched_switch and "
                    "sched_wakeup); shorter ones are summed in short_waits.", (
        PID,
        TID,
        C("out_ns", "int64", MONO, "when it was switched out"),
        C("wakeup_ns", "int64", MONO, "when it was first woken after that; 0 if no wakeup was seen"),
        C("in_ns", "int64", MONO, "when it was switched back in"),
        C("prev_state", "int64", "", "its kernel state when switched out: 0 preempted (runnable throughout), "
          "else blocked (1 sleeping, 2 uninterruptible, …)"),
        C("blocked_ns", "int64", "ns", "out_ns to the wakeup; 0 if preempted or no wakeup was seen"),
        C("runnable_ns", "int64", "ns", "runnable without a CPU: the rest, to in_ns"),
        PROCESS,
        HOST,
    )),
    "short_waits": Table("One row per thread and kind: the waits below the thresholds of gil_waits and offcpu, "
                         "summed in BPF.", (
        C("kind", "str", "", "gil (GIL waits under 5 µs) or offcpu (off-CPU stretches under 50 µs)"),
        C("pid", "int64", "", "process id; -1 if unknown"),
        TID,
        C("total_ns", "int64", "ns", "their total duration"),
        C("count", "int64", "count", "how many"),
        PROCESS,
        HOST,
    )),
    "tcp": Table("One row per TCP segment received on the cluster's ports (eBPF tcp:tcp_probe).", (
        C("t_ns", "int64", MONO, "when the kernel processed it"),
        C("local_port", "int64", "", "port of the receiving socket"),
        C("remote_port", "int64", "", "port of the sender"),
        C("data_len", "int64", "bytes", "tcp_probe's payload length: 16 bits, wraps at 64 KiB"),
        C("payload", "int64", "bytes", "the segment's payload, from its sequence numbers (end_seq - seq, less "
          "SYN and FIN); data_len where they were not read"),
        C("unseen", "int64", "bytes", "what the socket took in since the connection's previous segment here "
          "that no probe saw (rare: likely a BPF run the kernel skipped): how far its "
          "rcv_nxt lies past the furthest end before; 0 where not read"),
        C("bytes", "int64", "bytes", "what the socket took in at this segment: the part of the payload past "
          "its rcv_nxt (less than payload where TCP sent a segment again), plus unseen; data_len where not "
          "read"),
        C("conn", "Int64", "", "the proxy connection it belongs to (connections.conn); null if none"),
        C("direction", "Int64", "", "as in messages; null if none"),
        C("hop", "str", "", "peer (between the connecting process and the proxy) or upstream (between the proxy "
          "and the process it fronts); null if none"),
        CAPTURED_ON,
    )),
    "proc": Table("One row per process and tick (5 a second) of /proc/PID/stat and the process's CPU clock "
                  "(captures/proc.tsv).", (
        C("t_ns", "int64", MONO, "when it was read"),
        PID,
        C("cpu_s", "float64", "s", "CPU time (user + system) the process had used since it started, from its CPU "
          "clock (to the ns; in captures made before it was read, /proc/PID/stat's 10 ms ticks)"),
        C("cpu_percent", "float64", "%", "its CPU use since the previous tick (100: one core); 0 at the first"),
        C("rss_bytes", "int64", "bytes", "resident memory"),
        PROCESS,
        HOST,
    )),
    "thread_names": Table("One row per thread of a watched process, named by the kernel (captures/threads.tsv, "
                          "scanned once a second where a process's thread count changed, every 10 s and at the "
                          "end in all; a thread that lived less may be missing).", (
        PID,
        TID,
        C("comm", "str", "", "the thread's kernel name (/proc/PID/task/TID/comm, at most 15 characters)"),
        PROCESS,
        HOST,
    )),
    "task_stream": Table("One row per span of a task in Dask's own task stream (captures/task_stream.jsonl): "
                         "recorded where messages cannot be read (attach to tls://, or without root); empty otherwise.", (
        C("key", "str", "", "the task's key"),
        C("prefix", "str", "", "its key prefix (dask's key_split)"),
        C("worker", "str", "", "the worker that ran it (processes.name); its address if not a member"),
        C("thread", "Int64", "", "the worker thread's ident (Python's, not the kernel's tid); null if none"),
        C("action", "str", "", "compute, transfer, disk-read or disk-write, as the worker reported it"),
        C("start_ns", "int64", MONO, "its start: the worker's wall clock on the run's monotonic clock (through "
          "the recorder's clock_anchor: off by the hosts' wall-clock difference)"),
        C("stop_ns", "int64", MONO, "its end, likewise"),
        C("nbytes", "Int64", "bytes", "size of the task's result as the worker measured it; null if none"),
        C("status", "str", "", "OK or error"),
    )),
    "local_jobs": Table("One row per job of a local scheduler (threads, processes, sync): a compute the "
                        "command ran without distributed, as the client hook recorded it "
                        "(captures/local_scheduler.PID.tsv); empty otherwise.", (
        C("job", "int64", "", "its number, in the order the jobs began, from 0"),
        C("pid", "int64", "", "the process that ran the scheduler's loop (the thread that called compute)"),
        C("tid", "int64", "", "that thread (the kernel's id)"),
        C("local", "int64", "", "its number among that process's jobs"),
        C("start_ns", "int64", MONO, "Dask's start callback: before it ordered the graph"),
        C("end_ns", "Int64", MONO, "Dask's finish callback; null if it never came (the command ended first)"),
        C("errored", "boolean", "", "a task raised, or the job was interrupted; null without an end"),
        C("graph_tasks", "int64", "count", "tasks in the graph it was given"),
        HOST,
    )),
    "local_tasks": Table("One row per task a local scheduler dispatched: the loop's callbacks and the pool's "
                         "run of it (captures/local_scheduler.PID.tsv).", (
        C("job", "int64", "", "its job (local_jobs.job)"),
        C("key", "str", "", "the task's key, as str() gives it"),
        C("prefix", "str", "", "the key's prefix (dask's key_split)"),
        C("deps", "list[str]", "", "keys of its dependencies"),
        C("pid", "int64", "", "the process of the scheduler's loop"),
        C("tid", "int64", "", "the loop's thread"),
        C("sent_ns", "int64", MONO, "the loop dispatched it (pretask callback)"),
        C("done_ns", "Int64", MONO, "the loop had taken its result in (posttask callback); null if never"),
        C("worker_id", "str", "", "where Dask says it ran: a thread's ident (threads), a process's pid "
          "(processes), empty (sync); null without a result"),
        C("exec_pid", "Int64", "", "the process that ran it; null if its run was not recorded"),
        C("exec_tid", "Int64", "", "the thread that ran it (the kernel's id)"),
        C("ident", "Int64", "", "that thread's Python identifier (threading.get_ident), as samples.ident"),
        C("enter_ns", "Int64", MONO, "that thread entered dask.local.execute_task for it"),
        C("loaded_ns", "Int64", MONO, "it had unpacked the task and its inputs (their unpickling, processes)"),
        C("computed_ns", "Int64", MONO, "the task's function had returned; null if it raised"),
        C("exit_ns", "Int64", MONO, "it left execute_task, its result packed (pickled, processes)"),
        C("failed", "boolean", "", "the task raised; null if its run was not recorded"),
        HOST,
    )),
}

ANALYSIS = {
    "jobs": Table("One row per job: a stretch in which some graph of the client's is in the cluster "
                  "(attribution.md).", (
        C("job", "int64", "", "the job's number, in time order from 0"),
        C("start_ns", "int64", MONO, "first byte of its first update-graph at the proxy"),
        C("end_ns", "int64", MONO, "when the last key its graphs ask for was told to their sender (the last byte of "
          "that key-in-memory or task-erred); a graph none of whose keys were told ends at its last byte; an "
          "incomplete job (complete false) at the next job's start or the client's last message"),
        C("graphs", "int64", "count", "update-graphs in it"),
        C("graph_bytes", "int64", "bytes", "their bytes on the wire: the graphs and whatever data they carry"),
        C("requested", "int64", "count", "keys its graphs ask for"),
        C("end_key", "str", "", "the key whose telling ends it; null if none was told"),
        C("end_told", "Int64", "", "that telling's number among the scheduler's key-in-memory and task-erred ops "
          "to submitters, in message order; null if none"),
        C("complete", "bool", "", "false when the run did not record every message (run.json lost, or its "
          "recorder stopped early) and some key its graphs ask for was never told: its end may be among what was "
          "lost, end_ns is the next job's start or the client's last message, and the time after last_told_ns is "
          "uncategorized, not the client's"),
        C("untold", "int64", "count", "keys its graphs ask for that were never told to their sender (in a run that "
          "lost nothing: let go by the client, cancelled or forgotten)"),
        C("last_told_ns", "int64", MONO, "when its last told key was told (end_ns for a complete job)"),
    )),
    "tasks": Table("One row per key and job: the columns of attempts are those of the attempt that decided it "
                   "(its job's last finished one, else its last), then when the task was ready.", (
        C("job", "int64", "", "its job (jobs.job)"),
        *(c for c in ATTEMPT if c.name != "attempt"),
        C("attempts", "int64", "count", "dispatches of the key in the job"),
        C("first_sent_ns", "int64", MONO, "first byte of its first compute-task in the job"),
        C("graph", "Int64", "", "the graph that brought it (graphs.graph_id): the one asking for its key, else the "
          "job's latest before its first dispatch"),
        C("graph_ns", "Int64", MONO, "that graph's last byte at the proxy"),
        C("ready_ns", "Int64", MONO, "when it was ready: the later of its last dependency's task-finished reaching the "
          "scheduler and graph_ns"),
        C("ready_by", "str", "", "which made it ready: that dependency's key, or graph"),
        C("compute_s", "float64", "s", "its compute span; NaN unless it finished"),
        C("wait_s", "float64", "s", "time in queues: from ready to its compute-task leaving the scheduler, and on the "
          "worker from its arrival and inputs to a thread starting it; NaN unless it finished"),
        C("overhead_s", "float64", "s", "(task-finished reaching the scheduler - ready_ns) - compute_s - wait_s: the "
          "messages' hops, fetching inputs and reporting the result; NaN unless it finished"),
    )),
    "thread_states": Table("One row per interval in which a thread was not running Python on a CPU (from eBPF); "
                           "a thread's intervals are disjoint.", (
        PID,
        TID,
        C("start_ns", "int64", MONO, "start of the interval"),
        C("end_ns", "int64", MONO, "its end"),
        C("state", "str", "", "gil (waiting to take the GIL), runnable (no CPU free) or blocked"),
        HOST,
    )),
    "in_flight": Table("One row per change of the tasks a worker holds: a compute-task reaching it (+1) or a "
                       "task-finished leaving it (-1).", (
        C("worker", "str", "", "the worker"),
        C("t_ns", "int64", MONO, "when the message's last byte (compute-task) or first byte (task-finished) passed "
          "the proxy"),
        C("tasks", "int64", "count", "tasks it holds from then on; 0: idle, waiting on the scheduler"),
    )),
    "compute_profile": Table("One row per task prefix and function of the user's code its tasks ran: on-CPU "
                             "samples inside compute spans, on the task's thread, by the innermost frame of the "
                             "user's code (frames of libraries and Python's own left out).", (
        C("prefix", "str", "", "the task prefix"),
        C("function", "str", "", "the function"),
        C("filename", "str", "", "its file"),
        C("line", "int64", "", "the line most of its samples were at"),
        C("samples", "int64", "count", "on-CPU samples of the prefix's tasks with this function innermost of the "
                                       "user's code"),
        C("seconds", "float64", "s", "the CPU time those samples stand for"),
        C("prefix_samples", "int64", "count", "all on-CPU samples of the prefix's tasks, in the user's code or not"),
        C("share", "float64", "fraction", "samples / prefix_samples"),
        C("gil_samples", "int64", "count", "of `samples`, those whose thread held the GIL: the function's own "
                                           "Python (or C code that keeps the GIL); the rest ran compiled code "
                                           "that released it (numpy, I/O)"),
    )),
    "transfers": Table("One row per message that carried task data from one worker to another: a reply to "
                       "get_data (a task's inputs), or a P2P shuffle's or rechunk's shuffle_receive.", (
        C("src", "str", "", "the worker that sent the data"),
        C("dst", "str", "", "the worker that received it"),
        C("kind", "str", "", "get_data (inputs fetched) or shuffle_receive (P2P shuffle or rechunk)"),
        C("t_first_ns", "int64", MONO, "the message's first byte at the proxy (or tap)"),
        C("t_last_ns", "int64", MONO, "its last byte"),
        C("bytes", "int64", "bytes", "the message's bytes on the wire, framing included"),
    )),
    "prefixes": Table("One row per key prefix (dask's key_split): what its tasks cost over all jobs.", (
        C("prefix", "str", "", "the prefix"),
        C("tasks", "int64", "count", "its tasks (a key per job)"),
        C("attempts", "int64", "count", "their dispatches; more than tasks when stolen or recomputed"),
        C("compute_s", "float64", "s", "their compute spans, summed"),
        C("compute_per_task_s", "float64", "s", "compute span per task, mean"),
        C("overhead_per_task_s", "float64", "s", "overhead per finished task, median: (task-finished reaching the "
                                                 "scheduler - ready) - compute - waiting: the messages' hops, "
                                                 "fetching inputs, reporting the result; null if none finished"),
        C("wait_per_task_s", "float64", "s", "waiting per finished task, median: from ready to its compute-task "
                                             "leaving the scheduler (queued there, with the scheduler's own "
                                             "handling), plus from its compute-task (or its inputs, when fetched) "
                                             "reaching the worker to its compute's start"),
        C("result_bytes", "float64", "bytes", "their results' sizes, summed (as the workers reported them)"),
        C("moved_bytes", "float64", "bytes", "bytes of its results other workers needed: each result's size once per "
                                             "other worker that ran a task of the same job depending on it (from "
                                             "where tasks ran, not from the wire)"),
        C("critical_path_s", "float64", "s", "seconds of the critical path's segments that name one of its keys"),
        C("critical_path_share", "float64", "fraction", "critical_path_s over the session"),
    )),
    "threads": Table("One row per thread seen by a sample or an eBPF interval.", (
        PID,
        TID,
        C("process", "str", "", "the process's name, from its samples; null if it has none"),
        C("name", "str", "", "its Python name, else main or thread TID"),
        C("ident", "Int64", "", "its Python thread identifier (threading.get_ident, as attempts.thread); null if "
                                "the Python sampler never read it"),
        C("main", "bool", "", "it is its process's main thread (tid = pid): Dask's event loop"),
        C("ebpf_states", "bool", "", "its process has eBPF thread states"),
        C("first_ns", "int64", MONO, "when it was first seen"),
        C("last_ns", "int64", MONO, "when it was last seen"),
        HOST,
    )),
    "attempt_threads": Table("One row per attempt whose worker thread is known: the thread that ran it. A "
                             "task-finished names its thread by Python ident, which a later thread may get again: "
                             "of the threads with that ident, the one seen nearest the compute's start.", (
        C("attempt", "int64", "", "the attempt's row in attempts (from 0)"),
        TID,
        C("name", "str", "", "the thread's name (threads.name)"),
        HOST,
    )),
    "cpu_samples": Table("One row per sample the CPU analysis counts (a process with Python samples is counted "
                         "from those only), with its thread state and category.", (
        C("t_ns", "int64", MONO, "as in samples"),
        PID,
        TID,
        C("process", "str", "", "the process's name"),
        C("role", "str", "", "the process's role; ? if unknown"),
        C("source", "str", "", "pyspy or ebpf"),
        C("stack_id", "int64", "", "its stack (stacks.stack_id)"),
        C("on_cpu", "bool", "", "the thread was on a CPU: outside its eBPF off-CPU and GIL intervals where it has "
          "them, else the sampler's active; always for ebpf"),
        C("owns_gil", "boolean", "", "the thread held the GIL (the Python sampler's flag); null for ebpf"),
        C("category", "str", "", "compute inside a task's compute span on the thread that ran it, client for the "
          "client's, else its stack's (stack_categories)"),
        C("weight_s", "float64", "s", "time it stands for without eBPF states: since its process's previous read "
          "(at most 3 periods), 1/cpu_hz for ebpf"),
        HOST,
    )),
    "stack_categories": Table("One row per stack.", (
        C("stack_id", "int64", "", "stacks.stack_id"),
        C("category", "str", "", "the category of the first rule (analyzers/rules) any of its frames matches; "
          "uncategorized if none"),
    )),
    "critical_path": Table("One row per segment of a job's critical path, and of the client's time outside jobs; "
                           "segments are contiguous and cover the session.", (
        C("job", "int64", "", "its job (jobs.job); -1 outside jobs"),
        C("start_ns", "int64", MONO, "start of the segment"),
        C("end_ns", "int64", MONO, "its end"),
        C("kind", "str", "", "network, compute, scheduler, worker, queueing, scheduler_decisions or client; for "
          "a local scheduler's job (analyzers/local.py): scheduler (its loop), pool (the task's thread around its "
          "compute), compute or client"),
        C("part", "str", "", "what the segment is, finer"),
        C("key", "str", "", "the task it belongs to; null if none"),
        C("process", "str", "", "the process the time was in; null for network and scheduler_decisions, and "
          "for client time whose submitter is unknown"),
        C("batch_ns", "int64", "ns", "batched-send interval of the stream whose message ends the segment; 0 if "
          "none"),
    )),
    "attribution": Table("One row per critical-path segment and category: the segment's time split by what its "
                         "process's event-loop thread was doing.", (
        C("job", "int64", "", "as in critical_path"),
        C("kind", "str", "", "as in critical_path"),
        C("part", "str", "", "as in critical_path; (batching) appended for time held by a batched send"),
        C("process", "str", "", "as in critical_path"),
        C("category", "str", "", "the category of time (attribution.md)"),
        C("seconds", "float64", "s", "the segment's time given to the category"),
        C("pool", "str", "", "for time shared out by sample counts, the pool of samples it rests on (job:process "
          "and which time; '(the session's samples)' where the job's own had none); null for time measured "
          "directly"),
        C("pool_seconds", "float64", "s", "the time the pool shared out, over all its segments; NaN without a "
          "pool"),
        C("pool_n", "Int64", "count", "samples in the pool; null without a pool"),
        C("n", "Int64", "count", "of those, samples in this category; null without a pool"),
    )),
}

TABLES = DECODED | ANALYSIS
# what infer_dtype may find a column's values to be for them to be cast to its dtype
FITS = {"int64": {"integer", "floating", "mixed-integer-float"}, "bool": {"boolean"}, "str": {"string"}}
FITS |= {"Int64": FITS["int64"], "float64": FITS["int64"], "boolean": FITS["bool"]}
ARROW = {"int64": pa.int64(), "Int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(),
         "boolean": pa.bool_(), "str": pa.large_string(), "list[str]": pa.list_(pa.string()),
         "list[int64]": pa.list_(pa.int64())}


def conform(name: str, df: pd.DataFrame, table: Table | None = None) -> pd.DataFrame:
    """`df` as table `name` is written: its columns in schema order, each cast to its dtype.
    An unknown table, a column the schema lacks or lacks in df, or a value that does not
    fit its column's dtype is a SchemaError naming table and column. `table`: a table defined
    elsewhere (a layer above: a bench's results), else TABLES'."""
    if table is None and name not in TABLES:
        raise SchemaError(f"table {name!r} is not in probes/schema.py")
    table = table or TABLES[name]
    names = table.names
    extra = [c for c in df.columns if c not in names] + list(df.columns[df.columns.duplicated()])
    if extra:
        raise SchemaError(f"table {name!r}: column {extra[0]!r} is not in its schema (probes/schema.py)")
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise SchemaError(f"table {name!r}: column {missing[0]!r} of its schema is missing")
    return pd.DataFrame({c.name: _cast(df[c.name], c.dtype, f"table {name!r}: column {c.name!r}")
                         for c in table.columns})


def _cast(s: pd.Series, dtype: str, where: str) -> pd.Series:
    s = s.reset_index(drop=True)
    if str(s.dtype) == dtype:
        return s
    if dtype.startswith("list["):  # checked by arrow on write (arrow_schema)
        return s.astype(object)
    nulls = s.isna()
    kind = "empty" if nulls.all() else infer_dtype(s, skipna=True)
    if kind not in FITS[dtype] | {"empty"}:
        raise SchemaError(f"{where}: {kind} values do not fit its dtype {dtype}")
    if dtype in ("int64", "bool") and nulls.any():
        raise SchemaError(f"{where}: nulls do not fit its dtype {dtype}")
    try:
        if dtype == "int64" and s.dtype.kind != "i":
            s = s.astype("Int64")  # which refuses a fraction where int64 would drop it
        return s.astype(dtype)
    except (TypeError, ValueError) as e:
        raise SchemaError(f"{where}: not {dtype}: {e}") from None


def arrow_schema(name: str, table: Table | None = None) -> pa.Schema:
    """The table's parquet types: list columns are checked against theirs as they are written."""
    return pa.schema([(c.name, ARROW[c.dtype]) for c in (table or TABLES[name]).columns])


def markdown() -> str:
    """docs/tables.md."""
    out = ["# Tables", "",
           "<!-- generated from probes/schema.py by `python -m daskprobe.probes.schema`; do not edit -->", "",
           "A run's `tables/*.parquet`, as `RunDir.write_table` checks them on write: each table's columns in "
           "this order, of these dtypes.", "",
           "**dtypes** are pandas': `int64` and `bool` hold no nulls, `float64` NaN only where a column says so; "
           "`Int64` and `boolean` are the nullable forms of `int64` and `bool`; `str` is pandas' string, null "
           "where a column says so; `list[str]` and `list[int64]` are lists (numpy arrays when read back).", "",
           f"**Units**: `{MONO}` is a time on CLOCK_MONOTONIC, the run's clock (`run.json`'s `clock_anchor` gives "
           "one instant on it and on wall time); `ns` and `s` are durations; `count` is a number of things.", ""]
    for title, tables in (("Decoded from the captures", DECODED),
                          ("Results of the analysis (written when the run has a job)", ANALYSIS)):
        out += [f"## {title}", ""]
        for name, table in tables.items():
            out += [f"### {name}", "", table.doc, "", "| column | dtype | unit | definition |",
                    "| --- | --- | --- | --- |"]
            out += [f"| `{c.name}` | {c.dtype} | {c.unit} | {c.doc} |" for c in table.columns]
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    DOC.write_text(markdown())
