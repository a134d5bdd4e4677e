"""Per-link telemetry from any backend's timeline: bytes, busy time, peak concurrent flows.

Every backend replays the same flows on the same paths (:meth:`Topology.paths_for`, keyed by
op id), so what crossed each link follows from the trace and the timeline alone. A flow counts
as *active* on every link of its path from its first byte (its start plus its start latency,
``duration_ns``) to its end (``end`` includes the path's
propagation latency, so a link is "busy" slightly longer than it transmits). Per link:

- ``flows``: flows whose path crosses it; ``bytes``: their payload bytes (exact).
- ``busy_ns``: length of the union of those flows' active intervals.
- ``peak_flows``: the most flows active on it at one instant (an interval ending at ``t`` does
  not overlap one starting at ``t``).
- ``mean_util``: ``bytes x 8 / (gbps x iteration_ns)``, the share of its capacity the link used
  over the whole iteration; ``busy_util``: the same over ``busy_ns`` only (how close to line
  rate it ran while in use; below 1 when flows share a slower bottleneck elsewhere).

Capacities are the nominal ones (timed link events change a link's rate for part of the run;
``mean_util`` is then relative to the nominal rate). With links down (rerouting,
:mod:`..topology.reroute`) a flow counts on the path it started on: its route, or its detour
if it started while its route was down; a flow moved mid-transfer is counted whole on the path
it started on (the timeline does not say how its bytes split).

Queue telemetry (:data:`~xsim_adapters.trace.timeline.QUEUE_COLUMNS`: ``queue_peak_bytes``,
``queue_mean_bytes``, ``drops``, ``drop_bytes``, ``ecn_marks``, ``trims``) comes from inside the
packet simulators (``Timeline.link_stats``; what each backend counts: docs/metrics.md); it is
NaN for links a backend built no queue for and for the flow backend, which has no queues. A
backend that ran the plan's ``network.transport`` adds ``pause_sent``, ``pause_received``,
``paused_ns`` and ``cnps`` (:data:`~xsim_adapters.trace.timeline.TRANSPORT_COLUMNS`).
Everything is vectorized.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..topology.model import Topology
from ..topology.reroute import detours, epochs
from ..trace.schema import KIND_FLOW, Trace
from ..trace.timeline import QUEUE_COLUMNS, TRANSPORT_COLUMNS, Timeline
from .intervals import union_length
from .timeline import as_frame

LINK_COLUMNS = (
    "link_id", "src", "dst", "tier", "gbps", "flows", "bytes", "busy_ns", "peak_flows",
    "mean_util", "busy_util", *QUEUE_COLUMNS,
)


def _peak_concurrency(key: np.ndarray, start: np.ndarray, end: np.ndarray, num_keys: int
                      ) -> np.ndarray:
    """int64 per key: the most intervals ``[start, end)`` of that key open at one instant."""
    out = np.zeros(num_keys, dtype=np.int64)
    if len(key) == 0:
        return out
    k = np.concatenate((key, key))
    t = np.concatenate((start, end))
    d = np.concatenate((np.ones(len(key), np.int64), -np.ones(len(key), np.int64)))
    order = np.lexsort((d, t, k))  # at equal times the -1 (an end) comes first
    k, d = k[order], d[order]
    running = pd.Series(d).groupby(k).cumsum().to_numpy()
    np.maximum.at(out, k, running)
    return out


def link_metrics(trace: Trace, timeline: Timeline | pd.DataFrame, topology: Topology
                 ) -> pd.DataFrame:
    """One row per directed link of ``topology`` (indexed by ``link_id``), see the module."""
    tf = as_frame(trace, timeline)
    ops = trace.ops
    fl = np.flatnonzero(ops["kind"].to_numpy() == KIND_FLOW)
    links = topology.links
    L = len(links)
    offsets, path_links = topology.paths_for(
        ops["rank"].to_numpy()[fl], ops["dst"].to_numpy()[fl], topology.ecmp_keys(ops, fl)
    )
    offsets, path_links = _start_paths(topology, ops, fl, tf, offsets, path_links)
    per_flow = np.diff(offsets)
    flow_of = np.repeat(np.arange(len(fl)), per_flow)
    lk = path_links.astype(np.int64)
    # a link carries a flow from its first byte: after the flow's start latency
    start = (tf["start_ns"].to_numpy(dtype=np.float64)[fl]
             + ops["duration_ns"].to_numpy(dtype=np.float64)[fl])[flow_of]
    end = tf["end_ns"].to_numpy(dtype=np.float64)[fl][flow_of]
    nbytes = ops["bytes"].to_numpy()[fl][flow_of]
    it = float(tf["end_ns"].max()) if len(tf) else 0.0
    gbps = links["gbps"].to_numpy(dtype=np.float64)
    total = np.bincount(lk, weights=nbytes.astype(np.float64), minlength=L)
    busy = union_length(lk, start, end, L)
    line_ns = total * 8.0 / gbps  # time at line rate, ns (Gb/s = bits per ns)
    names = topology.nodes["name"].astype(str).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        busy_util = np.where(busy > 0, line_ns / busy, 0.0)
    queues = _queue_columns(timeline, L)
    return pd.DataFrame({
        "link_id": np.arange(L, dtype=np.int32),
        "src": names[links["src"].to_numpy()],
        "dst": names[links["dst"].to_numpy()],
        "tier": links["tier"].astype(str).to_numpy(),
        "gbps": gbps,
        "flows": np.bincount(lk, minlength=L).astype(np.int64),
        "bytes": np.rint(total).astype(np.int64),
        "busy_ns": np.rint(busy).astype(np.int64),
        "peak_flows": _peak_concurrency(lk, start, end, L),
        "mean_util": line_ns / it if it > 0 else np.zeros(L),
        "busy_util": busy_util,
        **queues,
    }).set_index(pd.Index(np.arange(L), name="link"))


def _queue_columns(timeline: Timeline | pd.DataFrame, num_links: int) -> dict[str, np.ndarray]:
    """The packet backend's queue telemetry per link id (NaN where it has none); the transport
    columns only when the backend reported them (a run without network.transport: none)."""
    out = {c: np.full(num_links, np.nan) for c in QUEUE_COLUMNS}
    ls = timeline.link_stats if isinstance(timeline, Timeline) else None
    cols = list(QUEUE_COLUMNS)
    if ls is not None:
        extra = [c for c in TRANSPORT_COLUMNS if c in ls.columns]
        out.update({c: np.full(num_links, np.nan) for c in extra})
        cols += extra
    if ls is not None and len(ls):
        lid = ls["link_id"].to_numpy(dtype=np.int64)
        ok = (lid >= 0) & (lid < num_links)
        for c in cols:
            out[c][lid[ok]] = ls[c].to_numpy(dtype=np.float64)[ok]
    return out


def _start_paths(topology: Topology, ops: pd.DataFrame, fl: np.ndarray, tf: pd.DataFrame,
                 offsets: np.ndarray, links: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each flow's path as it started: its detour where its route was down at its start time
    and it had one (the engines' rule, topology/reroute.py), else its route."""
    ep = epochs(topology)
    if not ep.any_down or len(fl) == 0:
        return offsets, links
    det = detours(topology, ops["rank"].to_numpy()[fl], ops["dst"].to_numpy()[fl],
                  topology.ecmp_keys(ops, fl), offsets, links, ep)
    if not len(det):
        return offsets, links
    start = tf["start_ns"].to_numpy(dtype=np.float64)[fl]
    # events at t apply before flows starting at t: the epoch of a start is the last at <= t
    epoch_of = np.searchsorted(ep.at_ns, start, side="right") - 1
    swap: dict[int, np.ndarray] = {}  # flow index -> the detour it started on
    for j, k in enumerate(det.key.tolist()):  # only flows with a detour can have started on one
        e, i = divmod(k, det.num_items)
        if epoch_of[i] == e and ep.down[e][links[offsets[i]:offsets[i + 1]]].any():
            swap[i] = det.path(j)
    if not swap:
        return offsets, links
    paths = [swap.get(i, links[offsets[i]:offsets[i + 1]]) for i in range(len(fl))]
    off = np.zeros(len(fl) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in paths], out=off[1:])
    return off, np.concatenate(paths).astype(links.dtype)
