"""Function-to-category rules (data files under analyzers/rules/), applied to CPU samples."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

RULES_DIR = Path(__file__).with_name("rules")
CATEGORIES = ("scheduler_decisions", "runtime_bookkeeping", "gil_contention", "network", "compute", "idle")
UNCATEGORIZED = "uncategorized"
DEFINITIONS = {
    "scheduler_decisions": "critical-path time inside the scheduler whose CPU samples fall in worker choice, "
                           "work stealing, occupancy and duration estimates (rules/dask.toml, rules/rsds.toml)",
    "runtime_bookkeeping": "critical-path time inside the scheduler whose samples fall in task transitions, "
                           "stream handlers, comm, msgpack and serialization, graph materialization, the event "
                           "loop; plus critical-path time inside a worker outside compute (before and after "
                           "compute, waiting for a thread), less its GIL waits",
    "gil_contention": "critical-path time in which the event-loop thread of the process the path is in "
                      "(scheduler or worker) waited in take_gil (eBPF uprobes), including while a message "
                      "waited in that process's send batch",
    "network": "critical-path time of messages between their first byte reaching the proxy and their last byte "
               "delivered; their batching delay (from the sender building the message, per the timestamp in "
               "its stimulus_id, to its first byte); input fetches between workers; the client's graph upload",
    "compute": "the workers' compute spans (startstops) of the tasks on the critical path",
    "idle": "critical-path time inside the scheduler whose samples show its event-loop thread not running",
    UNCATEGORIZED: "critical-path time inside the scheduler whose samples match no rule, or that had no samples",
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


def classify_stacks(stacks: pd.DataFrame, frames: pd.DataFrame, rules: list[Rule]) -> pd.Series:
    """stack_id -> category: the first rule that any frame of the stack matches."""
    fn = frames.set_index("frame_id")
    cache: dict[int, str] = {}

    def frame_rule(fid: int) -> int:
        if fid not in cache:
            if fid not in fn.index:  # its definition was lost (a torn capture): matches nothing
                cache[fid] = len(rules)
                return cache[fid]
            f = fn.loc[fid]
            cache[fid] = next((i for i, r in enumerate(rules) if r.matches(f.function, f.filename)), len(rules))
        return cache[fid]

    def category(ids) -> str:
        best = min((frame_rule(i) for i in ids), default=len(rules))
        return rules[best].category if best < len(rules) else UNCATEGORIZED

    return pd.Series([category(ids) for ids in stacks.frame_ids], index=stacks.stack_id, dtype="object")
