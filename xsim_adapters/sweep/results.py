"""The result frame of a sweep (one row per variant, in product order) and its files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from .expand import Variant

# Columns that are the same for every --jobs / executor; the rest are wall-clock times.
TIMING_COLUMNS = ("wall_s", "cpu_s")
INT_COLUMNS = ("ranks", "num_ops")


def _cell(value: Any) -> Any:
    """A list or mapping override as compact YAML text (``[0, 16]``), so it fits a CSV cell
    and can be pasted back into ``--set``."""
    if isinstance(value, list | dict | tuple):
        return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return value


def _axis_column(values: list[Any]) -> list[Any]:
    cells = [_cell(v) for v in values]
    kinds = {type(c) for c in cells if c is not None}
    if len(kinds) > 1 and not kinds <= {int, float}:  # mixed types: one text column
        cells = [None if c is None else str(c) for c in cells]
    return cells


def build_frame(variants: Sequence[Variant], rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """``variants[i]`` and its result ``rows[i]`` -> one frame: ``variant``, one column per
    axis (named by its path), ``error`` ("" when the variant ran), then the metric columns
    (NaN for a failed variant), ``wall_s`` and ``cpu_s``."""
    axes = list(variants[0].overrides) if variants else []
    data: dict[str, list[Any]] = {"variant": [v.index for v in variants]}
    for name in axes:
        data[name] = _axis_column([v.overrides[name] for v in variants])
    data["error"] = [r.get("error", "") for r in rows]
    metric_cols: list[str] = []
    for r in rows:  # union of columns in first-seen order (device types may differ by variant)
        for k in r:
            if k not in ("error", *TIMING_COLUMNS) and k not in metric_cols:
                metric_cols.append(k)
    for k in metric_cols:
        data[k] = [r.get(k) for r in rows]
    for k in TIMING_COLUMNS:
        data[k] = [r.get(k) for r in rows]
    frame = pd.DataFrame(data)
    for k in metric_cols:
        if k in INT_COLUMNS:  # counts stay integers next to failed variants' missing values
            frame[k] = pd.array(frame[k].tolist(), dtype="Int64")
        elif k != "plan":
            frame[k] = pd.to_numeric(frame[k], errors="coerce").astype("float64")
    return frame


def write_sweep(out: str | Path, frame: pd.DataFrame, spec_text: str | None = None) -> Path:
    """Write ``OUT/sweep.csv``, ``OUT/sweep.parquet`` and (given) ``OUT/sweep.yaml`` (the
    resolved sweep: base plan, axes, backend), each atomically."""
    from .._atomic import write_atomic, write_text_atomic

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "sweep.csv", lambda tmp: frame.to_csv(tmp, index=False))
    write_atomic(out / "sweep.parquet", lambda tmp: frame.to_parquet(tmp, index=False))
    if spec_text is not None:
        write_text_atomic(out / "sweep.yaml", spec_text)
    return out
