"""The sampler's text captures: a malformed line is left out and counted, never the file."""

from collections import Counter

from daskprobe.probes import procfs, pyspy

S = "S\t{t}\t10\t11\t1\t0\tMainThread\t{ids}\t7\t0\t1\t10000000"


def test_malformed_sample_lines_are_counted_and_a_lost_frame_is_named(tmp_path):
    lines = ["F\t0\tmain\t/a.py\t1", "F\t1\tf\t/a.py\t2", "F\t1\tg\t/b.py\t3",  # frame 1 defined twice
             "F\t2\th\t/a.py", "F\tx\th\t/a.py\t4",                               # frame 2's line malformed
             S.format(t=1, ids="1,0"), S.format(t=2, ids="2,0"), S.format(t=3, ids="1,x"),
             S.format(t="9" * 25, ids="0"), "Q\twhat", "", "A\t1\t10\tworker\tcpython311"]
    (tmp_path / "pyspy.tsv").write_text("\n".join(lines) + "\nS\t4\t1")  # and a torn last line: not counted
    bad = Counter()
    samples, stacks, frames = pyspy.read_samples(tmp_path / "pyspy.tsv", bad)
    assert samples.t_ns.tolist() == [1, 2]
    assert frames.values.tolist() == [[0, "main", "/a.py", 1], [1, "f", "/a.py", 2], [2, pyspy.LOST, "", 0]]
    assert stacks.frame_ids.tolist() == [[1, 0], [2, 0]]
    # the second frame 1, two frame 2 lines, the ids x, the t_ns no int64 holds, Q, the empty line; frame 2 lost
    assert bad == {"pyspy.tsv": 8}
    assert pyspy.read_samples(tmp_path / "pyspy.tsv")[0].t_ns.tolist() == [1, 2], "counting is optional"


def test_malformed_proc_and_thread_lines_are_counted(tmp_path):
    (tmp_path / "proc.tsv").write_text("100\t10\t1\t2\t3\t40\n200\t10\t1\t2\t3\n300\t10\t1\t2\t3\t4x\n"
                                       f"400\t10\t1\t2\t3\t{'9' * 19}\n500\t10\t2\t2\t3\t50\t6\n600\t10\t2\t2\t3\t60\n")
    (tmp_path / "threads.tsv").write_text("10\t10\tpython\n10\t\tx\n10\t12\n10\t13\tloop\textra\n10\t14\tw\n")
    bad = Counter()
    assert procfs.read_proc(tmp_path / "proc.tsv", bad).cpu_s.tolist() == [40e-9, 60e-9]
    assert procfs.read_thread_names(tmp_path / "threads.tsv", bad).tid.tolist() == [10, 14]
    assert bad == {"proc.tsv": 4, "threads.tsv": 3}
