"""Metrics of a coarsened trace: mirrored ranks take their representative's numbers.

A coarsened trace (:mod:`xsim_adapters.workload.coarsen`) simulates one representative replica
per class of identical replicas; the others keep only their DP ring flows. By the symmetry the
coarsening relies on, a mirrored rank's metrics equal those of its representative's matching
rank, so the per-rank frame is completed from the manifest's ``coarsening.rank_runs`` before
anything is summed: fleet-wide means, FLOPs, MFU and tokens/s then cover every GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..trace.schema import Trace

# identity columns a mirrored rank keeps as its own; every other column is its representative's
_OWN = ("rank", "group", "device_type", "replica", "stage")


def coarsening_of(trace: Trace) -> dict[str, Any]:
    """The manifest's coarsening record ({} for traces written before it existed)."""
    return dict(trace.manifest.get("coarsening") or {})


def rank_sources(trace: Trace) -> np.ndarray:
    """Per global rank, the rank whose simulated ops stand for it (itself when simulated)."""
    src = np.arange(trace.num_ranks, dtype=np.int64)
    for mirror, rep, count, _ in coarsening_of(trace).get("rank_runs", []):
        src[mirror:mirror + count] = np.arange(rep, rep + count)
    return src


def expand_mirrors(trace: Trace, ranks: pd.DataFrame) -> pd.DataFrame:
    """``ranks`` (indexed by rank) with every mirrored rank's metrics copied from its
    representative's rank; its replica and stage are the representative's stage in its own
    replica. Unchanged when the trace is not coarsened."""
    co = coarsening_of(trace)
    if not co.get("used"):
        return ranks
    src = rank_sources(trace)
    mirrored = np.flatnonzero(src != np.arange(len(src)))
    out = ranks.copy()
    cols = [c for c in out.columns if c not in _OWN]
    pos = out.index.get_indexer(src[mirrored])
    at = out.index.get_indexer(mirrored)
    for c in cols:
        vals = out[c].to_numpy().copy()
        vals[at] = vals[pos]
        out[c] = vals
    rv = out["replica"].to_numpy().copy()
    for mirror, _, count, replica in co.get("rank_runs", []):
        rv[out.index.get_indexer(np.arange(mirror, mirror + count))] = replica
    out["replica"] = rv
    sv = out["stage"].to_numpy().copy()
    sv[at] = sv[pos]
    out["stage"] = sv
    return out

