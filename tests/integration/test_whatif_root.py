"""whatif --scaling as root in another user's bench directory reads it as that user: a results.csv the
user links to a file only root may read is not read."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from daskprobe.dashboards import bench_results

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

READ = """import sys
from daskprobe.tracer.commands.whatif_verb import scaling
print(scaling(sys.argv[1]).points)
"""


def test_root_reads_a_users_bench_as_that_user():
    base = Path(tempfile.mkdtemp())
    try:
        os.chmod(base, 0o755)
        secret = base / "root-only.csv"  # a bench's results that only root may read: would fit if read
        rows = [{"graph": "merge-1K", "workers": w, "repeat": 0, "status": "ok", "server": "dask", "tasks": 1000,
                 "scheduler_cpu_s": 0.5 + w / 1000} for w in (8, 16, 32)]
        secret.write_text(bench_results.frame(rows).to_csv(index=False))
        os.chmod(secret, 0o600)
        bench = base / "bench"
        bench.mkdir()
        (bench / "results.csv").symlink_to(secret)
        os.lchown(bench / "results.csv", NOBODY, NOBODY)
        os.chown(bench, NOBODY, NOBODY)
        p = subprocess.run([sys.executable, "-c", READ, str(bench)], capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and "PermissionError" in p.stderr, p.stdout + p.stderr
        # the same directory root's own: read, as it should be
        os.chown(bench, 0, 0)
        p = subprocess.run([sys.executable, "-c", READ, str(bench)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stdout.strip() == "3", p.stderr
    finally:
        shutil.rmtree(base)
