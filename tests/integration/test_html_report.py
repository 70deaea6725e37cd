"""report.html in a real browser: headless Chromium loads it offline, no
JavaScript error, every figure drawn (checked in the DOM); a screenshot is kept."""

import json
import re
import subprocess
from pathlib import Path

from helpers import chromium, drawn

from daskprobe.dashboards.html_report import FIGURES

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def test_report_opens_offline_with_every_figure_drawn(pinned_run, tmp_path):
    run, _, _ = pinned_run
    page = run / "report.html"
    assert page.exists() and "<script src=" not in page.read_text(), "self-contained: no external scripts"
    body = drawn(tmp_path, page)
    assert "data-errors" not in body, body
    figures = int(re.search(r'data-figures="(\d+)"', body).group(1))
    text = page.read_text()
    plots = text.count('class="plotly-graph-div"')
    # every figure with data is drawn; one run of one job has no per-job figure, and the scheduler of
    # 41 tasks may never be caught on a CPU (a sample every 10 ms, under 0.1 s of work), which leaves out
    # its two figures (its CPU over time, and by call path): nothing else is left out
    cpu = run.table("cpu_samples")
    idle = not ((cpu.process == "scheduler") & cpu.on_cpu).any()
    titles = re.findall(r"<section id='[^']*'><h2>([^<]*)</h2>", text)
    assert figures == plots == len(FIGURES) - 1 - 2 * idle and "class='empty'" not in text, (figures, plots, titles)
    assert "What to change" in text and "Task prefixes" in text
    # the task stream names each worker's thread as Python does, and draws the sum's input fetches
    assert "Dask-Default-Threads" in text and "transfer (fetching inputs)" in text
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    chromium(tmp_path, "--window-size=1300,4200", f"--screenshot={shot}", page.as_uri())
    assert shot.stat().st_size > 50_000


def test_open_serves_the_trace_to_the_perfetto_ui(pinned_run):
    import sys
    import urllib.request
    from daskprobe.tracer.capture.cluster import free_port
    run, _, _ = pinned_run
    port = free_port()  # the real default, 9001, may be held by something else on this machine
    p = subprocess.Popen([sys.executable, "-m", "daskprobe.tracer.commands", "open", str(run.path), "--port", str(port),
                          "--once"], stdout=subprocess.PIPE, text=True)
    try:
        p.stdout.readline()
        url = p.stdout.readline().strip()
        assert url == f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/trace.pftrace"
        req = urllib.request.Request(url.split("url=")[1], headers={"Origin": "https://ui.perfetto.dev"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
            assert resp.read() == run.trace.read_bytes()
        assert p.wait(10) == 0, "--once: exits after serving"
    finally:
        if p.poll() is None:
            p.kill()


def test_compare_runs_by_worker_count(tmp_path):
    import sys
    import pandas as pd
    from helpers import daskprobe, write_flow
    flow = "import runpy, sys\nsys.argv = ['w', 'merge-300']\nrunpy.run_module('daskprobe.tracer.bench.workloads', run_name='__main__')\n"
    script = write_flow(tmp_path / "flow.py", flow)  # one command: one graph, run twice
    runs = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        p = daskprobe("run", "--out", str(out), "--workers", workers, "--probes", "proxy,pyspy,proc",
                      "--", sys.executable, str(script))
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(str(out))
    out = tmp_path / "cmp"
    p = daskprobe("compare", *runs, "--by", "workers", "--out", str(out))
    assert p.returncode == 0, p.stderr
    df = pd.read_csv(out / "compare.csv")
    assert list(df.workers) == [1, 2] and (df.tasks == 301).all()
    assert (df.aot_s - df.makespan_s / df.tasks).abs().max() < 1e-9
    assert df["scheduler_cpu_per_task_s.runtime_bookkeeping"].gt(0).all()
    sp = pd.read_csv(out / "speedups.csv").set_index("workers")
    assert sp.loc[1, "geometric_mean_speedup"] == 1.0
    expected = df.makespan_s.iloc[0] / df.makespan_s.iloc[1]
    assert abs(sp.loc[2, "geometric_mean_speedup"] - expected) < 1e-9
    body = drawn(tmp_path, out / "compare.html")
    assert "data-errors" not in body and 'data-figures="4"' in body, body
    diff = pd.read_csv(out / "differences.csv")
    assert set(diff.workers) == {2} and diff.noisy.all(), "one run per point: every difference is within noise"
    # per prefix: each run's compute, as its workers reported it (startstops), side by side
    costs = pd.read_csv(out / "prefix_differences.csv").set_index("cost")
    for run, column in ((runs[0], "baseline_median"), (runs[1], "median")):
        t = pd.read_parquet(f"{run}/tables/attempts.parquet")
        t = t[t.outcome == "finished"]
        spans = ((t.compute_stop_ns - t.compute_start_ns) / 1e9).groupby(t.prefix).sum()
        for prefix, s in spans.items():
            assert abs(costs.loc[f"{prefix}: compute", column] - s) < 1e-6, (prefix, column)
    assert "Task prefixes: what grew, what shrank" in (out / "compare.html").read_text()
    assert "rest on fewer than 3 runs" in p.stderr and "rest on fewer than 3 runs" in (out / "compare.html").read_text()


def test_large_run_report_stays_small_and_draws(tmp_path):
    """A synthetic 50K-task run: figures are binned or sampled, the page stays small and draws."""
    from helpers import daskprobe
    from daskprobe.experiments.synthetic import write_run
    run = tmp_path / "big"
    write_run(run, 50_000, 4)
    p = daskprobe("build", "--no-trace", str(run))
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["tasks"] == 50_000 + 500 + 1  # leaves, sums of 100, the total
    assert abs(sum(summary["critical_path_s"].values()) - summary["makespan_s"]) < 0.01 * summary["makespan_s"]
    page = run / "report.html"
    assert page.stat().st_size < 15e6
    body = drawn(tmp_path, page)
    plots = page.read_text().count('class="plotly-graph-div"')
    assert "data-errors" not in body and f'data-figures="{plots}"' in body, body
    # without samples: scheduler CPU, GIL and top functions have nothing to show; one job: no per-job figure;
    # no get_data between workers: no bandwidth
    assert plots >= len(FIGURES) - 5, plots
