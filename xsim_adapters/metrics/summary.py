"""Summaries of the per-rank metrics: per replica, per device type, and one dict per run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..trace.schema import COMM_PHASES, COMPUTE_PHASES, KIND_COMPUTE, PHASE_INDEX, Trace
from ..trace.timeline import Timeline
from .ranks import SUMMABLE_COLUMNS, rank_metrics
from .timeline import as_frame


def _workload(trace: Trace) -> dict[str, Any]:
    return dict(trace.manifest.get("workload") or {})


def replica_summary(trace: Trace, ranks: pd.DataFrame) -> pd.DataFrame:
    """One row per replica: ranks, pp, micro_batches, end_ns (its last rank's iteration time)
    and the mean over its ranks of compute, comm, exposed comm, bubble, straggler wait, idle (ns).
    """
    r = ranks[ranks["replica"] >= 0]
    agg = r.groupby("replica").agg(
        ranks=("rank", "size"),
        pp=("stage", "nunique"),
        end_ns=("iteration_time_ns", "max"),
        compute_ns=("compute_ns", "mean"),
        comm_ns=("comm_ns", "mean"),
        exposed_comm_ns=("exposed_comm_ns", "mean"),
        bubble_ns=("bubble_ns", "mean"),
        bubble_fraction=("bubble_fraction", "mean"),
        straggler_wait_ns=("straggler_wait_ns", "mean"),
        caused_wait_ns=("caused_wait_ns", "sum"),
        idle_ns=("idle_ns", "mean"),
        flops=("flops", "sum"),
    ).reset_index()
    mb = {int(x["replica"]): int(x.get("micro_batches", -1))
          for x in _workload(trace).get("replicas", []) if "replica" in x}
    agg.insert(3, "micro_batches", [mb.get(int(x), -1) for x in agg["replica"]])
    types = r.groupby("replica")["device_type"].agg(lambda s: ",".join(sorted(set(map(str, s)))))
    agg.insert(1, "device_types", types.reindex(agg["replica"]).to_numpy())
    return agg


def device_type_summary(trace: Trace, ranks: pd.DataFrame, iteration_time_ns: float
                        ) -> pd.DataFrame:
    """One row per device type: ranks, mean times (ns), total FLOPs, achieved TFLOP/s per GPU,
    peak TFLOP/s (manifest) and MFU = achieved / peak, over the whole iteration time.
    """
    catalog = trace.manifest.get("device_types") or {}
    g = ranks.groupby("device_type", observed=True).agg(
        ranks=("rank", "size"),
        compute_ns=("compute_ns", "mean"),
        comm_ns=("comm_ns", "mean"),
        exposed_comm_ns=("exposed_comm_ns", "mean"),
        bubble_ns=("bubble_ns", "mean"),
        straggler_wait_ns=("straggler_wait_ns", "mean"),
        idle_ns=("idle_ns", "mean"),
        flops=("flops", "sum"),
    ).reset_index()
    g["device_type"] = g["device_type"].astype(str)
    t_s = iteration_time_ns * 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        ach = np.where(t_s > 0, g["flops"] / (t_s * g["ranks"]) / 1e12, 0.0)
    peak = np.array([float((catalog.get(t) or {}).get("peak_tflops", np.nan))
                     for t in g["device_type"]])
    g["achieved_tflops_per_gpu"] = ach
    g["peak_tflops"] = peak
    with np.errstate(divide="ignore", invalid="ignore"):
        g["mfu"] = np.where(peak > 0, ach / peak, np.nan)
    return g


def phase_totals(tf: pd.DataFrame, ranks: pd.DataFrame) -> dict[str, float]:
    """Per phase, rank-ns: compute phases sum their op durations, comm phases sum each rank's
    union of that phase's flow intervals (``comm_<phase>_ns``)."""
    out: dict[str, float] = {}
    comp = tf[tf["kind"] == KIND_COMPUTE]
    dur = (comp["end_ns"] - comp["start_ns"]).groupby(comp["phase"].to_numpy()).sum()
    for p in COMPUTE_PHASES:
        out[p] = float(dur.get(PHASE_INDEX[p], 0.0))
    for p in COMM_PHASES:
        out[p] = float(ranks[f"comm_{p}_ns"].sum())
    return out


def summary(trace: Trace, timeline: Timeline | pd.DataFrame,
            ranks: pd.DataFrame | None = None, backend: str | None = None,
            stats: dict[str, Any] | None = None) -> dict[str, Any]:
    """The headline numbers of one run as a JSON-ready dict.

    ``timeline``: a Timeline (its backend name and stats are used) or its timeline frame;
    ``ranks``: :func:`~xsim_adapters.metrics.ranks.rank_metrics` (computed if not given).

    Keys: plan, plan_digest, backend, ranks, replicas, iteration_time_ns, tokens_per_iteration,
    tokens_per_s, totals (sum over ranks of each summable rank column, rank-ns / FLOPs),
    means (mean over ranks), phases (per-phase totals, rank-ns), device_types (per type:
    ranks, flops, achieved_tflops_per_gpu, peak_tflops, mfu), mfu (all GPUs), max_straggler
    (the rank that caused the most wait), num_ops, backend_stats.
    """
    if isinstance(timeline, Timeline):
        backend = backend or timeline.backend
        stats = timeline.stats if stats is None else stats
    tf = as_frame(trace, timeline)
    if ranks is None:
        ranks = rank_metrics(trace, tf)
    it = float(tf["end_ns"].max()) if len(tf) else 0.0
    wl = _workload(trace)
    tokens = wl.get("tokens_per_iteration")
    tokens_per_s = float(tokens) / (it * 1e-9) if tokens and it > 0 else None
    dts = device_type_summary(trace, ranks, it)
    dtypes = {
        str(row.device_type): {
            "ranks": int(row.ranks),
            "flops": float(row.flops),
            "achieved_tflops_per_gpu": float(row.achieved_tflops_per_gpu),
            "peak_tflops": None if np.isnan(row.peak_tflops) else float(row.peak_tflops),
            "mfu": None if np.isnan(row.mfu) else float(row.mfu),
        }
        for row in dts.itertuples()
    }
    peak_total = float(np.nansum(dts["peak_tflops"] * dts["ranks"]))
    total_flops = float(ranks["flops"].sum())
    mfu = total_flops / (it * 1e-9) / 1e12 / peak_total if it > 0 and peak_total > 0 else None
    worst = None
    if len(ranks) and ranks["caused_wait_ns"].max() > 0:
        w = ranks.loc[ranks["caused_wait_ns"].idxmax()]
        worst = {"rank": int(w["rank"]), "caused_wait_ns": float(w["caused_wait_ns"])}
    clean_stats = {k: v for k, v in (stats or {}).items()
                   if isinstance(v, str | int | float | bool) or v is None}
    return {
        "plan": trace.manifest.get("plan_name"),
        "plan_digest": trace.manifest.get("plan_digest"),
        "backend": backend or "unknown",
        "ranks": int(len(ranks)),
        "replicas": int(ranks.loc[ranks["replica"] >= 0, "replica"].nunique()),
        "num_ops": int(len(tf)),
        "iteration_time_ns": it,
        "tokens_per_iteration": tokens,
        "tokens_per_s": tokens_per_s,
        "totals": {c: float(ranks[c].sum()) for c in SUMMABLE_COLUMNS},
        "means": {c: float(ranks[c].mean()) if len(ranks) else 0.0
                  for c in SUMMABLE_COLUMNS if c != "flops"},
        "phases": phase_totals(tf, ranks),
        "device_types": dtypes,
        "mfu": mfu,
        "max_straggler": worst,
        "backend_stats": clean_stats,
    }
