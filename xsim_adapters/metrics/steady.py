"""Metrics of a trace with merged steady-state micro-batches: the left-out periods added back.

A 1F1B replica of ``m`` micro-batches over ``p`` stages repeats itself once the pipeline has
filled: micro-batch ``i + 1`` runs exactly what ``i`` ran, one *period* ``P`` later, on every
rank. A coarsened trace (:mod:`xsim_adapters.workload.coarsen`, ``steady_state_microbatches``)
simulates ``m' = p + STEADY_EXTRA`` of them; the full run is that run with ``m - m'`` more
periods inserted in its steady state, everything after them shifted by ``(m - m') P``.

So every time metric of a rank is its value in the simulated run plus ``m - m'`` times its
value over one period: the rank's *window* ``[start of its forward of micro-batch i, + P)``
for a steady micro-batch ``i``. Unions (compute, communication, exposed communication, busy
time, waits) are clipped to the window and measured with the same interval code as the rank
metrics; FLOPs per period are the FLOPs of one micro-batch. Before any of that the run is
checked: the spacing of consecutive forwards must be ``P`` on every rank for two consecutive
micro-batches, and the two windows must give the same values (within :data:`TOLERANCE_NS`
per window); otherwise the steady state did not repeat and the metrics refuse to extrapolate
(XsimError, saying to rerun with ``--coarsen off``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..errors import XsimError
from ..trace.schema import KIND_COMPUTE, PHASE_INDEX, Trace
from .coarse import rank_sources
from .intervals import clip, union_length
from .ranks import _comm_arrays
from .straggler import straggler_by_rank

# Two windows of one period may differ by the rounding of times to whole ns at their edges:
# a few ns per window (the times are integer ns, the period is not).
TOLERANCE_NS = 16.0

_COMM_PHASES = ("tp", "pp", "reshard", "dp", "ep", "cp")
_OWN_STAGE = ("tp", "ep", "cp")  # comm that counts as work in the bubble metric


@dataclass
class Steady:
    """What one period adds: ``periods`` (micro-batches left out), ``period_ns`` (P),
    ``window_lo`` (per rank, the start of its window; NaN where it has none), ``inc`` (per
    rank, what one period adds to each rank-metric column) and ``phase_inc`` (per compute
    phase, the op time one micro-batch adds, per rank: multiply by rank weights)."""

    periods: int
    period_ns: float
    window_lo: np.ndarray
    inc: pd.DataFrame
    phase_inc: pd.DataFrame

    def record(self) -> dict[str, Any]:
        """The JSON-ready part for ``summary.json``'s ``coarsening.microbatches``."""
        return {"periods_added": self.periods, "period_ns": self.period_ns}


def microbatch_record(trace: Trace) -> dict[str, Any]:
    """The manifest's ``coarsening.microbatches`` record ({} when not coarsened that way)."""
    rec = (trace.manifest.get("coarsening") or {}).get("microbatches") or {}
    return dict(rec) if rec.get("used") else {}


def _forward_starts(tf: pd.DataFrame, start: np.ndarray, mbs: list[int], n: int) -> np.ndarray:
    """(len(mbs), n): per micro-batch and rank, the start (float ns, as the backend reported)
    of the rank's first forward op of that micro-batch; NaN where it has none."""
    kind = tf["kind"].to_numpy()
    ph = tf["phase"].to_numpy()
    mb = tf["microbatch"].to_numpy()
    rank = tf["rank"].to_numpy().astype(np.int64)
    out = np.full((len(mbs), n), np.inf)
    base = (kind == KIND_COMPUTE) & (ph == PHASE_INDEX["fwd"]) & (rank >= 0)
    for j, i in enumerate(mbs):
        sel = base & (mb == i)
        np.minimum.at(out[j], rank[sel], start[sel])
    out[~np.isfinite(out)] = np.nan
    return out


