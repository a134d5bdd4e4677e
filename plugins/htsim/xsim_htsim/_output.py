"""Readers of the driver's output: per-op times (binary) and the run summary (JSON)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from xsim_adapters.backend_api import BackendError

TIMES_MAGIC = b"XSIMHTO\0"
TIMES_VERSION = 1


def read_times(path: str | os.PathLike, num_ops: int) -> pd.DataFrame:
    """Timeline frame (op_id int64, start_ns/end_ns float64) from the driver's times file.

    Binary, little-endian (main.cpp): ``b"XSIMHTO\\0"``, u32 version 1, u32 0, u64 n, then
    start_ps u64[n] and end_ps u64[n] in op order. Integer picoseconds are converted to
    nanoseconds. Raises BackendError unless the file holds exactly ``num_ops`` ops, so a
    truncated or partial file is never taken for a result.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise BackendError(f"htsim: the driver wrote no times file ({path})") from None
    if data[:8] != TIMES_MAGIC or len(data) < 24:
        raise BackendError(f"htsim: {path}: not a times file of the xsim-htsim driver")
    version = int(np.frombuffer(data, "<u4", 1, 8)[0])
    if version != TIMES_VERSION:
        raise BackendError(f"htsim: {path}: times format version {version} (this reads"
                           f" {TIMES_VERSION}); rebuild the driver from this checkout")
    n = int(np.frombuffer(data, "<u8", 1, 16)[0])
    if n != num_ops or len(data) != 24 + 16 * n:
        raise BackendError(
            f"htsim: times file has {n} ops ({len(data)} bytes), trace has {num_ops}; a partial"
            " timeline is not a result"
        )
    start = np.frombuffer(data, "<u8", n, 24)
    end = np.frombuffer(data, "<u8", n, 24 + 8 * n)
    return pd.DataFrame(
        {
            "op_id": np.arange(n, dtype=np.int64),
            "start_ns": start.astype(np.float64) / 1000.0,
            "end_ns": end.astype(np.float64) / 1000.0,
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
# With --transport the driver adds the RoCE fabric's counters (transport.h PortStats).
TRANSPORT_FIELDS = "drop_bytes,ecn_marks,pause_sent,pause_received,paused_ps,cnps"


def read_queues(path: str | os.PathLike, num_links: int) -> pd.DataFrame | None:
    """``Timeline.link_stats`` from the driver's ``--queues`` CSV: one row per link, the
    queue (a RatedQueue over htsim's Queue, CompositeQueue or PriorityQueue, or with
    network.transport a PfcEgress over its LosslessOutputQueue) in front of it.
    ``queue_peak_bytes``: the most bytes it held at an arrival or departure;
    ``queue_mean_bytes``: their time-mean over the run; ``drops``: packets it dropped
    (htsim's own count; with a transport, packets its switch's buffer could not hold);
    ``trims``: packets cut to headers (CompositeQueue, NDP / EQDS). ``drop_bytes`` and
    ``ecn_marks`` are counted with a transport only (else NaN), which also adds
    :data:`~xsim_adapters.trace.timeline.TRANSPORT_COLUMNS` (``pause_sent``,
    ``pause_received``, ``paused_ns``, ``cnps``; docs/transport.md). None when the driver
    wrote no such file (the times are the result; telemetry is extra); BackendError unless a
    file it wrote has one line per link in order."""
    try:
        with open(path) as f:
            header = f.readline().strip()
            extended = header == f"{QUEUES_HEADER},{TRANSPORT_FIELDS}"
            if header != QUEUES_HEADER and not extended:
                raise BackendError(f"htsim: {path}: expected header '{QUEUES_HEADER}', got "
                                   f"'{header}'")
            data = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise BackendError(f"htsim: {path}: malformed queue file ({e})") from None
    width = 11 if extended else 5
    if data.size == 0:
        data = np.zeros((0, width))
    if data.shape[1] != width or len(data) != num_links or not np.array_equal(
            data[:, 0], np.arange(num_links)):
        raise BackendError(f"htsim: {path}: expected one line per link 0..{num_links - 1}")
    nan = np.full(num_links, np.nan)
    out = pd.DataFrame({
        "link_id": data[:, 0].astype(np.int64), "queue_peak_bytes": data[:, 1],
        "queue_mean_bytes": data[:, 2], "drops": data[:, 3],
        "drop_bytes": data[:, 5] if extended else nan,
        "ecn_marks": data[:, 6] if extended else nan, "trims": data[:, 4],
    })
    if extended:
        out["pause_sent"] = data[:, 7]
        out["pause_received"] = data[:, 8]
        out["paused_ns"] = data[:, 9] / 1000.0
        out["cnps"] = data[:, 10]
    return out
