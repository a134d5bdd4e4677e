"""The critical path: the chain of ops the iteration's end waited on, and whose they are.

Walking back from the op that ends last, each step goes to the predecessor that ended last
(the one the op waited for; ties: the lowest op id). The ops met form the critical path; its
compute ops name the ranks whose kernels set the iteration time. Making any of those kernels
slower makes the iteration slower by as much (until another chain overtakes it), which is why
this, and not the per-synchronization straggler wait of :mod:`.straggler`, is the blame to read
for a pipeline: there a slow stage makes its neighbours wait at every micro-batch, and every
stage both waits and is waited on.

``critical_path(trace, timeline)`` gives one row per op on the path in time order:
``op_id``, ``kind`` (int8), ``rank``, ``phase`` (int8), ``start_ns``, ``end_ns``,
``gap_ns`` (time between the predecessor's end and this op's start: 0 on the flow backend,
queueing or start-up delay on a packet backend), ``latency_ns`` (a flow's start latency, the
NCCL cost before its first byte; 0 for other ops). :func:`critical_summary` sums it per kind and
per rank. Vectorized except the walk itself, which takes one Python step per op on the path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, Trace
from ..trace.timeline import Timeline
from .timeline import as_frame

CRITICAL_COLUMNS = ("op_id", "kind", "rank", "phase", "start_ns", "end_ns", "gap_ns",
                    "latency_ns")
# Edges handled at once by _last_pred (its temporaries: ~20 bytes per edge of a chunk).
EDGE_CHUNK = 1 << 16
# How many ranks critical_summary lists by name (the rest are summed in the totals).
TOP_CRITICAL_RANKS = 5


def _last_pred(trace: Trace, end: np.ndarray) -> np.ndarray:
    """Per op, the predecessor that ended last (ties: lowest op id); -1 for ops without one.

    Two scatter passes over the edges (the latest end per successor, then the lowest
    predecessor id among the edges that reach it), no sort: a few bytes per edge at peak.
    """
    n = len(end)
    out = np.full(n, -1, dtype=np.int64)
    if len(trace.deps) == 0:
        return out
    pred = trace.deps["pred"].to_numpy()
    succ = trace.deps["succ"].to_numpy()
    latest = np.full(n, -np.inf)
    for a in range(0, len(pred), EDGE_CHUNK):  # in chunks: temporaries stay small
        np.maximum.at(latest, succ[a:a + EDGE_CHUNK], end[pred[a:a + EDGE_CHUNK]])
    none = np.iinfo(np.int64).max
    low = np.full(n, none, dtype=np.int64)
    for a in range(0, len(pred), EDGE_CHUNK):
        p, s = pred[a:a + EDGE_CHUNK], succ[a:a + EDGE_CHUNK]
        hit = end[p] == latest[s]
        np.minimum.at(low, s[hit], p[hit])
    has = low != none
    out[has] = low[has]
    return out


def critical_path(trace: Trace, timeline: Timeline | pd.DataFrame) -> pd.DataFrame:
    """The ops on the critical path, in time order (see the module docstring)."""
    tf = as_frame(trace, timeline)
    if len(tf) == 0:
        return pd.DataFrame({c: [] for c in CRITICAL_COLUMNS})
    start = tf["start_ns"].to_numpy(dtype=np.float64)
    end = tf["end_ns"].to_numpy(dtype=np.float64)
    last = _last_pred(trace, end)
    # The op ending last (ties: lowest id) ends the iteration.
    cur = int(np.flatnonzero(end == end.max())[0])
    path = []
    while cur >= 0:
        path.append(cur)
        cur = int(last[cur])
    ids = np.asarray(path[::-1], dtype=np.int64)
    prev_end = np.concatenate(([0.0], end[ids[:-1]]))
    return pd.DataFrame({
        "op_id": ids,
        "kind": trace.ops["kind"].to_numpy()[ids],
        "rank": trace.ops["rank"].to_numpy()[ids],
        "phase": trace.ops["phase"].to_numpy()[ids],
        "start_ns": start[ids],
        "end_ns": end[ids],
        "gap_ns": np.maximum(start[ids] - prev_end, 0.0),
        "latency_ns": np.where(trace.ops["kind"].to_numpy()[ids] == KIND_FLOW,
                               trace.ops["duration_ns"].to_numpy()[ids], 0),
    })


def critical_summary(path: pd.DataFrame) -> dict[str, Any]:
    """Integer ns: ``length_ns`` (the iteration), ``compute_ns``, ``comm_ns`` (flows, from
    their first byte), ``barrier_ns`` (collective latency: timed barriers and the flows' start
    latencies), ``gap_ns``, and ``top_ranks``: the
    ranks with the most compute on the path, ``[{rank, compute_ns}]``, largest first.
    The four parts sum to ``length_ns`` within one ns per op of rounding."""
    if len(path) == 0:
        return {"length_ns": 0, "compute_ns": 0, "comm_ns": 0, "barrier_ns": 0, "gap_ns": 0,
                "top_ranks": []}
    dur = (path["end_ns"] - path["start_ns"]).to_numpy()
    kind = path["kind"].to_numpy()

    lat = (path["latency_ns"].to_numpy(dtype=np.float64) if "latency_ns" in path
           else np.zeros(len(path)))
    dur = np.where(kind == KIND_FLOW, np.maximum(dur - lat, 0.0), dur)

    def part(k: int) -> int:
        return int(round(float(dur[kind == k].sum())))

    comp = path[kind == KIND_COMPUTE]
    per_rank = (comp["end_ns"] - comp["start_ns"]).groupby(comp["rank"]).sum()
    per_rank = per_rank.sort_values(ascending=False, kind="stable")
    return {
        "length_ns": int(round(float(path["end_ns"].iloc[-1]))),
        "compute_ns": part(KIND_COMPUTE),
        "comm_ns": part(KIND_FLOW),
        "barrier_ns": part(KIND_BARRIER) + int(round(float(np.minimum(
            lat, (path["end_ns"] - path["start_ns"]).to_numpy())[kind == KIND_FLOW].sum()))),
        "gap_ns": int(round(float(path["gap_ns"].sum()))),
        "top_ranks": [{"rank": int(r), "compute_ns": int(round(float(v)))}
                      for r, v in per_rank.head(TOP_CRITICAL_RANKS).items()],
    }
