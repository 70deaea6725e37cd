"""The pure pieces every split is built from: interval arithmetic and the stack rules."""

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from daskprobe.analyzers.categories import RULES_DIR, UNCATEGORIZED, classify_stacks, load_rules
from daskprobe.analyzers.intervals import intersect, overlap_ns, subtract, union

spans = st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), max_size=12)


def cover(starts, ends) -> set[int]:
    return {t for s, e in zip(starts, ends) for t in range(int(s), int(e))}


@settings(max_examples=200, deadline=None)
@given(spans, spans)
def test_union_intersect_subtract_agree_with_sets_of_instants(a, b):
    a0, a1 = union([s for s, _ in a], [s + n for s, n in a])
    b0, b1 = union([s for s, _ in b], [s + n for s, n in b])
    assert (a0[1:] > a1[:-1]).all(), "disjoint and sorted, touching intervals merged"
    s, e, which = intersect(a0, a1, b0, b1)
    assert cover(s, e) == cover(a0, a1) & cover(b0, b1)
    assert all(a0[w] <= x and y <= a1[w] for x, y, w in zip(s, e, which))
    assert cover(*subtract(a0, a1, b0, b1)) == cover(a0, a1) - cover(b0, b1)
    assert list(overlap_ns(a0, a1, b0, b1)) == [len(cover([x], [y]) & cover(b0, b1)) for x, y in zip(a0, a1)]


def test_a_stack_takes_the_category_of_the_first_rule_any_of_its_frames_matches():
    rules = load_rules([RULES_DIR / "dask.toml"])
    frames = pd.DataFrame({"frame_id": [0, 1, 2, 3],
                           "function": ["SchedulerState.decide_worker_non_rootish",
                                        "SchedulerState._transition_waiting_processing", "my_func", "select"],
                           "filename": ["distributed/scheduler.py", "distributed/scheduler.py", "/home/me/flow.py",
                                        "selectors.py"]})
    stacks = pd.DataFrame({"stack_id": [10, 11, 12], "frame_ids": [[0, 1], [1], [2]]})
    cat = classify_stacks(stacks, frames, rules)
    assert cat[10] == "scheduler_decisions" and cat[11] == "runtime_bookkeeping"
    assert cat[12] == UNCATEGORIZED
    lost = classify_stacks(pd.DataFrame({"stack_id": [13], "frame_ids": [[99]]}), frames, rules)
    assert lost[13] == UNCATEGORIZED, "a frame whose definition was torn off matches nothing"


def test_an_attempt_goes_to_the_thread_of_its_ident_seen_nearest_its_start():
    from daskprobe.analyzers.thread_state import attempt_threads
    # ident 7 is first a thread sampled only after its first task began, later a new thread's
    threads = pd.DataFrame({"process": ["worker-0"] * 3, "ident": [7, 7, 9], "tid": [101, 102, 103],
                            "name": ["a", "b", "c"], "first_ns": [150, 1_000, 0], "last_ns": [500, 2_000, 2_000]})
    attempts = pd.DataFrame({"worker": ["worker-0"] * 5, "thread": [7, 7, None, 7, 9],
                             "compute_start_ns": [100, 400, 300, 1_200, 100]})
    # the third never named its thread: no row
    assert attempt_threads(attempts, threads).set_index("attempt").tid.to_dict() == {0: 101, 1: 101, 3: 102, 4: 103}
