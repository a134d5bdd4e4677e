"""Compiled core of the xsim-adapters flow backend: the event loop and the max-min solver.

The flow backend (``xsim_adapters.backends.flow``) uses it by default when it is installed
(``python -m pip install ./plugins/flowcore``); the Python executor stays the reference, and
both produce the same timeline. This package has no dependency on xsim_adapters: it takes
plain numpy arrays.

- ``run(kind, duration_ns, nbytes, pred, succ, path_offsets, path_links, link_gbps,
  link_latency_ns, events_at_ns, events_link, events_factor, progress) -> dict``: execute a
  flow DAG (arrays and units as ``xsim_adapters.backends.flow.executor.FlowProblem``); the dict
  holds ``start_ns`` and ``end_ns`` (float64 per op, NaN where an op never finished), ``done``,
  ``events``, ``max_active_flows``, ``rate_recomputations``, ``solved_flows`` (the sizes of the
  re-solved groups, summed), ``wall_s`` and ``cpu_s`` (the call, wall and thread CPU seconds)
  and, for a run that got stuck, ``active_ops``, ``active_rates`` (bytes/ns) and ``capacity``
  (bytes/ns per link).
- ``maxmin(flow_offsets, flow_links, capacity) -> ndarray``: max-min fair rates of flows given
  as a CSR of link ids (same unit as ``capacity``).
- ``unordered_ops(pred, succ, num_ops) -> int``: how many ops Kahn's algorithm cannot order
  (0: the edges, int64 or int32 pairs, form a DAG); the trace validator's cycle check.
- ``INTERFACE_VERSION``: bumped whenever ``run``'s arguments or result change.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._flowcore import INTERFACE_VERSION, maxmin, run, unordered_ops

try:
    __version__ = version("xsim-flowcore")
except PackageNotFoundError:  # pragma: no cover - imported from a build tree
    __version__ = "0+unknown"

__all__ = ["INTERFACE_VERSION", "__version__", "maxmin", "run", "unordered_ops"]
