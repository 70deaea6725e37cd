"""Small hand-made runs for the analyzers: the tables a run's decode stage
writes, built from a few lines that say what happened, in ms."""

from __future__ import annotations

import copy
import hashlib
import pickle

import numpy as np
import pandas as pd

from daskprobe.analyzers.results import Analysis
from daskprobe.analyzers.summary import analyze as analyze_run
from daskprobe.probes import rates

MS = 1_000_000
META = {"sample_rate": rates.SAMPLE_RATE, "cpu_hz": rates.CPU_HZ}
PIDS = {"scheduler": 100, "worker-0": 200, "worker-1": 300, "client": 400}


class Scenario:
    def __init__(self):
        self.msgs, self.attempts, self.graphs = [], [], []
        self.offcpu, self.gil, self.samples, self.frames, self.stacks = [], [], [], {}, {}

    def message(self, src: str, dst: str, t0: float, t1: float, op: str, key=None) -> int:
        msg = len(self.msgs)
        self.msgs.append({"msg_id": msg, "conn": 1, "direction": 0, "src": src, "src_role": _role(src), "dst": dst,
                          "dst_role": _role(dst), "t_first_ns": int(t0 * MS), "t_last_ns": int(t1 * MS),
                          "both_ends": False, "op": op, "key": key, "n_keys": int(key is not None), "msg_bytes": 100,
                          "nframes": 1,
                          "batch_index": 0, "batch_size": 1, "stimulus_id": None, "reply_to": pd.NA, "error": None})
        return msg

    def graph(self, t0: float, t1: float, keys, src: str = "client") -> None:
        msg = self.message(src, "scheduler", t0, t1, "update-graph")
        self.graphs.append({"msg_id": msg, "src": src, "src_role": _role(src), "t_first_ns": int(t0 * MS),
                            "t_last_ns": int(t1 * MS), "msg_bytes": 100, "keys": list(keys),
                            "graph_id": len(self.graphs)})

    def told(self, key: str, t0: float, t1: float, dst: str = "client") -> None:
        self.message("scheduler", dst, t0, t1, "key-in-memory", key)

    def task(self, key, worker, sent, recv, start, stop, fsent, frecv, deps=(), thread=1, outcome="finished",
             moved=None, transfer=(None, None)) -> None:
        """One dispatch: compute-task sent/received, compute span, task-finished sent/received (ms);
        transfer: the span in which the worker fetched its inputs."""
        self.message("scheduler", worker, sent, recv, "compute-task", key)
        done = outcome == "finished"
        if done:
            self.message(worker, "scheduler", fsent, frecv, "task-finished", key)
        ns = lambda v: pd.NA if v is None or not done and v in (start, stop, fsent, frecv) else int(v * MS)
        self.attempts.append({
            "key": key, "attempt": sum(a["key"] == key for a in self.attempts), "run_id": len(self.attempts),
            "worker": worker, "deps": list(deps), "compute_sent_ns": int(sent * MS), "compute_recv_ns": int(recv * MS),
            "finished_sent_ns": ns(fsent), "finished_recv_ns": ns(frecv), "nbytes": 8, "thread": thread,
            "compute_start_ns": ns(start), "compute_stop_ns": ns(stop), "transfer_start_ns": ns(transfer[0]),
            "transfer_stop_ns": ns(transfer[1]), "outcome": outcome, "moved_ns": pd.NA if moved is None else int(moved * MS),
            "prefix": key.rsplit("-", 1)[0], "scheduler_delay_ns": 0})

    def state(self, process: str, state: str, t0: float, t1: float, tid: int | None = None) -> None:
        """The thread (default: the process's main thread) was off-CPU, or waiting for the GIL, from t0 to t1."""
        pid = PIDS[process]
        tid = pid if tid is None else tid
        if state == "gil":
            self.gil.append({"pid": pid, "tid": tid, "start_ns": int(t0 * MS), "end_ns": int(t1 * MS),
                             "wait_ns": int((t1 - t0) * MS)})
        else:
            blocked = int((t1 - t0) * MS) if state == "blocked" else 0
            self.offcpu.append({"pid": pid, "tid": tid, "out_ns": int(t0 * MS), "wakeup_ns": int(t1 * MS),
                                "in_ns": int(t1 * MS), "prev_state": int(state == "blocked"), "blocked_ns": blocked,
                                "runnable_ns": int((t1 - t0) * MS) - blocked})

    def sample(self, process: str, t: float, function: str, file: str = "distributed/scheduler.py",
               tid: int | None = None, active: bool = True, name: str = "MainThread", owns_gil: bool = True,
               ident: int | None = None) -> None:
        self.sample_stack(process, t, [(function, file)], tid, active, name, owns_gil, ident)

    def sample_stack(self, process: str, t: float, frames: list[tuple[str, str]], tid: int | None = None,
                     active: bool = True, name: str = "MainThread", owns_gil: bool = True,
                     ident: int | None = None) -> None:
        """A sample of a stack of (function, file) frames, innermost first."""
        pid = PIDS[process]
        ids = tuple(self.frames.setdefault(f, len(self.frames)) for f in frames)
        stack = self.stacks.setdefault(ids, len(self.stacks))
        self.samples.append({"t_ns": int(t * MS), "pid": pid, "tid": pid if tid is None else tid,
                             "thread_name": name, "active": active, "owns_gil": owns_gil, "stack_id": stack,
                             "source": "pyspy", "cpu": np.nan, "process": process, "ident": ident})

    def tables(self) -> dict:
        procs = pd.DataFrame([{"pid": pid, "name": name, "role": _role(name), "listen": None, "contact": None,
                               "command": ""} for name, pid in PIDS.items()])
        frames = pd.DataFrame([(i, f, file, 1) for (f, file), i in self.frames.items()],
                              columns=["frame_id", "function", "filename", "line"])
        stacks = pd.DataFrame({"stack_id": list(self.stacks.values()), "frame_ids": [list(k) for k in self.stacks]})
        attempts = pd.DataFrame(self.attempts)
        for c in ("finished_sent_ns", "finished_recv_ns", "compute_start_ns", "compute_stop_ns", "transfer_start_ns",
                  "transfer_stop_ns", "moved_ns", "run_id", "thread", "nbytes"):
            attempts[c] = attempts[c].astype("Int64")
        return {"processes": procs, "messages": pd.DataFrame(self.msgs), "attempts": attempts,
                "graphs": pd.DataFrame(self.graphs, columns=GRAPH_COLUMNS), "samples": pd.DataFrame(self.samples, columns=SAMPLE_COLUMNS),
                "stacks": stacks, "frames": frames,
                "gil_waits": pd.DataFrame(self.gil, columns=["pid", "tid", "start_ns", "end_ns", "wait_ns"]),
                "offcpu": pd.DataFrame(self.offcpu, columns=["pid", "tid", "out_ns", "wakeup_ns", "in_ns",
                                                             "prev_state", "blocked_ns", "runnable_ns"]),
                "proc": pd.DataFrame(columns=["t_ns", "pid", "cpu_s", "cpu_percent", "rss_bytes", "process"]),
                "thread_names": pd.DataFrame({"pid": [PIDS["scheduler"]], "tid": [101], "comm": ["Dask-Offload_0"]})}


