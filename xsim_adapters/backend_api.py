"""The published surface for backend authors: everything a backend plugin needs, in one module.

A backend (``docs/backends.md``) imports from here and from nowhere else in ``xsim_adapters``;
the shipped ones (the embedded ``flow`` backend, the ``ns3`` and ``htsim`` plugins) do. What is
re-exported here is the backend contract's stable surface; the modules behind it may move.

- the contract: :class:`Backend`, :class:`ReplayProgress` (the progress hook's rules),
  :func:`flow_totals` (what the run info's packet + fluid counts must sum to),
  :data:`RUN_INFO_KEYS`, :data:`PROGRESS_INTERVAL_S`;
- the trace a backend replays: :class:`Trace`, the op kinds ``KIND_*`` and :data:`KINDS`, the
  phase names :data:`PHASES`, :func:`is_dense_ids`;
- the topology it builds its network from: :class:`Topology`, :func:`is_scale_up_path`
  (whether a path is all intra-server links: the fluid scale-up tier);
- what it returns: :class:`Timeline`, and :data:`QUEUE_COLUMNS` for per-link telemetry;
- errors: :class:`BackendError` (a replay failed: carry the simulator's own words),
  :class:`BackendUnavailable` (cannot run here: say what is missing), :class:`OptionError`;
- options: :class:`Option`, :func:`check_options`, the common :data:`SEED`, :data:`PROGRESS`
  and :data:`COMMON_OPTIONS`;
- what-if inputs every engine applies the same way (docs/whatif.md): interval compute
  slowdowns (:func:`slowdown_schedule`, :func:`slowed_compute`, :func:`stretched_end`,
  :class:`SlowSchedule`) and reroutes around failed links (:func:`epochs`, :class:`Epochs`,
  :func:`detours`, :func:`no_detours`, :class:`Detours`); :func:`refuse_connection_limit`
  (a backend that does not cap NCCL connections refuses a plan with ``per_flow_gbps``) and
  :func:`cap_paths` (one that does: a virtual link per connection appended to the paths);
- processes and files: :func:`owned_tempdir` (a temporary directory removed on exit, Ctrl-C,
  SIGTERM, and after a SIGKILL by the next run) and :func:`child_preexec` (a ``preexec_fn``
  that makes a simulator child process die with xsim);
- compiled engines: :data:`NATIVE_INCLUDE_DIR`, the directory holding ``xsim/maxmin.hpp``, the
  one C++ max-min solver and fluid completion rule that the flow core, the ns-3 engine and the
  htsim driver share.
"""

from __future__ import annotations

from pathlib import Path

from ._proc import child_preexec, owned_tempdir
from .backends.base import (
    PROGRESS_INTERVAL_S,
    RUN_INFO_KEYS,
    Backend,
    ReplayProgress,
    compute_bound_ns,
    flow_totals,
)
from .errors import BackendError, BackendUnavailable, OptionError
from .options import COMMON_OPTIONS, PROGRESS, SEED, Option, check_options
from .topology.connections import cap_paths, refuse_connection_limit
from .topology.model import Topology, is_scale_up_path
from .topology.reroute import Detours, Epochs, detours, epochs, no_detours
from .trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, KINDS, PHASES, Trace, is_dense_ids
from .trace.slowdowns import SlowSchedule, slowed_compute, stretched_end
from .trace.slowdowns import schedule as slowdown_schedule
from .trace.timeline import QUEUE_COLUMNS, TRANSPORT_COLUMNS, Timeline

#: The core package's C++ include directory (installed with it as package data): compiled
#: engines add it to their include path and ``#include "xsim/maxmin.hpp"``.
NATIVE_INCLUDE_DIR: Path = Path(__file__).resolve().parent / "include"

__all__ = [
    "cap_paths",
    "refuse_connection_limit",
    "COMMON_OPTIONS",
    "KINDS",
    "KIND_BARRIER",
    "KIND_COMPUTE",
    "KIND_FLOW",
    "NATIVE_INCLUDE_DIR",
    "PHASES",
    "PROGRESS",
    "PROGRESS_INTERVAL_S",
    "QUEUE_COLUMNS",
    "TRANSPORT_COLUMNS",
    "RUN_INFO_KEYS",
    "SEED",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Detours",
    "Epochs",
    "Option",
    "OptionError",
    "ReplayProgress",
    "SlowSchedule",
    "Timeline",
    "Topology",
    "Trace",
    "check_options",
    "child_preexec",
    "compute_bound_ns",
    "detours",
    "epochs",
    "flow_totals",
    "is_dense_ids",
    "is_scale_up_path",
    "no_detours",
    "owned_tempdir",
    "slowdown_schedule",
    "slowed_compute",
    "stretched_end",
]
