"""A trace's flow start latencies as timed barriers, for formats without a per-message delay.

Trace schema 2 gives a flow a start latency (its ``duration_ns``: NCCL's per-call cost before
its first byte, :mod:`xsim_adapters.workload.comm.latency`). GOAL and Chakra ET have no such field
on a message, so their exporters see the same schedule written as version 1 wrote it: before
each flow with a latency, a barrier on its source rank with that delay, which takes over the
flow's predecessors; the flow then waits only for the barrier. The schedule is the same (the
barrier ends ``duration_ns`` after the flow's predecessors, and the flow's first byte leaves
then). The barriers get the ids after the trace's last op, so every op keeps its id (GOAL's
message tags are flow op ids).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .schema import DEP_COLUMNS, KIND_BARRIER, KIND_FLOW, OP_COLUMNS, Trace


def latency_as_barriers(trace: Trace) -> Trace:
    """``trace`` with every flow's start latency moved into a timed barrier before it (see the
    module docstring); ``trace`` itself when no flow has one."""
    ops = trace.ops
    kind = ops["kind"].to_numpy()
    dur = ops["duration_ns"].to_numpy()
    timed = np.flatnonzero((kind == KIND_FLOW) & (dur > 0))
    if len(timed) == 0:
        return trace
    n, k = len(ops), len(timed)
    bar_of = np.full(n, -1, dtype=np.int64)
    bar_of[timed] = n + np.arange(k)
    bars = ops.iloc[timed].copy()
    bars["op_id"] = bar_of[timed]
    bars["kind"] = KIND_BARRIER
    for col, v in (("dst", -1), ("bytes", 0), ("flops", 0.0), ("step", -1), ("channel", -1)):
        bars[col] = v
    flows = ops.copy()
    flows.loc[timed, "duration_ns"] = 0
    new_ops = pd.concat([flows, bars], ignore_index=True).astype(OP_COLUMNS)
    pred = trace.deps["pred"].to_numpy(dtype=np.int64)
    succ = trace.deps["succ"].to_numpy(dtype=np.int64)
    into = bar_of[succ] >= 0
    succ = np.where(into, bar_of[succ], succ)  # the barrier takes over the flow's preds
    deps = pd.DataFrame({"pred": np.concatenate([pred, bar_of[timed]]),
                         "succ": np.concatenate([succ, timed])}).astype(DEP_COLUMNS)
    manifest = dict(trace.manifest, num_ops=len(new_ops), num_deps=len(deps))
    return Trace(ops=new_ops, deps=deps, collectives=trace.collectives, manifest=manifest)
