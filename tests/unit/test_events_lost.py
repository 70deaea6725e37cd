"""A probe that lost events says so: the eBPF agent's ring-buffer losses (a line of its status file,
until now only among run.json's skipped_per_process) reach run.json's events_lost, and the caveats the
terminal and the report print name the figures that cannot be trusted (issue 39: 282,588 events lost
at 64 workers, and CPU from samples read 23x /proc's)."""

import pandas as pd

from daskprobe.analyzers.caveats import caveats
from daskprobe.probes.rundir import RunDir
from daskprobe.probes.schema import TABLES
from daskprobe.tracer.decode import tables

STATUS = "A\t-1\tattached\nA\t812\twatching scheduler\nE\t-1\t282588 events lost: the ring buffer was full\n"


def _probed(tmp_path, status: str | None) -> dict:
    for sub in ("captures", "tables"):
        (tmp_path / sub).mkdir(parents=True)
    run = RunDir(tmp_path)
    if status is not None:
        (tmp_path / "captures" / "ebpf_status.tsv").write_text(status)
    run.update_meta(processes=[])
    return tables.probe_tables(run, tables.processes_table(run.meta()),
                               pd.DataFrame(columns=TABLES["connections"].names))


def test_the_agents_losses_are_counted_for_run_json(tmp_path):
    assert _probed(tmp_path, STATUS)["events_lost"] == {"ebpf": 282588}


def test_no_loss_no_agent_nothing_said(tmp_path):
    assert _probed(tmp_path / "a", STATUS.rsplit("E\t", 1)[0])["events_lost"] == {}
    assert _probed(tmp_path / "b", None)["events_lost"] == {}


def test_the_caveats_name_what_cannot_be_trusted():
    meta = {"probes": ["proxy", "proc", "cpu", "gil"], "events_lost": {"ebpf": 282588}}
    said = [c for c in caveats(meta, {}) if "eBPF" in c]
    assert len(said) == 1 and "282,588 events" in said[0] and "not to be trusted" in said[0]
    assert "CPU samples" in said[0] and "gil_contention" in said[0]
    assert "cpu_starvation" not in said[0], "offcpu did not run: its figures are not in doubt"
    assert not [c for c in caveats({"probes": ["cpu"]}, {}) if "eBPF" in c]
