"""A trace's flow start latencies as timed barriers, for formats without a per-message delay.

Trace schema 2 gives a flow a start latency (its ``duration_ns``: NCCL's per-call cost before
its first byte, :mod:`xsim_adapters.workload.comm.latency`). GOAL and Chakra ET have no such field
on a message, so their exporters see the same schedule written as version 1 wrote it: before
each flow with a latency, a barrier on its source rank with that delay, which takes over the
flow's predecessors; the flow then waits only for the barrier. The schedule is the same (the
barrier ends ``duration_ns`` after the flow's predecessors, and the flow's first byte leaves
then). The barriers get the ids after the trace's last op, so every op keeps its id (GOAL's
message tags are flow op ids).

With ``per_member`` (the Chakra export), the flows of one collective that start on one rank
with the same latency after the same predecessors (a member's gate flows, one per channel)
share one barrier: a simulator that runs a rank's compute nodes one at a time (ASTRA-sim)
would otherwise add the channels' latencies up instead of overlapping them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .schema import DEP_COLUMNS, KIND_BARRIER, KIND_FLOW, OP_COLUMNS, Trace


def latency_as_barriers(trace: Trace, per_member: bool = False) -> Trace:
    """``trace`` with every flow's start latency moved into a timed barrier before it (one per
    flow, or with ``per_member`` one per collective, rank, latency and predecessor set: see
    the module docstring); ``trace`` itself when no flow has one."""
    ops = trace.ops
    kind = ops["kind"].to_numpy()
    dur = ops["duration_ns"].to_numpy()
    timed = np.flatnonzero((kind == KIND_FLOW) & (dur > 0))
    if len(timed) == 0:
        return trace
    pred = trace.deps["pred"].to_numpy(dtype=np.int64)
    succ = trace.deps["succ"].to_numpy(dtype=np.int64)
    n = len(ops)
    group = _member_groups(ops, timed, pred, succ) if per_member else np.arange(len(timed))
    first = np.unique(group, return_index=True)[1]  # each barrier stands where its first flow
    k = len(first)
    bar_of = np.full(n, -1, dtype=np.int64)
    bar_of[timed] = n + group
    bars = ops.iloc[timed[first]].copy()
    bars["op_id"] = n + np.arange(k)
    bars["kind"] = KIND_BARRIER
    for col, v in (("dst", -1), ("bytes", 0), ("flops", 0.0), ("step", -1), ("channel", -1)):
        bars[col] = v
    flows = ops.copy()
    flows.loc[timed, "duration_ns"] = 0
    new_ops = pd.concat([flows, bars], ignore_index=True).astype(OP_COLUMNS)
    into = bar_of[succ] >= 0
    succ = np.where(into, bar_of[succ], succ)  # the barrier takes over the flow's preds
    if k < len(timed):  # a shared barrier takes each of its flows' (equal) preds once
        at = np.flatnonzero(into)
        _, once = np.unique(pred[at] * (n + k) + succ[at], return_index=True)
        keep = ~into
        keep[at[once]] = True
        pred, succ = pred[keep], succ[keep]
    deps = pd.DataFrame({"pred": np.concatenate([pred, bar_of[timed]]),
                         "succ": np.concatenate([succ, timed])}).astype(DEP_COLUMNS)
    manifest = dict(trace.manifest, num_ops=len(new_ops), num_deps=len(deps))
    return Trace(ops=new_ops, deps=deps, collectives=trace.collectives, manifest=manifest)


def _member_groups(ops: pd.DataFrame, timed: np.ndarray, pred: np.ndarray,
                   succ: np.ndarray) -> np.ndarray:
    """Per flow of ``timed``, its barrier's index (0..k-1, in order of first flow): flows of
    one collective (>= 0) on one rank with the same latency and predecessors share one."""
    order = np.argsort(succ, kind="stable")
    s_sorted, p_sorted = succ[order], pred[order]
    lo = np.searchsorted(s_sorted, timed, side="left")
    hi = np.searchsorted(s_sorted, timed, side="right")
    coll = ops["collective"].to_numpy()[timed]
    rank = ops["rank"].to_numpy()[timed]
    dur = ops["duration_ns"].to_numpy()[timed]
    index: dict[tuple, int] = {}
    out = np.empty(len(timed), dtype=np.int64)
    for i, f in enumerate(timed.tolist()):
        key: tuple = (int(coll[i]), int(rank[i]), int(dur[i]),
                      tuple(sorted(p_sorted[lo[i]:hi[i]].tolist())))
        if coll[i] < 0:
            key = ("flow", f)  # a plain transfer keeps its own
        out[i] = index.setdefault(key, len(index))
    return out
