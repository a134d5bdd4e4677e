"""Queue telemetry of an ns-3 replay as ``Timeline.link_stats`` (docs/metrics.md "Queues").

The engine watches the queue disc at both ends of every cable it built (the egress buffer of
that direction: a switch port's RED/ECN or FIFO queue, or a GPU's own NIC queue): the most
bytes it held (``BytesInQueue``), their time-mean over the run, and the disc's own counts of
dropped packets and bytes and of ECN-marked packets. The device's few-packet transmit ring below
the disc is not counted. ns-3 never trims, so ``trims`` is 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from xsim_adapters.backend_api import QUEUE_COLUMNS


def queue_frame(arrays: Mapping[str, np.ndarray], queues: Mapping[str, np.ndarray]
                ) -> pd.DataFrame | None:
    """One row per directed link with a queue, from the engine's per-cable-end arrays
    (index ``2 * cable + side``; side 0 sends a->b, side 1 b->a), or None without them."""
    if not queues or "peak_bytes" not in queues:
        return None
    ab, ba = arrays["cable_link_ab"], arrays["cable_link_ba"]
    link = np.empty(2 * len(ab), np.int64)
    link[0::2], link[1::2] = ab, ba
    keep = link >= 0
    cols = dict(zip(QUEUE_COLUMNS, ("peak_bytes", "mean_bytes", "drops", "drop_bytes", "marks",
                                    None), strict=True))
    out: dict[str, np.ndarray] = {"link_id": link[keep]}
    for col, key in cols.items():
        out[col] = (np.asarray(queues[key], np.float64)[keep] if key is not None
                    else np.zeros(int(keep.sum())))
    return pd.DataFrame(out).sort_values("link_id", kind="stable").reset_index(drop=True)