GRAPH_COLUMNS = ["msg_id", "src", "src_role", "t_first_ns", "t_last_ns", "msg_bytes", "keys", "graph_id"]
SAMPLE_COLUMNS = ["t_ns", "pid", "tid", "thread_name", "active", "owns_gil", "stack_id", "source", "cpu", "process",
                  "ident"]


def _role(name: str) -> str:
    return name.split("-")[0]


def two_task_chain(s: Scenario, connect: float = 0, leave: float = 100) -> Scenario:
    """a-0 then b-1 on worker-0; the client connects at `connect` ms and leaves at `leave` ms."""
    s.message("client", "scheduler", connect, connect + 0.5, "register-client")
    s.graph(10, 11, ["b-1"])
    s.task("a-0", "worker-0", 20, 21, 22, 32, 35, 36)
    s.task("b-1", "worker-0", 45, 46, 47, 57, 60, 61, deps=["a-0"])
    s.told("b-1", 65, 66)
    s.message("client", "scheduler", leave - 0.5, leave, "close-client")
    return s


ANALYSES: dict[str, Analysis] = {}


def analyze(t: dict, meta: dict) -> Analysis:
    """analyze_run(t, meta) once per distinct run and meta in the session: tests of different rules
    read the same run (a fifth of the unit layer's analyses), and an analysis takes a fifth of a
    second however small the run. The analysis is pure, so a run analysed again gives what it gave;
    each caller gets its own copy to change. A test that patches the analysis calls analyze_run."""
    key = hashlib.sha256(pickle.dumps((sorted(t.items()), sorted(meta.items())))).hexdigest()
    if key not in ANALYSES:
        ANALYSES[key] = analyze_run(t, meta)
    done = ANALYSES[key]
    return Analysis({name: df.copy(deep=False) for name, df in done.tables.items()}, copy.deepcopy(done.summary))
