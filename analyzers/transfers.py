"""Data moved between workers: every message in which one worker sent another task data. Inputs a
worker fetched come back in replies to its get_data; a P2P shuffle or rechunk sends its pieces in
shuffle_receive requests, whose replies are empty."""

from __future__ import annotations

import pandas as pd

from .jobs import exchanges

PUSHED = ("shuffle_receive",)  # ops whose request carries the data
COLUMNS = ["src", "dst", "kind", "t_first_ns", "t_last_ns", "bytes"]
MIN_WIRE_S = 1e-3  # a rate over less wire time than this says more about the clock than the link


def transfers(messages: pd.DataFrame, fetched: pd.DataFrame | None = None) -> pd.DataFrame:
    """Table transfers. fetched: exchanges(messages), if the caller has them."""
    fetched = exchanges(messages) if fetched is None else fetched
    fetched = pd.DataFrame({"src": fetched.dst, "dst": fetched.src, "kind": "get_data", "t_first_ns": fetched.rep_first,
                            "t_last_ns": fetched.rep_last, "bytes": fetched.rep_bytes})
    m = messages[(messages.src_role == "worker") & (messages.dst_role == "worker") & messages.op.isin(PUSHED)]
    pushed = m.drop_duplicates("msg_id").rename(columns={"op": "kind", "msg_bytes": "bytes"})
    out = pd.concat([fetched, pushed[COLUMNS]], ignore_index=True)
    return out.sort_values("t_first_ns", kind="stable", ignore_index=True)[COLUMNS]


def moved(transfers: pd.DataFrame) -> dict:
    """summary.json's moved: bytes between workers by kind, and their rate where the wire time allows one."""
    if transfers.empty:  # most runs: no grouping to pay for
        return {"bytes": 0, "by_kind": {}}
    by = transfers.assign(wire_s=(transfers.t_last_ns - transfers.t_first_ns) / 1e9).groupby("kind").agg(
        bytes=("bytes", "sum"), messages=("bytes", "size"), wire_s=("wire_s", "sum"))
    return {"bytes": int(transfers.bytes.sum()),
            "by_kind": {k: {"bytes": int(r.bytes), "messages": int(r.messages),
                            "mb_per_s": rate(r.bytes, r.wire_s)} for k, r in by.iterrows()}}


def rate(nbytes: float, wire_s: float) -> float | None:
    """MB/s over the wire time, or None where it is too short to time."""
    return nbytes / 1e6 / wire_s if wire_s >= MIN_WIRE_S else None
