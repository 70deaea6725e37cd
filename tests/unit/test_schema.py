"""Table schemas (probes/schema.py): checked on write, and docs/tables.md rendered from them."""

import numpy as np
import pandas as pd
import pytest

from daskprobe.probes import schema
from daskprobe.probes.rundir import RunDir


def test_docs_tables_md_is_the_rendered_schema():
    assert schema.DOC.read_text() == schema.markdown(), (
        "docs/tables.md differs from probes/schema.py: run python -m daskprobe.probes.schema")


def test_every_column_has_a_known_dtype_and_a_definition():
    for name, table in schema.TABLES.items():
        assert table.doc and len(set(table.names)) == len(table.names), name
        for c in table.columns:
            assert c.dtype in schema.ARROW and c.doc, f"{name}.{c.name}"


def _run(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "run")
    (run / "tables").mkdir(parents=True)
    return run


def _gil_waits(**extra) -> pd.DataFrame:
    return pd.DataFrame({"pid": [1, 1], "tid": [2, 3], "start_ns": [10, 20], "end_ns": [15, 26],
                         "wait_ns": [5, 6], "process": ["worker-0", None], "host": ["local", None], **extra})


def test_write_table_refuses_an_unknown_table_or_column_and_a_missing_one(tmp_path):
    run = _run(tmp_path)
    with pytest.raises(schema.SchemaError, match="'gil_waitz'"):
        run.write_table("gil_waitz", _gil_waits())
    with pytest.raises(schema.SchemaError, match="'gil_waits'.*'holder'"):
        run.write_table("gil_waits", _gil_waits(holder=[4, 5]))
    with pytest.raises(schema.SchemaError, match="'gil_waits'.*'wait_ns'"):
        run.write_table("gil_waits", _gil_waits().drop(columns="wait_ns"))
    assert not run.has_table("gil_waits") and not run.has_table("gil_waitz")


def test_write_table_casts_to_the_schema_and_writes_in_its_order(tmp_path):
    run = _run(tmp_path)
    df = _gil_waits().astype({"start_ns": "float64", "wait_ns": "Int64"})
    run.write_table("gil_waits", df[df.columns[::-1]])
    t = run.table("gil_waits")
    assert list(t.columns) == schema.TABLES["gil_waits"].names
    assert [str(d) for d in t.dtypes] == [c.dtype for c in schema.TABLES["gil_waits"].columns]
    assert t.start_ns.tolist() == [10, 20] and t.process.isna().tolist() == [False, True]
    # the sampler's optional fields: nullable where its eBPF rows have none
    samples = pd.DataFrame({"t_ns": [1, 2], "pid": [1, 1], "tid": [1, 1], "thread_name": ["MainThread", None],
                            "active": [True, True], "owns_gil": np.array([False, None], dtype=object),
                            "stack_id": [0, 1], "ident": [140234081310528.0, np.nan],
                            "stale": np.array([True, None], dtype=object),
                            "tick": np.array([True, None], dtype=object), "period_ns": [9_000_000.0, np.nan],
                            "source": ["pyspy", "ebpf"],
                            "cpu": [np.nan, 3.0], "process": ["scheduler", "scheduler"], "host": ["local", "local"]})
    run.write_table("samples", samples)
    s = run.table("samples")
    assert (s.owns_gil.dtype, s.ident.dtype, s.stale.dtype, s.tick.dtype, s.period_ns.dtype, s.cpu.dtype) == (
        "boolean", "Int64", "boolean", "boolean", "Int64", "Int64")
    assert s.ident[0] == 140234081310528 and pd.isna(s.ident[1]) and s.cpu[1] == 3
    assert s.period_ns[0] == 9_000_000 and pd.isna(s.period_ns[1])


@pytest.mark.parametrize("column, values, why", [
    ("wait_ns", [5.5, 6.0], "int64"),                # not a whole number
    ("start_ns", [10, None], "nulls"),               # int64 holds no nulls
    ("process", [1, 2], "integer values"),           # a number is not a name
    ("pid", ["1", "2"], "string values"),            # nor a name a number
])
def test_write_table_refuses_a_column_that_does_not_fit_its_dtype(tmp_path, column, values, why):
    with pytest.raises(schema.SchemaError, match=f"'gil_waits'.*'{column}'.*{why}"):
        _run(tmp_path).write_table("gil_waits", _gil_waits(**{column: values}))


def test_a_list_column_of_the_wrong_element_type_is_refused(tmp_path):
    run = _run(tmp_path)
    run.write_table("stacks", pd.DataFrame({"stack_id": [0], "frame_ids": [[3, 1, 2]], "host": ["local"]}))
    assert run.table("stacks").frame_ids[0].tolist() == [3, 1, 2]
    with pytest.raises(schema.SchemaError, match="'stacks'"):
        run.write_table("stacks", pd.DataFrame({"stack_id": [0], "frame_ids": [["f", "g"]], "host": ["local"]}))
