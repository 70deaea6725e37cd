"""What the CLI tells a user, checked against what it ran: defaults, warnings, explain, the summary."""

import io
import json
import re

from rich.console import Console

from helpers import daskprobe, run_flow

from daskprobe.analyzers.categories import DEFINITIONS
from daskprobe.dashboards.terminal import print_summary


def test_defaults_are_those_of_local_cluster(tmp_path):
    """A worker of `daskprobe run` gets the threads and memory that LocalCluster gives one of its own."""
    flow = """
    import json
    from distributed import Client, LocalCluster

    class Real(LocalCluster):  # a real one: the client hook gives LocalCluster itself daskprobe's cluster
        pass

    def shape(client):
        return sorted((w["nthreads"], w["memory_limit"]) for w in client.scheduler_info()["workers"].values())

    if __name__ == "__main__":  # LocalCluster's workers are spawned: they import this file
        with Client() as c:
            c.wait_for_workers(2)
            ours = shape(c)
        with Real(n_workers=2, dashboard_address=":0", host="127.0.0.1") as lc, Client(lc) as c:
            theirs = shape(c)
        print("SHAPES", json.dumps([ours, theirs]))
    """
    _, p = run_flow(tmp_path, flow, "--workers", "2", "--probes", "proxy", "--no-trace")
    ours, theirs = json.loads(p.stdout.split("SHAPES", 1)[1])
    assert [t for t, _ in ours] == [t for t, _ in theirs]
    # LocalCluster rounds its share of the machine's memory; ours is that share to the byte
    assert all(abs(a[1] - b[1]) <= 2**20 for a, b in zip(ours, theirs)), (ours, theirs)


def test_a_client_of_another_cluster_is_told_it_bypassed_daskprobe(tmp_path):
    flow = """
    from distributed import Client, LocalCluster
    class Other(LocalCluster):  # LocalCluster itself would get daskprobe's cluster (the client hook)
        pass
    with Other(n_workers=1, processes=False, dashboard_address=":0") as lc, Client(lc) as c:
        assert c.submit(sum, [1, 2]).result() == 3
    """
    run, p = run_flow(tmp_path, flow, "--workers", "1", "--probes", "proxy", "--no-trace")
    assert "DASK_SCHEDULER_ADDRESS" in p.stderr, p.stderr[-2000:]
    assert "DASK_SCHEDULER_ADDRESS" in json.loads((run / "summary.json").read_text())["error"]


def test_explain_says_what_a_category_means_and_catches_typos():
    one = daskprobe("explain", "network")
    assert one.returncode == 0
    assert " ".join(one.stdout.split()[2:]) == " ".join(DEFINITIONS["network"].split())
    every = daskprobe("explain")
    assert every.returncode == 0 and all(f"{c} (category):" in every.stdout for c in DEFINITIONS)
    typo = daskprobe("explain", "netwrok")
    assert typo.returncode != 0 and "did you mean network?" in typo.stderr


def test_the_terminal_summary_is_compact_and_adds_up(pinned_run):
    run, _, _ = pinned_run
    summary = json.loads((run / "summary.json").read_text())
    out = io.StringIO()
    print_summary(summary, Console(file=out, width=100, color_system=None))
    lines = out.getvalue().splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100, out.getvalue()
    rows = (re.match(r"([a-z_]+)\s+(\d+\.\d+)\s+(\d+\.\d)\s", line) for line in lines)
    shown = {m[1]: float(m[3]) for m in rows if m}  # category -> % of the session
    positive = {c for c, v in summary["critical_path_s"].items() if v > 0}
    assert set(shown) == positive
    assert abs(sum(shown.values()) - 100) < 0.1 * len(shown)  # each rounded to 0.1
    assert not any(DEFINITIONS[c][:40] in out.getvalue() for c in positive), "definitions belong to explain"
