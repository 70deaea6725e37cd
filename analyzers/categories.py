"""The categories of time, and the function-to-category rules (data files
under analyzers/rules/) that classify CPU samples."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

RULES_DIR = Path(__file__).with_name("rules")
CATEGORIES = ("scheduler_decisions", "runtime_bookkeeping", "gil_contention", "cpu_starvation", "network",
              "compute", "queueing", "idle", "client")
UNCATEGORIZED = "uncategorized"
DEFINITIONS = {
    "scheduler_decisions": "time the scheduler spent choosing workers, stealing work and estimating occupancy and "
                           "durations: on-CPU time of its event loop (or of a thread it waited on) whose samples fall "
                           "in those functions (rules/dask.toml, rules/rsds.toml); plus each steal on the path, from "
                           "the scheduler's steal-request to its compute-task to the thief",
    "runtime_bookkeeping": "time Dask's runtime spent on everything else it does for a task: on-CPU time of the "
                           "scheduler's or a worker's event loop (or of a thread it waited on) in task transitions, "
                           "message handling, comm, serialization, graph materialization, the event loop; plus "
                           "'batching': a message held by the batched-send interval (scheduler to worker 5 ms, "
                           "worker to scheduler 2 ms, scheduler to client 2 ms) while the loop was blocked",
    "gil_contention": "time the event-loop thread of the process the path was in, or the thread running a task "
                      "on the path, waited to take the GIL (eBPF: take_gil's sleeps on the GIL's condition)",
    "cpu_starvation": "time the event-loop thread of the process the path was in, or the thread running a task "
                      "on the path, was runnable but had no CPU (eBPF sched_switch / sched_wakeup): the machine "
                      "had more work than cores",
    "network": "time messages on the path were on the wire: from their first byte reaching the proxy to their "
               "last byte leaving it (any --delay-ms hold included); between hosts whose taps saw both ends (attach "
               "with agents), from the first byte leaving the sender's host to the last reaching the receiver's; for "
               "task messages, graph uploads and the get_data requests and replies between workers",
    "compute": "the workers' compute spans (startstops) of the tasks on the path, but the time their threads "
               "waited for the GIL or a CPU (gil_contention, cpu_starvation)",
    "queueing": "time a task on the path waited on a worker it was then stolen from (worker-side queueing)",
    "idle": "time the event-loop thread of the process the path was in was blocked with no message held for "
            "sending and no Dask work on its other threads: it waited for something the path does not show",
    "client": "time no job was in the cluster (before the first, between jobs, after the last), and time within a "
              "job from a result reaching the client to the client's next submission: the client working, "
              "thinking or waiting on its own",
    UNCATEGORIZED: "time inside a process whose samples match no rule, or for which there were no samples",
}


@dataclass(frozen=True)
class Rule:
    category: str
    what: str
    function: re.Pattern | None
    file: re.Pattern | None

    def matches(self, function: str, file: str) -> bool:
        return bool((self.function is None or self.function.search(function))
                    and (self.file is None or self.file.search(file)))


def load_rules(paths: list[Path]) -> list[Rule]:
    """Rules in file order; user files come first so they can override ours."""
    rules = []
    for path in paths:
        for r in tomllib.loads(Path(path).read_text()).get("rule", []):
            if r["category"] not in CATEGORIES:
                raise ValueError(f"{path}: unknown category {r['category']!r}; known: {', '.join(CATEGORIES)}")
            rules.append(Rule(r["category"], r.get("what", ""),
                              re.compile(r["function"]) if "function" in r else None,
                              re.compile(r["file"]) if "file" in r else None))
    return rules


def default_rules(meta: dict) -> list[Path]:
    """Our rules for the run's server: Dask's, after RSDS's for a --server-cmd naming rsds
    (its workers and client are still Dask's Python)."""
    rsds = "rsds" in str(meta.get("cluster", {}).get("server_cmd") or "")
    return [RULES_DIR / "rsds.toml"] * rsds + [RULES_DIR / "dask.toml"]


def _frame_rules(frames: pd.DataFrame, rules: list[Rule]) -> pd.Series:
    """frame_id -> index of the first rule the frame matches (len(rules): none)."""
    pairs = list(zip(frames.function.astype(str), frames.filename.astype(str)))
    first = [next((i for i, r in enumerate(rules) if r.matches(fn, file)), len(rules)) for fn, file in pairs]
    per_frame = pd.Series(first, index=frames.frame_id.to_numpy())
    return per_frame[~per_frame.index.duplicated()]


def classify_stacks(stacks: pd.DataFrame, frames: pd.DataFrame, rules: list[Rule]) -> pd.Series:
    """stack_id -> category: the first rule that any frame of the stack matches. A frame whose
    definition was lost (a torn capture) matches nothing."""
    per_frame = _frame_rules(frames, rules)
    ids = stacks[["stack_id", "frame_ids"]].explode("frame_ids")
    best = ids.frame_ids.map(per_frame).fillna(len(rules)).astype(int).groupby(ids.stack_id).min()
    names = pd.Series([r.category for r in rules] + [UNCATEGORIZED])
    return pd.Series(names.to_numpy()[best.reindex(stacks.stack_id).fillna(len(rules)).astype(int).to_numpy()],
                     index=stacks.stack_id, dtype="object")
