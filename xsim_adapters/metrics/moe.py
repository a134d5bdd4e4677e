"""MoE and context-parallel metrics: all-to-all and CP ring times, stragglers (from the trace).

The per-expert load is a function of the plan alone, decided by the generator's router:
:func:`xsim_adapters.workload.comm.alltoall.expert_load` (metrics never import the generator).


- :func:`exchange_times` (trace + timeline): one row per all-to-all (``phase`` ep) or CP ring
  (``cp``) collective: its span (first op start to last op end), bytes, the largest bytes one
  rank sends, and ``exposed_ns``: the part of the span in which a participating rank does not
  compute, averaged over its ranks (communication its own compute does not hide; waiting for a
  slower peer counts as exposed), ``overlapped_ns`` = span - exposed.
- :func:`expert_stragglers` (trace + timeline): per MoE layer, pass and micro-batch, the expert
  compute time of the slowest EP rank against the group mean: what a skewed routing costs.
- :func:`layer_exchange_summary`: per layer and kind, the mean span and exposed time per
  exchange (the all-to-all time per layer).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace.schema import KIND_COMPUTE, PHASE_INDEX, Trace
from .intervals import union_length
from .timeline import as_frame


def exchange_times(trace: Trace, timeline: object) -> pd.DataFrame:
    """One row per EP all-to-all and CP ring collective with its span and exposed time (ns)."""
    tf = as_frame(trace, timeline)  # type: ignore[arg-type]
    cols = ["collective", "kind", "layer", "microbatch", "start_ns", "end_ns", "span_ns",
            "bytes", "max_rank_bytes", "exposed_ns", "overlapped_ns"]
    ph = tf["phase"].to_numpy()
    sel = np.isin(ph, [PHASE_INDEX["ep"], PHASE_INDEX["cp"]]) & (tf["collective"] >= 0)
    ex = tf[sel]
    if ex.empty:
        return pd.DataFrame(columns=cols)
    comp = tf[tf["kind"] == KIND_COMPUTE]
    by_rank = {int(k): g for k, g in comp.groupby("rank")}
    colls = trace.collectives.set_index("collective")
    rows = []
    for cid, g in ex.groupby("collective"):
        s, e = float(g["start_ns"].min()), float(g["end_ns"].max())
        ranks = set(g["rank"].tolist()) | set(g.loc[g["dst"] >= 0, "dst"].tolist())
        exposed = []
        for rk in ranks:
            c = by_rank.get(int(rk))
            busy = 0.0
            if c is not None:
                hit = c[(c["end_ns"] > s) & (c["start_ns"] < e)]
                if len(hit):
                    lo = hit["start_ns"].clip(lower=s).to_numpy()
                    hi = hit["end_ns"].clip(upper=e).to_numpy()
                    key = np.zeros(len(hit), dtype=np.int64)
                    busy = float(union_length(key, lo, hi, 1)[0])
            exposed.append((e - s) - busy)
        exp_ns = float(np.mean(exposed)) if exposed else e - s
        sent = g.groupby("rank")["bytes"].sum()
        rows.append((int(cid), colls.loc[cid, "kind"], int(g["layer_start"].iloc[0]),
                     int(g["microbatch"].iloc[0]), s, e, e - s, int(colls.loc[cid, "bytes"]),
                     int(sent.max()), exp_ns, (e - s) - exp_ns))
    return pd.DataFrame(rows, columns=cols)


def layer_exchange_summary(times: pd.DataFrame) -> pd.DataFrame:
    """Mean span and exposed time per exchange, and their sums, per (kind, layer)."""
    if times.empty:
        return times
    return times.groupby(["kind", "layer"]).agg(
        exchanges=("collective", "count"), mean_span_ns=("span_ns", "mean"),
        mean_exposed_ns=("exposed_ns", "mean"), total_span_ns=("span_ns", "sum"),
        total_exposed_ns=("exposed_ns", "sum")).reset_index()


def expert_ops(trace: Trace) -> np.ndarray:
    """Op ids of the expert compute ops: compute ops that receive all-to-all flows (dispatch)
    and start all-to-all ops (combine), the only compute ops with both."""
    ops, deps = trace.ops, trace.deps
    ep = ops["phase"].to_numpy() == PHASE_INDEX["ep"]
    is_comp = ops["kind"].to_numpy() == KIND_COMPUTE
    pred, succ = deps["pred"].to_numpy(), deps["succ"].to_numpy()
    fed = np.unique(succ[ep[pred] & is_comp[succ]])
    feeds = np.unique(pred[ep[succ] & is_comp[pred]])
    return np.intersect1d(fed, feeds)


def expert_stragglers(trace: Trace, timeline: object) -> pd.DataFrame:
    """Per (layer, phase, micro-batch): the expert compute of the slowest rank against the
    mean over the EP ranks (ns); ``straggler_ns`` = max - mean, what uneven routing costs."""
    cols = ["layer", "phase", "microbatch", "max_ns", "mean_ns", "straggler_ns"]
    ids = expert_ops(trace)
    if len(ids) == 0:
        return pd.DataFrame(columns=cols)
    tf = as_frame(trace, timeline)  # type: ignore[arg-type]
    ex = tf.loc[tf["op_id"].isin(ids)]
    ex = ex.assign(dur=ex["end_ns"] - ex["start_ns"])
    g = ex.groupby(["layer_start", "phase", "microbatch"])["dur"].agg(["max", "mean"])
    out = g.reset_index().rename(columns={"layer_start": "layer", "max": "max_ns",
                                          "mean": "mean_ns"})
    out["straggler_ns"] = out["max_ns"] - out["mean_ns"]
    return out[cols]
