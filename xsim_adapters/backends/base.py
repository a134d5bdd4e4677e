"""The backend contract.

A backend is a class registered under the entry-point group ``xsim_adapters.backends`` with:

- ``name``: a class attribute, the name users type (``flow``, ``ns3``, ``htsim``);
- ``available() -> tuple[bool, str]``: whether it can run here, and if not, exactly what is
  missing (a reason that tells the user what to install or set);
- ``options``: a class attribute, the tuple of :class:`~xsim_adapters.options.Option` it
  accepts (default: ``seed`` and ``progress``); ``run`` checks its mapping with
  :func:`~xsim_adapters.options.check_options`, so unknown keys and bad values are errors;
- ``run(trace, topology, options) -> Timeline``: replay every op of ``trace`` on ``topology``
  (:class:`~xsim_adapters.trace.timeline.Timeline`, re-exported here for plugins).

Rules every backend keeps: every op of the trace appears in the timeline with ``start_ns`` and
``end_ns``; a flow that never completed, a stuck DAG or a simulator crash raises
:class:`~xsim_adapters.errors.BackendError` carrying the simulator's own message; a partial
timeline is never returned as if complete. Results are deterministic for a given trace,
topology and options (including ``seed``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from ..options import COMMON_OPTIONS, Option
from ..topology.model import Topology
from ..trace.schema import Trace
from ..trace.timeline import Timeline

__all__ = ["Backend", "Timeline"]


class Backend(ABC):
    """Base class of backends. Implement ``available`` and ``run``; set ``name`` and ``options``."""

    name: str = ""
    options: tuple[Option, ...] = COMMON_OPTIONS

    @classmethod
    @abstractmethod
    def available(cls) -> tuple[bool, str]:
        """(True, "") if this backend can run here, else (False, what is missing).

        A backend whose availability depends on an option may accept the run's options as an
        optional argument, ``available(cls, options=None)``; the registry passes them when the
        caller has them (htsim: ``driver``).
        """

    @abstractmethod
    def run(self, trace: Trace, topology: Topology, options: Mapping[str, Any]) -> Timeline:
        """Replay ``trace`` on ``topology``; return a complete Timeline or raise BackendError."""
