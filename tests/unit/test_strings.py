"""The analysis holds text as Python strings (analyzers/strings.py): the same values, nulls and
dtype as pandas' pyarrow-backed default, and a large table keeps pyarrow's."""

import numpy as np
import pandas as pd

from daskprobe.analyzers import strings


def arrow_frame(rows: int = 3) -> pd.DataFrame:
    df = pd.DataFrame({"op": (["compute-task", None, "task-finished"] * rows)[:rows], "n": np.arange(rows)})
    assert df.op.dtype.storage == "pyarrow" and df.columns.dtype.storage == "pyarrow"  # pandas' default here
    return df


def test_text_and_labels_become_python_strings_with_the_same_values_and_nulls():
    df = arrow_frame()
    out = strings.as_python_strings(df)
    assert out.op.dtype == "str" and out.op.dtype.storage == "python" and out.columns.dtype.storage == "python"
    assert out.op.isna().tolist() == [False, True, False] and out.op.dropna().tolist() == ["compute-task", "task-finished"]
    assert out.n.tolist() == [0, 1, 2]
    assert df.op.dtype.storage == "pyarrow", "the caller's frame is left as it was"


def test_a_large_table_keeps_its_text_in_pyarrow(monkeypatch):
    monkeypatch.setattr(strings, "LARGE", 2)
    out = strings.as_python_strings(arrow_frame(3))
    assert out.op.dtype.storage == "pyarrow" and out.columns.dtype.storage == "python"


def test_text_made_inside_the_analysis_is_python_strings():
    @strings.in_python_strings
    def made(tables: dict) -> pd.DataFrame:
        return tables["t"].assign(kind="compute")
    out = made({"t": arrow_frame()})
    assert out.kind.dtype.storage == "python" and out.op.dtype.storage == "python"
    assert pd.get_option("mode.string_storage") != "python", "the option is set only while it runs"
