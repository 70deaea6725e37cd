"""run.json's cluster.worker_environ against what the workers' own os.environ held (client.run), with a
nanny and without, Dask's defaults and a user's OMP_NUM_THREADS: what the library-threads advice reads."""

import json
import os

import pytest

from helpers import run_flow, searchable_dir

FLOW = """
import json, os, sys
from distributed import Client
with Client() as c:
    seen = c.run(lambda: {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                         "MKL_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_")})
json.dump(list(seen.values()), open(sys.argv[0] + ".json", "w"))
"""


@pytest.mark.parametrize("nanny, omp", [(False, None), (True, "3")])
def test_the_workers_environment_recorded_is_what_they_had(nanny, omp, monkeypatch):
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    tmp = searchable_dir("worker-environ")
    run, _ = run_flow(tmp, FLOW, "--probes", "none", *(["--nanny"] if nanny else []))
    seen = json.loads((tmp / "flow.py.json").read_text())
    recorded = run.meta()["cluster"]["worker_environ"]
    assert len(seen) == 2 and all(s == seen[0] for s in seen)
    assert {k: recorded.get(k) for k in seen[0]} == seen[0]
    assert recorded["OMP_NUM_THREADS"] == (omp or "1") and recorded["OPENBLAS_NUM_THREADS"] == "1"
