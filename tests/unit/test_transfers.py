"""Data moved between workers: get_data replies and P2P shuffle_receive requests, and their rates."""

import pandas as pd
import pytest

from daskprobe.analyzers.transfers import moved, transfers
from scenario import Scenario


def test_fetched_inputs_and_p2p_pieces_both_count_as_moved():
    s = Scenario()
    ask = s.message("worker-1", "worker-0", 10, 10.1, "get_data")
    s.message("worker-0", "worker-1", 12, 22, "reply")  # 10 ms on the wire
    s.msgs[-1]["reply_to"] = ask
    s.msgs[-1]["msg_bytes"] = 5_000_000
    s.message("worker-0", "worker-1", 30, 30.5, "shuffle_receive")  # a P2P piece: the request carries it
    s.msgs[-1]["msg_bytes"] = 20_000_000
    s.message("worker-1", "worker-0", 31, 31.1, "reply")
    s.message("worker-0", "scheduler", 32, 33, "task-finished")  # not between workers
    t = transfers(pd.DataFrame(s.msgs))
    assert t[["src", "dst", "kind", "bytes"]].values.tolist() == [["worker-0", "worker-1", "get_data", 5_000_000],
                                                                 ["worker-0", "worker-1", "shuffle_receive", 20_000_000]]
    m = moved(t)
    assert m["bytes"] == 25_000_000
    assert m["by_kind"]["get_data"]["mb_per_s"] == pytest.approx(500.0)
    assert m["by_kind"]["shuffle_receive"]["mb_per_s"] is None  # 0.5 ms on the wire: too short to time
