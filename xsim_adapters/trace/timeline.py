"""The timeline: what every backend returns, the contract between backends and metrics.

It lives beside the trace schema so that metrics, reports and the API depend on the trace
package only, never on the backends package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BackendError
from .schema import Trace, is_dense_ids

#: Queue telemetry columns of ``Timeline.link_stats``: the most bytes queued at the link's
#: egress, the time-mean of its queued bytes over the run, packets dropped there, their
#: bytes, packets ECN-marked there, packets trimmed to headers there (NDP / EQDS).
QUEUE_COLUMNS = ("queue_peak_bytes", "queue_mean_bytes", "drops", "drop_bytes", "ecn_marks",
                 "trims")
# A packet backend running the plan's network.transport adds these per link (docs/transport.md):
# PAUSE frames sent to the link's transmitter and received by it, the time it spent paused
# (ns), CNPs it carried. links.csv has them only when the backend reported them.
TRANSPORT_COLUMNS = ("pause_sent", "pause_received", "paused_ns", "cnps")


@dataclass
class Timeline:
    """Per-op start and end times from one backend run.

    ``frame`` columns: ``op_id`` int64 (dense, equal to the row index and to the trace's op ids),
    ``start_ns`` float64, ``end_ns`` float64. ``stats`` holds backend facts: ``wall_s``,
    ``events`` (simulator events processed), and anything backend-specific.
    ``link_stats`` (packet backends only, else None): queue telemetry per directed link, one
    row per link the simulator built a queue for: ``link_id`` int64 and :data:`QUEUE_COLUMNS`
    (float64; each backend's meaning in docs/metrics.md).
    """

    backend: str
    frame: pd.DataFrame
    stats: dict[str, Any] = field(default_factory=dict)
    link_stats: pd.DataFrame | None = None

    @property
    def makespan_ns(self) -> float:
        return float(self.frame["end_ns"].max()) if len(self.frame) else 0.0

    def check_complete(self, trace: Trace) -> None:
        """Raise BackendError unless every op of ``trace`` has finite start <= end."""
        f = self.frame
        n = trace.num_ops
        if len(f) != n or not is_dense_ids(f["op_id"].to_numpy()):
            raise BackendError(
                f"{self.backend}: timeline has {len(f)} ops, trace has {n}; a partial timeline"
                " is not a result"
            )
        s = f["start_ns"].to_numpy()
        e = f["end_ns"].to_numpy()
        bad = ~(np.isfinite(s) & np.isfinite(e) & (e >= s))
        if bad.any():
            ids = np.flatnonzero(bad)[:10].tolist()
            raise BackendError(
                f"{self.backend}: {int(bad.sum())} ops never completed (first: {ids})"
            )
