"""Summaries of the per-rank metrics: per replica, per device type, and one dict per run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..trace.schema import COMM_PHASES, COMPUTE_PHASES, KIND_COMPUTE, PHASE_INDEX, Trace
from ..trace.slowdowns import schedule, slowed_compute
from ..trace.timeline import Timeline
from .coarse import coarsening_of, rank_sources
from .critical import critical_path, critical_summary
from .ranks import BREAKDOWN_COLUMNS, SUMMABLE_COLUMNS, rank_metrics
from .steady import Steady, extend_critical
from .timeline import as_frame


def _workload(trace: Trace) -> dict[str, Any]:
    return dict(trace.manifest.get("workload") or {})


def _int_ns(frame: pd.DataFrame) -> pd.DataFrame:
    """``*_ns`` columns rounded to int64 ns (means over ranks are fractional)."""
    cols = [c for c in frame.columns if str(c).endswith("_ns")]
    frame[cols] = np.rint(frame[cols].to_numpy(dtype=np.float64)).astype(np.int64)
    return frame


def replica_summary(trace: Trace, ranks: pd.DataFrame) -> pd.DataFrame:
    """One row per replica: ranks, pp, micro_batches, end_ns (its last rank's iteration time),
    the mean over its ranks of compute, comm, exposed comm, bubble, straggler wait, non-compute,
    idle and the breakdown parts (int ns), caused wait (sum, ns) and flop_count (sum).
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
        non_compute_ns=("non_compute_ns", "mean"),
        idle_ns=("idle_ns", "mean"),
        **{c: (c, "mean") for c in BREAKDOWN_COLUMNS},
        flop_count=("flop_count", "sum"),
    ).reset_index()
    agg = _int_ns(agg)
    mb = {int(x["replica"]): int(x.get("micro_batches", -1))
          for x in _workload(trace).get("replicas", []) if "replica" in x}
    agg.insert(3, "micro_batches", [mb.get(int(x), -1) for x in agg["replica"]])
    types = r.groupby("replica")["device_type"].agg(lambda s: ",".join(sorted(set(map(str, s)))))
    agg.insert(1, "device_types", types.reindex(agg["replica"]).to_numpy())
    return agg.set_index(pd.Index(agg["replica"].to_numpy(), name="id"))


def device_type_summary(trace: Trace, ranks: pd.DataFrame, iteration_time_ns: float
                        ) -> pd.DataFrame:
    """One row per device type, indexed by type name: ranks, mean times (int ns),
    ``flop_count`` (sum), achieved TFLOP/s per GPU, peak TFLOP/s (manifest) and
    MFU = achieved / peak, over the whole iteration time. ``device_type`` is also a column.
    """
    catalog = trace.manifest.get("device_types") or {}
    g = ranks.groupby("device_type", observed=True).agg(
        ranks=("rank", "size"),
        compute_ns=("compute_ns", "mean"),
        comm_ns=("comm_ns", "mean"),
        exposed_comm_ns=("exposed_comm_ns", "mean"),
        bubble_ns=("bubble_ns", "mean"),
        straggler_wait_ns=("straggler_wait_ns", "mean"),
        non_compute_ns=("non_compute_ns", "mean"),
        idle_ns=("idle_ns", "mean"),
        **{c: (c, "mean") for c in BREAKDOWN_COLUMNS},
        flop_count=("flop_count", "sum"),
    ).reset_index()
    g = _int_ns(g)
    g["device_type"] = g["device_type"].astype(str)
    t_s = iteration_time_ns * 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        ach = np.where(t_s > 0, g["flop_count"] / (t_s * g["ranks"]) / 1e12, 0.0)
    peak = np.array([float((catalog.get(t) or {}).get("peak_tflops", np.nan))
                     for t in g["device_type"]])
    g["achieved_tflops_per_gpu"] = ach
    g["peak_tflops"] = peak
    with np.errstate(divide="ignore", invalid="ignore"):
        g["mfu"] = np.where(peak > 0, ach / peak, np.nan)
    return g.set_index(pd.Index(g["device_type"].to_numpy(), name="type"))


