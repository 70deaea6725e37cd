"""experiments/overhead.py's CPU while the session ran, from the proc table's cumulative readings."""

import json

import pandas as pd
import pytest

from daskprobe.experiments.overhead import bpf_time, session_cpu


def test_cpu_inside_the_window_is_interpolated_and_shared_out_by_role(tmp_path):
    (tmp_path / "tables").mkdir()
    (tmp_path / "summary.json").write_text(json.dumps({"session_window_ns": [1_500, 3_500]}))
    pd.DataFrame({"name": ["scheduler", "worker-0", "proxy", "probe:pyspy", "daskprobe"],
                  "role": ["scheduler", "worker", "proxy", "probe", "probe"]}).to_parquet(
        tmp_path / "tables" / "processes.parquet")
    rows = []
    for name, per_ns in (("scheduler", 2.0), ("worker-0", 1.0), ("proxy", 0.1), ("probe:pyspy", 0.05),
                         ("daskprobe", 0.0)):
        rows += [{"process": name, "t_ns": t, "cpu_s": 5.0 + per_ns * t} for t in (0, 1_000, 2_000, 3_000, 4_000)]
    pd.DataFrame(rows).to_parquet(tmp_path / "tables" / "proc.parquet")
    got = session_cpu(tmp_path)
    assert got["session_cluster_cpu_s"] == pytest.approx(2_000 * 3.0)  # 2,000 ns of the window at 3 s per ns
    assert got["session_cpu_s[proxy]"] == pytest.approx(200) and got["session_cpu_s[daskprobe]"] == 0
    assert got["measuring_share"] == pytest.approx((200 + 100) / 6_000)


def test_bpf_time_sums_each_program_s_lines_against_the_cluster_s_cpu_over_the_run(tmp_path):
    for d in ("tables", "captures"):
        (tmp_path / d).mkdir()
    (tmp_path / "captures" / "ebpf_programs.tsv").write_text(
        "on_cpu_sample\t10\t3000000\nsampler_tick\t5\t1000000\nsampler_tick\t7\t2000000\n")
    pd.DataFrame({"name": ["scheduler", "worker-0", "probe:pyspy,proc"], "role": ["scheduler", "worker", "probe"]}
                 ).to_parquet(tmp_path / "tables" / "processes.parquet")
    pd.DataFrame({"process": ["scheduler", "scheduler", "worker-0", "worker-0", "probe:pyspy,proc"],
                  "t_ns": [0, 10, 0, 10, 10], "cpu_s": [1.0, 3.0, 0.5, 1.5, 9.0]}).to_parquet(
        tmp_path / "tables" / "proc.parquet")
    got = bpf_time(tmp_path)
    assert got == pytest.approx({"bpf_s[on_cpu_sample]": 0.003, "bpf_s[sampler_tick]": 0.003,
                                 "run_cluster_cpu_s": 3.0})
    assert bpf_time(tmp_path.parent / "none") == {}


def test_pool_compares_the_pair_its_sets_ran_and_refuses_to_guess_between_two(tmp_path, capsys):
    from daskprobe.experiments.overhead import main, pooled_pairs
    sets = [tmp_path / name for name in ("a", "b", "c")]
    for d, compare in zip(sets, ["all / none", "all / none", "proxy / none"]):
        d.mkdir()
        (d / "results.json").write_text(json.dumps({"compare": compare}))
    assert pooled_pairs(sets[:2]) == {"none:all"}
    with pytest.raises(SystemExit):
        main(["--pool", *map(str, sets)])
    assert "compared different pairs (none:all, none:proxy)" in capsys.readouterr().err


def test_an_a_a_set_keeps_its_two_sides_apart_and_pools_to_their_ratio(tmp_path):
    from daskprobe.experiments.overhead import pooled, pooled_pairs, sides, summarize
    assert sides("none", "none") == ("none (A)", "none (B)") and sides("none", "all") == ("none", "all")
    (tmp_path / "results.json").write_text(json.dumps({"compare": "none / none"}))
    a, b = sides(*pooled_pairs([tmp_path]).pop().split(":"))
    pd.DataFrame({"graph": ["g"] * 4, "rep": [0, 0, 1, 1], "probes": [a, b, b, a],
                  "makespan_s": [10.0, 11.0, 9.0, 10.0]}).to_csv(tmp_path / "results.csv", index=False)
    row = summarize(pooled([tmp_path]), (a, b)).iloc[0]
    # the pairs' ratios B/A are 1.1 and 0.9
    assert (row.ratio_median, row.ratio_min, row.ratio_max, row.pairs) == pytest.approx((1.0, 0.9, 1.1, 2))
