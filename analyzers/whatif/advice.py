"""What a finding's advice would save: the change of the model it amounts to (findings.py gives it, as
the finding's `what_if`), replayed once in the analysis. A finding the model cannot express gets the
reason, never a number."""

from __future__ import annotations

from dataclasses import fields

from .predict import Changes, NotModelled, sweep

SAMPLES = 5  # replays per prediction in the analysis (the CLI's default is 10); on a large run fewer, so
REPLAYED_TASKS = 10_000  # that a prediction replays about this many tasks (at least 2 replays): the stage's time
MIN_SAVING = 0.05  # of the makespan: a predicted saving below this is none (said so, never ranked)
TOP = 3

# why a finding's advice has no number: what the model would need to know
NOT_MODELLED = {
    "hot-function": "a faster function: the model replays the tasks' measured compute and cannot know how much "
                    "faster the code would run",
    "task-overhead": "fewer, larger tasks make another graph, and the model replays the run's",
    "scheduler-bound": "fewer, larger tasks make another graph, and the model replays the run's",
    "graph-materialization": "fewer, larger tasks make another graph, and the model replays the run's",
    "client-graph": "a smaller graph to build: the client's own time is kept as measured",
    "data-in-graph": "a graph without the data: the model replays the run's uploads as they were",
    "recomputed": "persisting changes which tasks run: the model replays the tasks that ran",
    "cold-start": "the model does not tell a task's imports from its compute",
    "spilling": "memory and spilling are not modelled",
    "event-loop-blocked": "an event loop blocked by other code is not modelled",
    "cpu-contention": "the event loops' own CPU competing with the tasks is not modelled",
    "library-threads": "a library's threads competing with the tasks are not modelled",
    "worker-saturation": "more workers would spill less: memory is not modelled",
    "client": "the script's own time before its work and after its result is not in the replayed makespan",
    "cpu-starvation": "no fewer threads than the run's to replay",
    "transfers": "most of it is P2P shuffle or rechunk tasks, which move their data inside the tasks: the model "
                 "replays that as their compute",
}
LOCAL = "a run of Dask's local schedulers: the model replays a cluster's jobs"
UNCONTENDED = ("the run has no eBPF thread states: the model replays compute as measured, with no waits for "
               "cores or the GIL to take away")
UNKNOWN = "the model has no change for this advice"


def changes(what_if: dict) -> Changes:
    """A finding's what_if (as in summary.json: lists for tuples) as the model's Changes."""
    return Changes(**{k: tuple(v) if isinstance(v, list) else v for k, v in what_if.items()})


def quote(found: list[dict], t: dict, meta: dict, samples: int | None = None, local: bool = False) -> list[dict]:
    """The findings, each with its `saving`: the prediction of its what_if, or why there is none. The
    model is built once for all of them."""
    asked = [i for i, f in enumerate(found) if f.get("what_if") and not local]
    if samples is None:
        samples = max(2, min(SAMPLES, REPLAYED_TASKS // max(1, len(t.get("tasks", ())))))
    out = [f | {"saving": {"not_modelled": LOCAL if local else NOT_MODELLED.get(f["id"], UNKNOWN)}} for f in found]
    if not asked:
        return out
    try:
        made = sweep(t, meta, [changes(found[i]["what_if"]) for i in asked], samples)
    except NotModelled as e:
        made = [str(e)] * len(asked)
    except Exception as e:  # noqa: BLE001  a model that fails costs the numbers, said, not the analysis
        made = [f"the model failed on this run: {type(e).__name__}: {e}"] * len(asked)
    for i, p in zip(asked, made):
        c = changes(found[i]["what_if"]) if not isinstance(p, str) else None
        if c is not None and not p["thread_states"] and (c.cores or c.load is not None or not c.gil):
            p = UNCONTENDED  # a change of what the replay then leaves out: it would save 0, wrongly
        out[i]["saving"] = {"not_modelled": p} if isinstance(p, str) else saving(c, p)
    return out


def saving(c: Changes, p: dict) -> dict:
    """summary.json's finding.saving from a prediction: the measured makespan less the saving (the
    unchanged replay less the changed one), and its interval."""
    m, lo, hi = p["measured_s"], *p["saving_interval_s"]
    return {"change": words(c), "measured_s": m, "makespan_s": m - p["saving_s"], "interval_s": [m - hi, m - lo],
            "saving_s": p["saving_s"], "replay_error": p["replay_error"]}


# a change in the user's terms: a factor of 0 (or gil=0) as what is gone, a count as what there would be
GONE = {"load": "no other load on the machine", "gil": "no waits for the GIL", "network": "no time on the wire",
        "decisions": "the scheduler's decisions free", "blocked": "the tasks never blocked",
        "client": "no client time between computations", "bookkeeping": "no runtime bookkeeping"}
COUNTS = {"workers": "{} worker(s)", "threads": "{} thread(s) each", "cores": "{} cores", "delay_ms": "{} ms links",
          "scheduler": "the {} scheduler"}


def words(c: Changes) -> str:
    made = [(f.name, getattr(c, f.name)) for f in fields(c) if getattr(c, f.name) != f.default]
    return ", ".join(_word(k, v) for k, v in made) or "unchanged"


def _word(name: str, value) -> str:
    if name == "at_median":
        return f"{len(value)} straggler(s) at their prefix's median compute"
    if name in GONE and not value:
        return GONE[name]
    return COUNTS[name].format(value) if name in COUNTS else f"{name} x{value}"


def top(found: list[dict], n: int = TOP) -> list[dict]:
    """The findings whose advice the model predicts to save at least MIN_SAVING of the makespan, the
    largest saving first: what the terminal and report.html show."""
    saves = [f for f in found if (s := f.get("saving") or {}).get("saving_s") is not None
             and s["saving_s"] >= MIN_SAVING * s["measured_s"]]
    return sorted(saves, key=lambda f: -f["saving"]["saving_s"])[:n]


def savings(t: dict, meta: dict, found: list[dict], samples: int = 5) -> list[dict]:
    """`daskprobe whatif --findings`: per finding whose advice the model replays, its id, the change and
    the prediction."""
    return [{"id": f["id"], "change": s["change"], "measured_s": s["measured_s"], "makespan_s": s["makespan_s"],
             "interval_s": s["interval_s"], "saving_s": s["saving_s"]}
            for f in quote(found, t, meta, samples) if "saving_s" in (s := f["saving"])]
