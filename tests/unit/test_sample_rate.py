"""experiments/sample_rate.py's thinning: the phases of a rate share no sample and miss none, and
each stands for the CPU time of the whole."""

import pandas as pd

from daskprobe.experiments.sample_rate import thinned


def test_the_phases_partition_the_reads_and_keep_each_read_whole():
    reads = [(pid, t) for pid in (10, 20) for t in range(0, 100, 10)]
    py = pd.DataFrame([{"t_ns": t, "pid": pid, "tid": tid, "source": "pyspy", "cpu": pd.NA, "period_ns": 10**7}
                       for pid, t in reads for tid in (pid, pid + 1)])  # two threads per read
    cpu = pd.DataFrame([{"t_ns": t, "pid": 30, "tid": 30, "source": "ebpf", "cpu": c}
                        for c in (0, 1) for t in range(3, 100, 10)])
    samples = pd.concat([py, cpu], ignore_index=True)
    for k in (2, 5):
        parts = [thinned(samples, k, phase) for phase in range(k)]
        key = ["t_ns", "pid", "tid", "cpu"]
        together = pd.concat(parts).sort_values(key).reset_index(drop=True)
        assert together[key].astype(str).equals(samples.sort_values(key).reset_index(drop=True)[key].astype(str))
        for part in parts:
            # a read keeps both its threads; each process and each CPU keeps 1 in k
            assert (part[part.source == "pyspy"].groupby(["pid", "t_ns"]).size() == 2).all()
            assert (part[part.source == "pyspy"].groupby("pid").t_ns.nunique() == 10 // k).all()
            assert (part[part.source == "ebpf"].groupby("cpu").size() == 10 // k).all()
            # and its ticks stand for the CPU time all of them did
            assert part[part.source == "pyspy"].period_ns.sum() == py.period_ns.sum()
