"""The backend contract.

A backend is a class registered under the entry-point group ``xsim_adapters.backends`` with:

- ``name``: a class attribute, the name users type (``flow``, ``ns3``, ``htsim``);
- ``available() -> tuple[bool, str]``: whether it can run here, and if not, exactly what is
  missing (a reason that tells the user what to install or set);
- ``run(trace, topology, options) -> Timeline``: replay every op of ``trace`` on ``topology``.

Rules every backend keeps: every op of the trace appears in the timeline with ``start_ns`` and
``end_ns``; a flow that never completed, a stuck DAG or a simulator crash raises
:class:`~xsim_adapters.errors.BackendError` carrying the simulator's own message; a partial
timeline is never returned as if complete. Results are deterministic for a given trace,
topology and options (including ``seed``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BackendError
from ..topology.model import Topology
from ..trace.schema import Trace


@dataclass
class Timeline:
    """Per-op start and end times from one backend run.

    ``frame`` columns: ``op_id`` int64 (dense, equal to the row index and to the trace's op ids),
    ``start_ns`` float64, ``end_ns`` float64. ``stats`` holds backend facts: ``wall_s``,
    ``events`` (simulator events processed), and anything backend-specific.
    """

    backend: str
    frame: pd.DataFrame
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def makespan_ns(self) -> float:
        return float(self.frame["end_ns"].max()) if len(self.frame) else 0.0

    def check_complete(self, trace: Trace) -> None:
        """Raise BackendError unless every op of ``trace`` has finite start <= end."""
        f = self.frame
        n = trace.num_ops
        if len(f) != n or not np.array_equal(f["op_id"].to_numpy(), np.arange(n)):
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


class Backend(ABC):
    """Base class of backends. Implement ``available`` and ``run``; set ``name``."""

    name: str = ""

    @classmethod
    @abstractmethod
    def available(cls) -> tuple[bool, str]:
        """(True, "") if this backend can run here, else (False, what is missing)."""

    @abstractmethod
    def run(self, trace: Trace, topology: Topology, options: Mapping[str, Any]) -> Timeline:
        """Replay ``trace`` on ``topology``; return a complete Timeline or raise BackendError."""
