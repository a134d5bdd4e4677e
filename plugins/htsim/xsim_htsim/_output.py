"""Readers of the driver's output: per-op times (CSV) and the run summary (JSON)."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pandas as pd

from xsim_adapters.errors import BackendError

CSV_HEADER = "op_id,start_ps,end_ps"


def read_times(path: str | os.PathLike, num_ops: int) -> pd.DataFrame:
    """Timeline frame (op_id int64, start_ns/end_ns float64) from the driver's CSV.

    The driver writes times in integer picoseconds; they are converted to nanoseconds. Raises
    BackendError unless the file has exactly one line per op ``0..num_ops-1`` in order, so a
    truncated or partial file is never taken for a result.
    """
    try:
        with open(path) as f:
            header = f.readline().strip()
            if header != CSV_HEADER:
                raise BackendError(
                    f"htsim: {path}: expected header '{CSV_HEADER}', got '{header}'"
                )
            data = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    except FileNotFoundError:
        raise BackendError(f"htsim: the driver wrote no times file ({path})") from None
    except ValueError as e:
        raise BackendError(f"htsim: {path}: malformed times file ({e})") from None
    if data.size == 0:
        data = np.zeros((0, 3), dtype=np.int64)
    if data.shape[1] != 3:
        raise BackendError(f"htsim: {path}: expected 3 columns, got {data.shape[1]}")
    if len(data) != num_ops or not np.array_equal(data[:, 0], np.arange(num_ops)):
        missing = np.setdiff1d(np.arange(num_ops), data[:, 0])[:10].tolist()
        raise BackendError(
            f"htsim: times file has {len(data)} ops, trace has {num_ops}"
            + (f" (missing: {missing})" if missing else " (ids out of order)")
            + "; a partial timeline is not a result"
        )
    return pd.DataFrame(
        {
            "op_id": data[:, 0].astype(np.int64),
            "start_ns": data[:, 1].astype(np.float64) / 1000.0,
            "end_ns": data[:, 2].astype(np.float64) / 1000.0,
        }
    )


def read_summary(path: str | os.PathLike) -> dict[str, Any]:
    """The driver's run summary: protocol, ops, flows, links, events, sim_ps, wall_s, ..."""
    try:
        with open(path) as f:
            return dict(json.load(f))
    except (OSError, ValueError) as e:
        raise BackendError(f"htsim: cannot read the driver's summary {path}: {e}") from None


QUEUES_HEADER = "link,peak_bytes,mean_bytes,drops,trims"


def read_queues(path: str | os.PathLike, num_links: int) -> pd.DataFrame | None:
    """``Timeline.link_stats`` from the driver's ``--queues`` CSV: one row per link, the
    queue (a RatedQueue over htsim's Queue, CompositeQueue or PriorityQueue) in front of it.
    ``queue_peak_bytes``: the most bytes it held at an arrival or departure;
    ``queue_mean_bytes``: their time-mean over the run; ``drops``: packets it dropped
    (htsim's own count); ``trims``: packets cut to headers (CompositeQueue, NDP / EQDS);
    ``drop_bytes`` and ``ecn_marks`` are not counted by htsim's queues (NaN). None when the
    driver wrote no such file (the times are the result; telemetry is extra); BackendError
    unless a file it wrote has one line per link in order."""
    try:
        with open(path) as f:
            header = f.readline().strip()
            if header != QUEUES_HEADER:
                raise BackendError(f"htsim: {path}: expected header '{QUEUES_HEADER}', got "
                                   f"'{header}'")
            data = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise BackendError(f"htsim: {path}: malformed queue file ({e})") from None
    if data.size == 0:
        data = np.zeros((0, 5))
    if data.shape[1] != 5 or len(data) != num_links or not np.array_equal(
            data[:, 0], np.arange(num_links)):
        raise BackendError(f"htsim: {path}: expected one line per link 0..{num_links - 1}")
    nan = np.full(num_links, np.nan)
    return pd.DataFrame({
        "link_id": data[:, 0].astype(np.int64), "queue_peak_bytes": data[:, 1],
        "queue_mean_bytes": data[:, 2], "drops": data[:, 3], "drop_bytes": nan,
        "ecn_marks": nan, "trims": data[:, 4],
    })
