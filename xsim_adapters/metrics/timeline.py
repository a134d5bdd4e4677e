"""Join a trace's ops with a backend's timeline, and per-rank facts from the manifest."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import TraceError
from ..trace.schema import KIND_COMPUTE, KINDS, PHASES, Trace
from ..trace.timeline import Timeline


def check_timeline(trace: Trace, timeline: Timeline) -> None:
    """Raise BackendError unless the timeline covers every op of the trace (see Timeline)."""
    timeline.check_complete(trace)


def rank_table(trace: Trace) -> pd.DataFrame:
    """One row per global rank: rank, group, node, device_type, replica, stage.

    ``replica`` and ``stage`` are those of the rank's first compute op (-1 if it computes
    nothing), because the manifest lists ranks by device, not by pipeline position.
    """
    ranks = trace.manifest.get("ranks")
    if not ranks:
        raise TraceError("trace manifest has no 'ranks' list; metrics need the rank catalogue")
    rt = pd.DataFrame(ranks)
    missing = {"rank", "group", "device_type"} - set(rt.columns)
    if missing:
        raise TraceError(f"trace manifest 'ranks' entries lack {sorted(missing)}")
    rt = rt.sort_values("rank").reset_index(drop=True)
    n = len(rt)
    if not np.array_equal(rt["rank"].to_numpy(), np.arange(n)):
        raise TraceError("trace manifest 'ranks' must be numbered 0..N-1 without gaps")
    if "node" not in rt.columns:
        rt["node"] = -1
    ops = trace.ops
    comp = ops[ops["kind"] == KIND_COMPUTE]
    first = comp.drop_duplicates("rank", keep="first")
    replica = np.full(n, -1, dtype=np.int64)
    stage = np.full(n, -1, dtype=np.int64)
    r = first["rank"].to_numpy()
    ok = (r >= 0) & (r < n)
    replica[r[ok]] = first["replica"].to_numpy()[ok]
    stage[r[ok]] = first["stage"].to_numpy()[ok]
    rt["replica"] = replica
    rt["stage"] = stage
    return rt[["rank", "group", "node", "device_type", "replica", "stage"]]


def timeline_frame(trace: Trace, timeline: Timeline) -> pd.DataFrame:
    """The trace's ops with ``start_ns``/``end_ns`` (int64, ns) from ``timeline``.

    Backends report float ns; they are rounded to the nearest integer ns here, once, so every
    metric derived from the frame is an exact integer and sums of parts are exact.

    Adds ``kind_name``, ``phase_name``, ``group`` and ``device_type`` (of the op's owner rank:
    compute rank, flow source; empty for barriers without a rank) and ``elapsed_ns`` (end - start).
    Raises BackendError if the timeline does not cover every op.
    """
    check_timeline(trace, timeline)
    tf = trace.ops.copy(deep=False)  # copy-on-write (pandas >= 3): the columns are shared
    tl = timeline.frame
    tf["start_ns"] = np.rint(tl["start_ns"].to_numpy(dtype=np.float64)).astype(np.int64)
    tf["end_ns"] = np.rint(tl["end_ns"].to_numpy(dtype=np.float64)).astype(np.int64)
    tf["elapsed_ns"] = tf["end_ns"] - tf["start_ns"]
    tf["kind_name"] = pd.Categorical.from_codes(
        tf["kind"].to_numpy(dtype=np.int64), categories=list(KINDS)
    )
    tf["phase_name"] = pd.Categorical.from_codes(
        tf["phase"].to_numpy(dtype=np.int64), categories=list(PHASES)
    )
    rt = rank_table(trace)
    owner = tf["rank"].to_numpy(dtype=np.int64)
    has = (owner >= 0) & (owner < len(rt))
    # categorical codes straight from the rank table (no per-op strings: 1-2 bytes per op)
    for col in ("group", "device_type"):
        names = rt[col].astype(str).to_numpy()
        cats = [""] + sorted(set(names.tolist()) - {""})
        index = {c: i for i, c in enumerate(cats)}
        code_of_rank = np.asarray([index[x] for x in names.tolist()], dtype=np.int16)
        codes = np.zeros(len(owner), dtype=np.int16)
        codes[has] = code_of_rank[owner[has]]
        tf[col] = pd.Categorical.from_codes(codes, categories=cats)
    return tf


def as_frame(trace: Trace, timeline_or_frame: Timeline | pd.DataFrame) -> pd.DataFrame:
    """A :func:`timeline_frame`: built from a Timeline, or passed through if already one."""
    if isinstance(timeline_or_frame, Timeline):
        return timeline_frame(trace, timeline_or_frame)
    return timeline_or_frame
