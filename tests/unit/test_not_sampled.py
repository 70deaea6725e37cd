"""A process the Python sampler would not sample (it could not attach, or refused the interpreter's
files) is in run.json's skipped_per_process with the sampler's reason; one that exited is not."""

import pandas as pd

from daskprobe.probes.rundir import RunDir
from daskprobe.probes.schema import TABLES
from daskprobe.tracer.decode import tables

REFUSED = "worker-0: /home/u/libpython3.11.so not read (2147483648 bytes, over the 1073741824-byte cap)"


def test_a_process_the_sampler_refused_is_said_with_its_reason(tmp_path):
    run = RunDir(tmp_path)
    for sub in ("captures", "tables"):
        (tmp_path / sub).mkdir()
    (tmp_path / "captures" / "pyspy.tsv").write_text(
        f"A\t1\t10\tscheduler\tcpython311\nE\t2\t11\t{REFUSED}\nE\t3\t10\tprocess exited\n")
    run.update_meta(processes=[])
    procs = tables.processes_table(run.meta())
    failed = tables.probe_tables(run, procs, pd.DataFrame(columns=TABLES["connections"].names))["failed"]
    assert failed == [f"pid 11: Python stacks not sampled: {REFUSED}"]
