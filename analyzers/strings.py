"""Text held as Python strings while the analysis runs.

pandas 3 keeps text columns, and a frame's column labels, in pyarrow by default. The analysis takes
thousands of small steps (a filter, a merge, a column by its label), and each then converts between
pyarrow and Python: a quarter of the analysis of a small run. The dtype stays pandas' `str`; only
where it keeps the strings changes, so what the analysis computes does not."""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import pandas as pd

PYTHON_STR = pd.StringDtype("python", na_value=np.nan)
# rows of a table that keeps its text in pyarrow: there the conversions are few for its size, and Python
# strings would cost a few hundred bytes a row more (46 MB more for 128,000 messages)
LARGE = 100_000


@contextlib.contextmanager
def python_strings():
    """Text made inside the block (new columns, labels, frames read) is held as Python strings."""
    with pd.option_context("mode.string_storage", "python"):
        yield


def in_python_strings(fn):
    """fn(tables, ...) run inside python_strings(), on its tables dict (first argument) converted."""
    @functools.wraps(fn)
    def run(tables: dict, *args, **kwargs):
        if pd.get_option("mode.string_storage") == "python":  # called from inside: its tables are converted
            return fn(tables, *args, **kwargs)
        with python_strings():
            return fn({name: as_python_strings(df) for name, df in tables.items()}, *args, **kwargs)
    return run


def as_python_strings(df):
    """df with its column labels, and its text columns unless it is LARGE, held as Python strings."""
    if not isinstance(df, pd.DataFrame):
        return df
    text = [c for c, dtype in df.dtypes.items() if _arrow_str(dtype)] if len(df) <= LARGE else []
    labels = _arrow_str(df.columns.dtype)
    if not text and not labels:
        return df
    df = df.copy(deep=False)
    for c in text:  # a column at a time: 3 times faster than DataFrame.astype on a small frame
        df[c] = pd.array(df[c].to_numpy(object, na_value=np.nan), dtype=PYTHON_STR)
    if labels:
        df.columns = df.columns.astype(PYTHON_STR)
    return df


def _arrow_str(dtype) -> bool:
    return isinstance(dtype, pd.StringDtype) and dtype.storage != "python"
