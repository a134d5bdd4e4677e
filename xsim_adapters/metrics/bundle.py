"""All metrics of one run in one object: :func:`compute_metrics` -> :class:`Metrics`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..trace.schema import Trace
from ..trace.timeline import Timeline
from .coarse import expand_mirrors
from .critical import critical_path
from .ranks import rank_metrics
from .steady import extend_ranks, steady_of
from .straggler import straggler_frame
from .summary import device_type_summary, replica_summary, summary
from .timeline import timeline_frame


@dataclass
class Metrics:
    """Metrics of one backend run of one trace.

    ``timeline``: ops with start/end (:func:`timeline_frame`); ``ranks``: per-rank metrics;
    ``stragglers``: per (sync, participant) waits; ``critical``: the ops on the critical path
    (:func:`~xsim_adapters.metrics.critical.critical_path`); ``replicas`` / ``device_types``:
    summaries;
    ``summary``: the headline dict (JSON-ready); ``source``: the backend's Timeline these
    metrics came from (float ns, as the backend reported; ``timeline`` is rounded to integer
    ns), kept so :func:`xsim_adapters.write_report` can store it.

    ``ranks`` is indexed by rank, ``replicas`` by replica number and ``device_types`` by
    device type name (``m.device_types.loc["H100-80GB", "mfu"]``).

    A coarsened trace stands for the whole plan: ``ranks``, ``replicas``, ``device_types``
    and ``summary`` cover every GPU and micro-batch (mirrored replicas take their
    representative's numbers; merged steady-state micro-batches are added back as periods,
    :mod:`.steady`), while ``timeline``, ``stragglers`` and ``critical`` are the simulated
    run's.
    """

    backend: str
    timeline: pd.DataFrame
    ranks: pd.DataFrame
    stragglers: pd.DataFrame
    replicas: pd.DataFrame
    device_types: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    source: Timeline | None = None
    critical: pd.DataFrame | None = None


def compute_metrics(trace: Trace, timeline: Timeline) -> Metrics:
    """Every metric of ``timeline`` (one backend's replay of ``trace``); times in ns.

    Raises BackendError if the timeline does not cover every op of the trace.
    """
    tf = timeline_frame(trace, timeline)
    st = straggler_frame(trace, tf)
    rk = rank_metrics(trace, tf, st)
    # merged steady-state micro-batches: the left-out periods added back (metrics/steady.py)
    steady = steady_of(trace, tf, timeline.frame["start_ns"].to_numpy(dtype=np.float64), st)
    if steady is not None:
        rk = extend_ranks(rk, steady)
    rk = expand_mirrors(trace, rk)
    cp = critical_path(trace, tf)
    sm = summary(trace, tf, rk, timeline.backend, timeline.stats, critical=cp, steady=steady)
    return Metrics(
        backend=timeline.backend,
        timeline=tf,
        ranks=rk,
        stragglers=st,
        replicas=replica_summary(trace, rk),
        device_types=device_type_summary(trace, rk, sm["iteration_time_ns"]),
        summary=sm,
        source=timeline,
        critical=cp,
    )