def window_increments(trace: Trace, tf: pd.DataFrame, stragglers: pd.DataFrame,
                      lo: np.ndarray, period: float, microbatch: int) -> pd.DataFrame:
    """Per rank, what the window ``[lo, lo + period)`` holds (ns), and the FLOPs of its
    compute ops of ``microbatch``: the increments of one period (columns as rank metrics)."""
    n = len(lo)
    has = np.isfinite(lo)
    lo = np.where(has, lo, 0.0)
    hi = np.where(has, lo + period, 0.0)
    kind = tf["kind"].to_numpy()
    cm = (kind == KIND_COMPUTE) & (tf["rank"].to_numpy() >= 0)
    c_rank = tf["rank"].to_numpy()[cm].astype(np.int64)
    c_s, c_e = clip(tf["start_ns"].to_numpy()[cm], tf["end_ns"].to_numpy()[cm],
                    lo[c_rank], hi[c_rank])
    f_rank, f_s, f_e, f_ph = _comm_arrays(tf, kind)
    f_s, f_e = clip(f_s, f_e, lo[f_rank], hi[f_rank])

    def u(key: np.ndarray, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        return union_length(key, s, e, n)

    cu = u(c_rank, c_s, c_e)
    mu = u(f_rank, f_s, f_e)
    k_all = np.concatenate([c_rank, f_rank])
    s_all, e_all = np.concatenate([c_s, f_s]), np.concatenate([c_e, f_e])
    both = u(k_all, s_all, e_all)
    own = np.isin(f_ph, [PHASE_INDEX[p] for p in _OWN_STAGE])
    busy = u(np.concatenate([c_rank, f_rank[own]]), np.concatenate([c_s, f_s[own]]),
             np.concatenate([c_e, f_e[own]]))
    inc: dict[str, np.ndarray] = {
        "iteration_time_ns": np.where(has, period, 0.0),
        "compute_ns": cu, "comm_ns": mu, "exposed_comm_ns": both - cu,
        "bubble_ns": np.where(has, period - busy, 0.0),
        "non_compute_ns": np.where(has, period - cu, 0.0),
        "idle_ns": np.where(has, period - both, 0.0),
    }
    for p in _COMM_PHASES:
        m = f_ph == PHASE_INDEX[p]
        inc[f"comm_{p}_ns"] = u(f_rank[m], f_s[m], f_e[m])
    # waits of the window: each wait interval clipped to its waiter's window
    w = stragglers.copy()
    if len(w):
        wk = w["waiter"].to_numpy(dtype=np.int64)
        ws, we = clip(w["ready_ns"].to_numpy(dtype=np.float64),
                      w["last_ready_ns"].to_numpy(dtype=np.float64), lo[wk], hi[wk])
        w["ready_ns"], w["last_ready_ns"], w["wait_ns"] = ws, we, we - ws
    comp = pd.DataFrame({"kind": np.full(len(c_rank), KIND_COMPUTE), "rank": c_rank,
                         "start_ns": c_s, "end_ns": c_e})
    sb = straggler_by_rank(w, n, comp)
    for c in ("straggler_wait_ns", "caused_wait_ns", "straggler_dp_ns", "straggler_pp_ns"):
        inc[c] = sb[c].to_numpy(dtype=np.float64)
    # the breakdown's parts over the window (all of it is inside [0, last backward end])
    dpw = w[(w["kind"] == "dp") & (w["wait_ns"] > 0) & (w["culprit"] != w["waiter"])] \
        if len(w) else w
    d_rank = dpw["waiter"].to_numpy(dtype=np.int64) if len(dpw) else np.zeros(0, np.int64)
    cmw = u(np.concatenate([k_all, d_rank]),
            np.concatenate([s_all, dpw["ready_ns"].to_numpy(dtype=np.float64)
                            if len(dpw) else np.zeros(0)]),
            np.concatenate([e_all, dpw["last_ready_ns"].to_numpy(dtype=np.float64)
                            if len(dpw) else np.zeros(0)]))
    inc["breakdown_compute_ns"] = cu
    inc["breakdown_exposed_comm_ns"] = both - cu
    inc["breakdown_straggler_wait_ns"] = cmw - both
    inc["breakdown_bubble_ns"] = np.where(has, period - cmw, 0.0)
    inc["breakdown_other_ns"] = np.zeros(n)
    mbsel = cm & (tf["microbatch"].to_numpy() == microbatch)
    inc["flop_count"] = np.bincount(tf["rank"].to_numpy()[mbsel].astype(np.int64),
                                    weights=tf["flops"].to_numpy(dtype=np.float64)[mbsel],
                                    minlength=n)[:n]
    return pd.DataFrame(inc)


def steady_of(trace: Trace, tf: pd.DataFrame, start_ns: np.ndarray,
              stragglers: pd.DataFrame) -> Steady | None:
    """The extrapolation of a trace with merged micro-batches (None for any other trace).

    ``start_ns``: the backend's own (float) op starts, for the period; ``tf`` the metrics'
    timeline frame; ``stragglers`` its straggler frame. Raises XsimError if the simulated run
    did not repeat itself (see the module docstring).
    """
    rec = microbatch_record(trace)
    if not rec:
        return None
    m, sim = rec["micro_batches"], int(rec["simulated"])
    if not isinstance(m, int):
        raise XsimError(f"coarsening.microbatches: replicas differ in micro-batches ({m})")
    i1, i2 = (int(x) for x in rec["steady"])
    n = trace.num_ranks
    f = _forward_starts(tf, start_ns, [i1, i2, i2 + 1], n)
    has = np.isfinite(f).all(axis=0)
    if not has.any():
        raise XsimError("steady-state micro-batches: no rank runs the steady micro-batches "
                        f"{i1}-{i2 + 1} (trace of {sim} micro-batches)")
    d1, d2 = (f[1] - f[0])[has], (f[2] - f[1])[has]
    period = float(np.median(d2))
    bad = np.flatnonzero((np.abs(d1 - period) > TOLERANCE_NS)
                         | (np.abs(d2 - period) > TOLERANCE_NS))
    if len(bad):
        r = int(np.flatnonzero(has)[bad[0]])
        raise XsimError(
            f"steady-state micro-batches: the simulated run did not reach a repeating steady "
            f"state (rank {r}: forwards of micro-batches {i1}, {i2}, {i2 + 1} are "
            f"{d1[bad[0]]:.1f} and {d2[bad[0]]:.1f} ns apart, the period is {period:.1f} ns);"
            " rerun with --coarsen off")
    lo1 = np.where(has, f[0], np.nan)
    lo2 = np.where(has, f[1], np.nan)
    # a mirrored rank (coarsened replicas) runs no forwards of its own but keeps flows (its
    # DP ring, a CP ring with its representative): by symmetry, its representative's window
    src = rank_sources(trace)
    lo1 = np.where(has, lo1, lo1[src])
    lo2 = np.where(has, lo2, lo2[src])
    inc1 = window_increments(trace, tf, stragglers, lo1, period, i1)
    inc2 = window_increments(trace, tf, stragglers, lo2, period, i2)
    diff = (inc1 - inc2).drop(columns=["flop_count"]).abs().to_numpy().max(axis=1)
    worst = int(np.argmax(diff)) if len(diff) else 0
    if len(diff) and diff[worst] > TOLERANCE_NS:
        col = (inc1 - inc2).drop(columns=["flop_count"]).abs().iloc[worst].idxmax()
        raise XsimError(
            f"steady-state micro-batches: the windows of micro-batches {i1} and {i2} differ on"
            f" rank {worst} ({col}: {inc1.at[worst, col]:.0f} vs {inc2.at[worst, col]:.0f} ns);"
            " the steady state does not repeat: rerun with --coarsen off")
    comp = tf[(tf["kind"] == KIND_COMPUTE) & (tf["microbatch"] == i2) & (tf["rank"] >= 0)]
    d = (comp["end_ns"] - comp["start_ns"]).to_numpy(dtype=np.float64)
    phase_inc = pd.DataFrame({"rank": comp["rank"].to_numpy(dtype=np.int64),
                              "phase": comp["phase"].to_numpy(), "ns": d})
    return Steady(int(m) - sim, period, lo2, inc2, phase_inc)


def extend_ranks(ranks: pd.DataFrame, steady: Steady) -> pd.DataFrame:
    """``ranks`` (rank metrics of the simulated run) with ``steady.periods`` periods added to
    every time column, FLOPs and the bubble fraction (integer ns, as the rank metrics)."""
    out = ranks.copy()
    k = steady.periods
    for c in steady.inc.columns:
        vals = out[c].to_numpy(dtype=np.float64) + k * steady.inc[c].to_numpy()
        out[c] = np.rint(vals).astype(np.int64) if c.endswith("_ns") else vals
    it = out["iteration_time_ns"].to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["bubble_fraction"] = np.where(it > 0, out["bubble_ns"].to_numpy() / it, 0.0)
    return out


def extend_critical(cp: dict[str, Any], path: pd.DataFrame, steady: Steady) -> dict[str, Any]:
    """The critical-path summary with the left-out periods: the path's ops clipped to one
    period (the window of the rank with the most compute on the path), times the periods."""
    if len(path) == 0:
        return cp
    top = cp["top_ranks"][0]["rank"] if cp.get("top_ranks") else int(path["rank"].iloc[0])
    lo = steady.window_lo[top] if np.isfinite(steady.window_lo[top]) else np.nanmin(
        steady.window_lo)
    hi = lo + steady.period_ns
    s = path["start_ns"].to_numpy(dtype=np.float64)
    e = path["end_ns"].to_numpy(dtype=np.float64)
    lat = path["latency_ns"].to_numpy(dtype=np.float64) if "latency_ns" in path else 0.0
    kind = path["kind"].to_numpy()
    cs, ce = clip(s, e, np.full(len(s), lo), np.full(len(s), hi))
    # a flow's start latency is collective latency: its part of the window before its bytes
    ls, le = clip(s, np.minimum(s + lat, e), np.full(len(s), lo), np.full(len(s), hi))
    over = ce - cs
    lat_over = le - ls
    prev_end = np.concatenate(([0.0], e[:-1]))
    gs, ge = clip(np.minimum(prev_end, s), s, np.full(len(s), lo), np.full(len(s), hi))
    k = steady.periods
    from ..trace.schema import KIND_BARRIER, KIND_FLOW

    def add(v: float) -> int:
        return int(round(k * v))

    out = dict(cp)
    out["length_ns"] = cp["length_ns"] + add(steady.period_ns)
    out["compute_ns"] = cp["compute_ns"] + add(over[kind == KIND_COMPUTE].sum())
    out["comm_ns"] = cp["comm_ns"] + add((over - lat_over)[kind == KIND_FLOW].sum())
    out["barrier_ns"] = cp["barrier_ns"] + add(over[kind == KIND_BARRIER].sum()
                                               + lat_over[kind == KIND_FLOW].sum())
    out["gap_ns"] = cp["gap_ns"] + add((ge - gs).sum())
    comp = kind == KIND_COMPUTE
    per = pd.Series(over[comp]).groupby(path["rank"].to_numpy()[comp]).sum()
    tops = []
    for t in cp.get("top_ranks", []):
        tops.append({"rank": t["rank"],
                     "compute_ns": t["compute_ns"] + add(float(per.get(t["rank"], 0.0)))})
    out["top_ranks"] = sorted(tops, key=lambda x: -x["compute_ns"])
    return out