def phase_totals(tf: pd.DataFrame, ranks: pd.DataFrame,
                 rank_weight: np.ndarray | None = None,
                 steady: Steady | None = None) -> dict[str, int]:
    """Per phase, rank-ns: compute phases sum their op durations (each op times
    ``rank_weight[rank]``, the ranks it stands for in a coarsened trace; default 1; plus, with
    merged micro-batches, one micro-batch's ops per left-out period), comm phases sum each
    rank's union of that phase's flow intervals (``comm_<phase>_ns``)."""
    out: dict[str, int] = {}
    comp = tf[tf["kind"] == KIND_COMPUTE]
    d = comp["end_ns"] - comp["start_ns"]
    if rank_weight is not None:
        d = d * rank_weight[comp["rank"].to_numpy()]
    dur = d.groupby(comp["phase"].to_numpy()).sum()
    if steady is not None:
        pi = steady.phase_inc
        w = pi["ns"].to_numpy() * (rank_weight[pi["rank"].to_numpy()]
                                   if rank_weight is not None else 1.0)
        dur = dur.add(pd.Series(w * steady.periods).groupby(pi["phase"].to_numpy()).sum(),
                      fill_value=0)
    for p in COMPUTE_PHASES:
        out[p] = int(dur.get(PHASE_INDEX[p], 0))
    for p in COMM_PHASES:
        out[p] = int(ranks[f"comm_{p}_ns"].sum())
    return out


def summary(trace: Trace, timeline: Timeline | pd.DataFrame,
            ranks: pd.DataFrame | None = None, backend: str | None = None,
            stats: dict[str, Any] | None = None,
            critical: pd.DataFrame | None = None,
            steady: Steady | None = None) -> dict[str, Any]:
    """The headline numbers of one run as a JSON-ready dict.

    ``timeline``: a Timeline (its backend name and stats are used) or its timeline frame;
    ``ranks``: :func:`~xsim_adapters.metrics.ranks.rank_metrics` (computed if not given).

    Keys: plan, plan_digest, backend, ranks, replicas, iteration_time_ns, tokens_per_iteration,
    tokens_per_s, rank_ns_sums (sum over ranks of each summable time column, in rank-ns: not a
    duration), means (mean over ranks, int ns; the breakdown means sum to the mean iteration
    time within rounding), flop_count (all ranks), phases_rank_ns (per-phase sums over ranks,
    rank-ns), device_types (per type: ranks, flop_count, achieved_tflops_per_gpu, peak_tflops,
    mfu), mfu (all GPUs), max_straggler (the rank that caused the most wait), num_ops,
    backend_stats, critical_path (:func:`~.critical.critical_summary` of ``critical``, the
    critical path, computed when not given); and ``perturbation`` when the plan injects
    slowdowns or jitter (the perturbed ranks, and the compute time the perturbation added per
    rank and in total, in rank-ns). Every ``*_ns`` value is an integer.

    ``steady``: for a trace with merged steady-state micro-batches, the periods to add back
    (:func:`.steady.steady_of`; ``ranks`` must then be extended already, see
    :func:`~.bundle.compute_metrics`, which does both). Computed here when ``ranks`` is None.
    """
    if isinstance(timeline, Timeline):
        backend = backend or timeline.backend
        stats = timeline.stats if stats is None else stats
    tf = as_frame(trace, timeline)
    if ranks is None:
        ranks, steady = _ranks_of(trace, timeline, tf, steady)
    it = int(tf["end_ns"].max()) if len(tf) else 0
    if steady is not None:
        it += int(round(steady.periods * steady.period_ns))
    wl = _workload(trace)
    tokens = wl.get("tokens_per_iteration")
    tokens_per_s = float(tokens) / (it * 1e-9) if tokens and it > 0 else None
    dts = device_type_summary(trace, ranks, it)
    dtypes = _device_types_json(dts)
    peak_total = float(np.nansum(dts["peak_tflops"] * dts["ranks"]))
    total_flops = float(ranks["flop_count"].sum())
    mfu = total_flops / (it * 1e-9) / 1e12 / peak_total if it > 0 and peak_total > 0 else None
    worst = None
    if len(ranks) and ranks["caused_wait_ns"].max() > 0:
        w = ranks.loc[ranks["caused_wait_ns"].idxmax()]
        worst = {"rank": int(w["rank"]), "caused_wait_ns": int(w["caused_wait_ns"])}
    co = coarsening_of(trace)
    weight = None
    if co.get("used"):
        weight = np.bincount(rank_sources(trace), minlength=trace.num_ranks)
    clean_stats = {k: v for k, v in (stats or {}).items()
                   if isinstance(v, str | int | float | bool) or v is None}
    coarse: dict[str, Any] = {k: v for k, v in co.items()
                              if k not in ("rank_runs", "representative")}
    out: dict[str, Any] = {
        "plan": trace.manifest.get("plan_name"),
        "plan_digest": trace.manifest.get("plan_digest"),
        "backend": backend or "unknown",
        "ranks": int(len(ranks)),
        "replicas": int(ranks.loc[ranks["replica"] >= 0, "replica"].nunique()),
        "num_ops": int(len(tf)),
        "iteration_time_ns": it,
        "tokens_per_iteration": tokens,
        "tokens_per_s": tokens_per_s,
        "rank_ns_sums": {c: int(ranks[c].sum()) for c in SUMMABLE_COLUMNS},
        "means": {c: int(round(float(ranks[c].mean()))) if len(ranks) else 0
                  for c in ("iteration_time_ns", *SUMMABLE_COLUMNS)},
        "flop_count": total_flops,
        "phases_rank_ns": phase_totals(tf, ranks, weight, steady),
        "device_types": dtypes,
        "mfu": mfu,
        "max_straggler": worst,
        "backend_stats": clean_stats,
        "coarsening": coarse,
    }
    path = critical if critical is not None else critical_path(trace, tf)
    cps = critical_summary(path)
    if steady is not None:
        cps = extend_critical(cps, path, steady)
        coarse["microbatches"] = {**(coarse.get("microbatches") or {}), **steady.record()}
    out["critical_path"] = cps
    pert = trace.manifest.get("perturb")
    if pert:
        out["perturbation"] = _perturbation(trace, tf, pert)
    return out


