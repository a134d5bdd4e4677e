"""Result tables as users read them: nanosecond columns as integers.

Times are whole nanoseconds everywhere a metric is computed (``ranks.csv`` is int ns), but a
column that passes through float arithmetic or holds a missing value (a failed sweep variant)
comes out float64 and is written ``446576883.0``. :func:`integer_ns` turns such columns back
into integers, nullable ``Int64`` (``<NA>``, an empty CSV cell) where a value is missing, and
only when every value is a whole number: no value ever changes.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

#: A nanosecond column: ``*_ns`` or ``*_ns_<suffix>`` (``iteration_time_ns_a``, ``_ns_diff``).
NS_COLUMN = re.compile(r".*_ns(_[A-Za-z0-9]+)*")
#: Value columns of a long metric table (``metric``, ``value_a``, ...: compare.csv).
LONG_VALUE_COLUMNS = ("value_a", "value_b", "abs_diff")
_INT64_SAFE = float(1 << 62)


def _whole(values: np.ndarray) -> bool:
    """Every finite value whole and inside int64, no infinity (NaN: missing, allowed)."""
    finite = values[~np.isnan(values)]
    return bool(np.isfinite(finite).all() and (np.abs(finite) < _INT64_SAFE).all()
                and (finite == np.round(finite)).all())


def integer_ns(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose float nanosecond columns holding only whole numbers are
    ``Int64``; in a long table (a ``metric`` column) the rows of ``*_ns`` metrics hold Python
    ints in the value columns (which then have dtype object). Other columns are unchanged."""
    out = frame.copy()
    for c in out.columns:
        if isinstance(c, str) and NS_COLUMN.fullmatch(c) and out[c].dtype.kind == "f" \
                and _whole(out[c].to_numpy()):
            out[c] = out[c].astype("Int64")
    if "metric" in out.columns and len(out):
        rows = out["metric"].astype(str).map(lambda m: NS_COLUMN.fullmatch(m) is not None)
        rows = rows.to_numpy(dtype=bool)
        for c in LONG_VALUE_COLUMNS:
            if c not in out.columns or out[c].dtype.kind != "f":
                continue
            v = out[c].to_numpy()
            if not rows.any() or not _whole(v[rows]):
                continue
            cells = out[c].astype(object)
            cells[rows] = [None if np.isnan(x) else int(x) for x in v[rows]]
            out[c] = cells
    return out
