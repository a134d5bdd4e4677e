"""The result frame of a sweep (one row per variant, in product order) and its files."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import pandas as pd
import yaml

from .expand import Variant
from .rowsfile import ResumedRows, read_rows  # noqa: F401 - read back there, used from here

# Columns that are the same for every --jobs / executor; the rest are wall-clock times.
TIMING_COLUMNS = ("wall_s", "cpu_s")
INT_COLUMNS = ("ranks", "num_ops")
ROWS_FILE = "sweep.rows.jsonl"  # one JSON line per finished variant, appended and flushed
SWEEP_FILES = ("sweep.csv", "sweep.parquet", "sweep.yaml", ROWS_FILE)


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
        elif k != "plan" and not _is_job_name(k):
            frame[k] = pd.to_numeric(frame[k], errors="coerce").astype("float64")
    from ..metrics.frames import integer_ns

    return integer_ns(frame)  # *_ns columns of whole numbers as (nullable) integers


def _is_job_name(column: str) -> bool:
    """``job1``, ``job2``, ...: the other jobs' names (sweep --job), kept as text."""
    return column.startswith("job") and column[3:].isdigit()


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


def variant_digest(task: Mapping[str, Any]) -> str:
    """sha256 (hex) of what decides a variant's result: its plan (plain data), backend and
    options. ``--resume`` skips a variant whose digest already has a successful row."""
    key = {k: task.get(k) for k in ("plan", "backend", "options")}
    if task.get("jobs"):  # the other jobs on the fabric (a sweep without them: as before)
        key["jobs"] = [j["data"] for j in task["jobs"]]
        key["placement"] = task.get("placement", "packed")
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class RowLog:
    """``OUT/sweep.rows.jsonl``: each finished variant appended as one line, flushed and
    fsynced, so a crash or kill of the sweep keeps every row finished before it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def append(self, digest: str, variant: int, overrides: Mapping[str, Any],
               row: Mapping[str, Any]) -> None:
        """One line ``{"digest", "variant", "overrides", "row"}``, on disk before returning."""
        line = json.dumps({"digest": digest, "variant": variant,
                           "overrides": {k: _cell(v) for k, v in overrides.items()},
                           "row": dict(row)}, default=str)
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> RowLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