def _ranks_of(trace: Trace, timeline: Timeline | pd.DataFrame, tf: pd.DataFrame,
              steady: Steady | None) -> tuple[pd.DataFrame, Steady | None]:
    """:func:`summary`'s rank metrics when not given: per rank, with the steady-state periods
    added back (``steady``, found here for a trace with merged micro-batches) and the mirrored
    replicas of a coarsened trace expanded; and the steady record used."""
    from .coarse import expand_mirrors
    from .steady import extend_ranks, microbatch_record, steady_of
    from .straggler import straggler_frame

    st = straggler_frame(trace, tf)
    ranks = rank_metrics(trace, tf, st)
    if steady is None and microbatch_record(trace):
        src = timeline.frame["start_ns"].to_numpy(dtype=np.float64) if isinstance(
            timeline, Timeline) else tf["start_ns"].to_numpy(dtype=np.float64)
        steady = steady_of(trace, tf, src, st)
    if steady is not None:
        ranks = extend_ranks(ranks, steady)
    return expand_mirrors(trace, ranks), steady


def _device_types_json(dts: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """:func:`device_type_summary` as summary.json's ``device_types`` (NaN -> None)."""
    return {
        str(row.device_type): {
            "ranks": int(row.ranks),
            "flop_count": float(row.flop_count),
            "achieved_tflops_per_gpu": float(row.achieved_tflops_per_gpu),
            "peak_tflops": None if np.isnan(row.peak_tflops) else float(row.peak_tflops),
            "mfu": None if np.isnan(row.mfu) else float(row.mfu),
        }
        for row in dts.itertuples()
    }


def _perturbation(trace: Trace, tf: pd.DataFrame, pert: dict[str, Any]) -> dict[str, Any]:
    """summary.json's ``perturbation``: the slowed ranks, the jitter and the compute time the
    perturbation added (the generator's per-rank extra plus the backend's interval slowdowns),
    in rank-ns."""
    extra = [int(x) for x in pert.get("extra_compute_ns", []) if isinstance(x, int)]
    stretched = interval_extra_ns(trace, tf)
    if stretched is not None:  # what the backend's interval slowdowns added
        extra = [(extra[r] if r < len(extra) else 0) + int(stretched[r])
                 for r in range(len(stretched))]
    return {
        "slow": pert.get("slow", []),
        "jitter_sigma": pert.get("jitter_sigma", 0.0),
        "extra_compute_rank_ns": sum(extra),
        "extra_compute_ns_by_rank": {str(r): x for r, x in enumerate(extra) if x},
    }


def interval_extra_ns(trace: Trace, tf: pd.DataFrame) -> np.ndarray | None:
    """int64 per rank: the compute time interval slowdowns added in this run (each stretched
    kernel's timeline duration minus its trace duration), or None without such slowdowns."""
    sched = schedule(trace.manifest, trace.num_ranks)
    if sched is None:
        return None
    ops = trace.ops
    rank = slowed_compute(ops["kind"].to_numpy(), ops["rank"].to_numpy(), sched)
    sel = np.flatnonzero(rank >= 0)
    took = tf["end_ns"].to_numpy(dtype=np.float64)[sel] - tf["start_ns"].to_numpy(
        dtype=np.float64)[sel]
    extra = took - ops["duration_ns"].to_numpy(dtype=np.float64)[sel]
    return np.rint(np.bincount(rank[sel], weights=extra, minlength=trace.num_ranks)).astype(
        np.int64)
