"""Interval arithmetic on sorted numpy arrays: what every overlap in the
analysis is computed with. Times are ns; a set of intervals is (starts, ends)
with each interval [start, end)."""

from __future__ import annotations

import numpy as np


def union(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """The union of any intervals, as sorted disjoint intervals."""
    s, e = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    if not len(s):
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]
    last = np.r_[new[1:], True]
    return s[new], reach[last]


def covered_before(t, starts, ends) -> np.ndarray:
    """Length of the (sorted, disjoint) intervals that lies before each time in t."""
    s, e = np.asarray(starts, dtype="float64"), np.asarray(ends, dtype="float64")
    t = np.asarray(t, dtype="float64")
    if not len(s):
        return np.zeros(len(t))
    before = np.concatenate([[0.0], np.cumsum(e - s)])
    k = np.searchsorted(s, t, side="right")
    last = np.clip(k - 1, 0, None)
    inside_last = np.clip(np.minimum(t, e[last]) - s[last], 0, None)
    return np.where(k > 0, before[last] + inside_last, 0.0)


def overlap_ns(starts, ends, iv_starts, iv_ends) -> np.ndarray:
    """Per segment [start, end), ns covered by the (sorted, disjoint) intervals."""
    return np.round(covered_before(ends, iv_starts, iv_ends) - covered_before(starts, iv_starts, iv_ends)).astype("int64")


def inside(times, starts, ends) -> np.ndarray:
    """Mask of times within any of the (sorted, disjoint) intervals."""
    times, starts, ends = (np.asarray(x) for x in (times, starts, ends))
    if not len(starts):
        return np.zeros(len(times), dtype=bool)
    i = np.searchsorted(starts, times, side="right") - 1
    return (i >= 0) & (times < ends[np.clip(i, 0, None)])


def intersect(a_starts, a_ends, b_starts, b_ends) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces where interval sets a and b (each sorted and disjoint) overlap:
    (starts, ends, index of the a-interval each piece lies in)."""
    a0, a1 = np.asarray(a_starts, dtype="int64"), np.asarray(a_ends, dtype="int64")
    b0, b1 = np.asarray(b_starts, dtype="int64"), np.asarray(b_ends, dtype="int64")
    if not len(a0) or not len(b0):
        empty = np.empty(0, dtype="int64")
        return empty, empty, empty
    lo = np.searchsorted(b1, a0, side="right")   # first b ending after a starts
    hi = np.searchsorted(b0, a1, side="left")    # b's starting before a ends
    n = np.clip(hi - lo, 0, None)
    which = np.repeat(np.arange(len(a0)), n)
    j = np.repeat(lo, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
    s, e = np.maximum(a0[which], b0[j]), np.minimum(a1[which], b1[j])
    keep = e > s
    return s[keep], e[keep], which[keep]


def subtract(a_starts, a_ends, b_starts, b_ends) -> tuple[np.ndarray, np.ndarray]:
    """a minus b (each sorted and disjoint): the parts of a that b does not cover."""
    a0, a1 = np.asarray(a_starts, dtype="int64"), np.asarray(a_ends, dtype="int64")
    b0, b1 = np.asarray(b_starts, dtype="int64"), np.asarray(b_ends, dtype="int64")
    if not len(b0) or not len(a0):
        return a0, a1
    # Boundaries of a and b together; keep the elementary pieces inside a and outside b.
    edges = np.sort(np.concatenate([a0, a1, b0, b1]))
    edges = edges[np.r_[True, edges[1:] != edges[:-1]]]  # np.unique hashes int64: several times slower
    s, e = edges[:-1], edges[1:]
    keep = inside(s, a0, a1) & ~inside(s, b0, b1)
    return union(s[keep], e[keep])
