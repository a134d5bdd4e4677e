"""Straggler wait: how long a rank, once ready, waited for the slowest participant.

Two kinds of synchronization are examined (definitions in ``docs/metrics.md``); the EP
all-to-all and CP ring flows (phases ``ep``, ``cp``) are treated as receives, per (collective,
receiver), their senders' readiness looked through a timed barrier where NCCL's delay is one
(a hierarchical proxy; elsewhere it is the flows' start latency), and their waits count
as straggler waits (peers in lockstep), not as pipeline waits:

- **DP sync collectives** (phase ``dp``). Participants are the ranks of the collective's flows
  (senders and receivers). A participant is *ready* when every predecessor of its own first
  op in the collective (its earliest-starting sent flow) has ended. Barrier predecessors are
  looked through to their own predecessors, and only predecessors that belong to the
  participant (its compute, flows it sends or receives) count when there are any, because a
  join barrier over all owners would otherwise make every participant "ready" at the same
  time as the last one. The collective can proceed when the last participant is ready; each
  participant waits ``last_ready - own_ready``; the whole of it is attributed to the last one
  (ties: the lowest rank). Flows of earlier DP collectives before the first op (a rank's chain
  of ZeRO parameter all-gathers, which starts the iteration) do not count: the parameters exist
  from t = 0, so a member of such a gather is ready at 0 and a later start is its own queued
  communication, not a slow peer.
- **PP / reshard receives** (phases ``pp``, ``reshard``), grouped per (collective, receiver)
  so a receive cut into several flows counts once. Senders are ready when their first flow's
  predecessors have ended; the receiver is ready when its previous compute ended (the latest
  compute it started before the data arrived; 0 if none). The receiver waits
  ``max(sender ready) - receiver ready`` when positive, attributed to the latest sender. A
  sender never waits: trace flows start eagerly when their predecessors end, there is no
  rendezvous with the receiver.

Everything is numpy/pandas group operations; there is no Python loop per op.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX, PHASES, Trace
from ..trace.timeline import Timeline
from .intervals import union_length
from .timeline import as_frame

STRAGGLER_COLUMNS = (
    "kind", "collective", "op_id", "waiter", "culprit", "ready_ns", "last_ready_ns", "wait_ns",
)

_MAX_BARRIER_DEPTH = 32
_EDGE_SLICE = 1 << 20  # edges per slice of _pred_end_max (bounded temporaries)


def _pred_end_max(deps: pd.DataFrame, end: np.ndarray, n: int,
                  ops: np.ndarray | None = None) -> np.ndarray:
    """Per op, the latest end (ns) of its predecessors; 0 for ops without predecessors.

    With ``ops`` only those ops' entries are computed (the others stay 0).
    """
    out = np.zeros(n, dtype=np.float64)
    if len(deps) == 0:
        return out
    succ_all = deps["succ"].to_numpy()
    pred_all = deps["pred"].to_numpy()
    wanted = None
    if ops is not None:
        wanted = np.zeros(n, dtype=bool)
        wanted[ops] = True
    # edges in slices, in their own dtype: no 64-bit copy of the whole edge list
    for lo in range(0, len(succ_all), _EDGE_SLICE):
        succ = succ_all[lo:lo + _EDGE_SLICE]
        pred = pred_all[lo:lo + _EDGE_SLICE]
        if wanted is not None:
            keep = wanted[succ]
            succ, pred = succ[keep], pred[keep]
        if len(succ):
            m = pd.Series(end[pred]).groupby(succ).max()
            idx = m.index.to_numpy()
            out[idx] = np.maximum(out[idx], m.to_numpy())
    return out


def _expanded_preds(deps: pd.DataFrame, ops_of_interest: np.ndarray, kind: np.ndarray
                    ) -> pd.DataFrame:
    """Edges (op, pred) for ``ops_of_interest``, with barrier preds replaced by their preds."""
    d = deps[deps["succ"].isin(ops_of_interest)]
    edges = pd.DataFrame({"op": d["succ"].to_numpy(), "pred": d["pred"].to_numpy()})
    done = []
    for _ in range(_MAX_BARRIER_DEPTH):
        is_bar = kind[edges["pred"].to_numpy()] == KIND_BARRIER
        done.append(edges[~is_bar])
        if not is_bar.any():
            break
        bar = edges[is_bar]
        nxt = deps[deps["succ"].isin(bar["pred"].unique())]
        edges = bar.merge(
            nxt.rename(columns={"succ": "pred", "pred": "pred2"}), on="pred"
        )[["op", "pred2"]].rename(columns={"pred2": "pred"}).drop_duplicates()
    return pd.concat(done, ignore_index=True) if done else edges


def _dp_waits(trace: Trace, tf: pd.DataFrame) -> pd.DataFrame:
    kind = tf["kind"].to_numpy()
    rank = tf["rank"].to_numpy(dtype=np.int64)
    dst = tf["dst"].to_numpy(dtype=np.int64)
    end = tf["end_ns"].to_numpy()
    phase = tf["phase"].to_numpy()
    is_dp = (tf["kind"] == KIND_FLOW) & (tf["phase"] == PHASE_INDEX["dp"])
    dp = tf[is_dp & (tf["collective"] >= 0)]
    if len(dp) == 0:
        return pd.DataFrame(columns=list(STRAGGLER_COLUMNS))
    cols = ["collective", "op_id", "start_ns"]
    sent = dp[cols].assign(p=dp["rank"].to_numpy(dtype=np.int64), recv=0)
    recv = dp[cols].assign(p=dp["dst"].to_numpy(dtype=np.int64), recv=1)
    part = pd.concat([sent, recv], ignore_index=True)
    # A participant's first op: its earliest sent flow (received only if it sends none).
    part = part.sort_values(["collective", "p", "recv", "start_ns", "op_id"], kind="stable")
    first = part.drop_duplicates(["collective", "p"], keep="first")[["collective", "p", "op_id"]]
    edges = _expanded_preds(trace.deps, first["op_id"].unique(), kind)
    e = first.merge(edges, left_on="op_id", right_on="op", how="left")
    has = e["pred"].notna().to_numpy()
    pred = np.where(has, e["pred"].fillna(0).to_numpy(), 0).astype(np.int64)
    # A DP flow before a DP collective's first op is a rank's chain of earlier syncs (the ZeRO
    # parameter all-gathers issued one bucket after another from t = 0): communication queued
    # on that rank, not the progress a peer waits for; it does not delay readiness.
    has = has & ~((kind[pred] == KIND_FLOW) & (phase[pred] == PHASE_INDEX["dp"]))
    p = e["p"].to_numpy(dtype=np.int64)
    own = has & ((rank[pred] == p) | ((kind[pred] == KIND_FLOW) & (dst[pred] == p)))
    e = e.assign(
        end_all=np.where(has, end[pred], -np.inf),
        end_own=np.where(own, end[pred], -np.inf),
    )
    g = e.groupby(["collective", "p"], sort=True)[["end_all", "end_own"]].max().reset_index()
    ready = np.where(np.isfinite(g["end_own"]), g["end_own"], g["end_all"])
    g["ready_ns"] = np.where(np.isfinite(ready), ready, 0.0)
    g = g.merge(first, on=["collective", "p"])
    g = g.sort_values(["collective", "ready_ns", "p"], ascending=[True, False, True])
    last = g.drop_duplicates("collective", keep="first")[["collective", "p", "ready_ns"]]
    last = last.rename(columns={"p": "culprit", "ready_ns": "last_ready_ns"})
    g = g.merge(last, on="collective")
    return pd.DataFrame({
        "kind": "dp",
        "collective": g["collective"].to_numpy(dtype=np.int64),
        "op_id": g["op_id"].to_numpy(dtype=np.int64),
        "waiter": g["p"].to_numpy(dtype=np.int64),
        "culprit": g["culprit"].to_numpy(dtype=np.int64),
        "ready_ns": g["ready_ns"].to_numpy(dtype=np.float64),
        "last_ready_ns": g["last_ready_ns"].to_numpy(dtype=np.float64),
        "wait_ns": (g["last_ready_ns"] - g["ready_ns"]).to_numpy(dtype=np.float64),
    })


def _receive_waits(trace: Trace, tf: pd.DataFrame) -> pd.DataFrame:
    n = len(tf)
    end = tf["end_ns"].to_numpy()
    phases = [PHASE_INDEX[p] for p in ("pp", "reshard", "ep", "cp")]
    fl = tf[(tf["kind"] == KIND_FLOW) & tf["phase"].isin(phases)]
    if len(fl) == 0:
        return pd.DataFrame(columns=list(STRAGGLER_COLUMNS))
    op = fl["op_id"].to_numpy(dtype=np.int64)
    pe = _pred_end_max(trace.deps, end, n, op)
    peer = np.isin(fl["phase"].to_numpy(), [PHASE_INDEX["ep"], PHASE_INDEX["cp"]])
    if peer.any():  # a proxy's EP sends wait behind NCCL's timed barrier: look through it
        ex = _expanded_preds(trace.deps, op[peer], tf["kind"].to_numpy())
        m = pd.Series(end[ex["pred"].to_numpy()]).groupby(ex["op"].to_numpy()).max()
        pe[m.index.to_numpy()] = m.to_numpy()
    coll = fl["collective"].to_numpy(dtype=np.int64)
    f = pd.DataFrame({
        # One receive = one (collective, receiver); a flow outside any collective stands alone.
        "g": np.where(coll >= 0, coll, -(op + 1)),
        "collective": coll,
        "receiver": fl["dst"].to_numpy(dtype=np.int64),
        "sender": fl["rank"].to_numpy(dtype=np.int64),
        "op_id": op,
        "start_ns": fl["start_ns"].to_numpy(),
        "end_ns": fl["end_ns"].to_numpy(),
        "phase": fl["phase"].to_numpy(),
        "sender_ready": pe[op],
    })
    f = f.sort_values(["g", "receiver", "sender", "start_ns", "op_id"], kind="stable")
    # Sender readiness: predecessors of its first flow in the receive.
    snd = f.drop_duplicates(["g", "receiver", "sender"], keep="first")
    snd = snd.sort_values(["g", "receiver", "sender_ready", "sender"],
                          ascending=[True, True, False, True])
    rec = snd.drop_duplicates(["g", "receiver"], keep="first")[
        ["g", "receiver", "collective", "sender", "sender_ready", "phase"]
    ]
    first_op = f.sort_values(["g", "receiver", "start_ns", "op_id"]).drop_duplicates(
        ["g", "receiver"], keep="first")[["g", "receiver", "op_id"]]
    arrive = f.groupby(["g", "receiver"])["end_ns"].max().rename("arrive_ns").reset_index()
    rec = rec.merge(first_op, on=["g", "receiver"]).merge(arrive, on=["g", "receiver"])
    # Receiver readiness: end of the latest compute it started before the data arrived.
    comp = tf[tf["kind"] == KIND_COMPUTE][["rank", "start_ns", "end_ns"]]
    comp = comp.rename(columns={"rank": "receiver", "start_ns": "c_start", "end_ns": "c_end"})
    comp = comp.astype({"receiver": np.int64}).sort_values("c_start")
    rec = rec.sort_values("arrive_ns")
    rec = pd.merge_asof(rec, comp, left_on="arrive_ns", right_on="c_start", by="receiver",
                        allow_exact_matches=False, direction="backward")
    r_ready = rec["c_end"].fillna(0.0).to_numpy()
    s_ready = rec["sender_ready"].to_numpy()
    late = s_ready > r_ready
    names = np.array(PHASES, dtype=object)[rec["phase"].to_numpy(dtype=np.int64)]
    out = pd.DataFrame({
        "kind": names,
        "collective": rec["collective"].to_numpy(dtype=np.int64),
        "op_id": rec["op_id"].to_numpy(dtype=np.int64),
        "waiter": rec["receiver"].to_numpy(dtype=np.int64),
        "culprit": np.where(late, rec["sender"].to_numpy(), rec["receiver"].to_numpy()),
        "ready_ns": r_ready,
        "last_ready_ns": np.maximum(s_ready, r_ready),
        "wait_ns": np.maximum(s_ready - r_ready, 0.0),
    })
    return out.sort_values(["op_id"]).reset_index(drop=True)


def straggler_frame(trace: Trace, timeline: Timeline | pd.DataFrame) -> pd.DataFrame:
    """One row per (synchronization, participant that can wait) with its straggler wait.

    ``timeline``: a Timeline or its :func:`~xsim_adapters.metrics.timeline.timeline_frame`.
    Columns: ``kind`` (dp,
    pp, reshard), ``collective`` (id, -1 for a flow outside any collective), ``op_id`` (the
    participant's first op in it), ``waiter`` (rank), ``culprit`` (rank that was ready last),
    ``ready_ns``, ``last_ready_ns``, ``wait_ns`` (= last_ready_ns - ready_ns, >= 0).
    """
    tf = as_frame(trace, timeline)
    parts = [_dp_waits(trace, tf), _receive_waits(trace, tf)]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({
            "kind": pd.Series([], dtype=object),
            **{c: pd.Series([], dtype=np.int64)
               for c in ("collective", "op_id", "waiter", "culprit")},
            **{c: pd.Series([], dtype=np.int64)
               for c in ("ready_ns", "last_ready_ns", "wait_ns")},
        })
    out = pd.concat(parts, ignore_index=True)[list(STRAGGLER_COLUMNS)]
    # Times come from the integer-ns timeline frame; keep them integers.
    ns = ["ready_ns", "last_ready_ns", "wait_ns"]
    out[ns] = np.rint(out[ns].to_numpy(dtype=np.float64)).astype(np.int64)
    return out


def _blocked(frame: pd.DataFrame, num_ranks: int, comp: pd.DataFrame | None
             ) -> tuple[np.ndarray, np.ndarray]:
    """(waited, caused) per rank for the rows of ``frame``; see :func:`straggler_by_rank`."""
    w = frame[(frame["wait_ns"] > 0) & (frame["culprit"] != frame["waiter"])]
    waiter = w["waiter"].to_numpy(dtype=np.int64)
    lo = w["ready_ns"].to_numpy(dtype=np.float64)
    hi = w["last_ready_ns"].to_numpy(dtype=np.float64)
    waited = union_length(waiter, lo, hi, num_ranks)
    if comp is not None and len(w):
        c = comp[comp["rank"].isin(np.unique(waiter))]
        c_rank = c["rank"].to_numpy(dtype=np.int64)
        c_s = c["start_ns"].to_numpy()
        c_e = c["end_ns"].to_numpy()
        both = union_length(np.concatenate([waiter, c_rank]), np.concatenate([lo, c_s]),
                            np.concatenate([hi, c_e]), num_ranks)
        waited = both - union_length(c_rank, c_s, c_e, num_ranks)
    raw = w.groupby(["waiter", "culprit"])["wait_ns"].sum().reset_index()
    raw_total = raw.groupby("waiter")["wait_ns"].transform("sum").to_numpy()
    share = raw["wait_ns"].to_numpy() / np.where(raw_total > 0, raw_total, 1.0)
    caused_part = waited[raw["waiter"].to_numpy(dtype=np.int64)] * share
    caused = np.bincount(raw["culprit"].to_numpy(dtype=np.int64), weights=caused_part,
                         minlength=num_ranks)[:num_ranks]
    return waited.astype(np.float64), caused.astype(np.float64)


def straggler_by_rank(frame: pd.DataFrame, num_ranks: int,
                      tf: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank: ``straggler_wait_ns`` (waited on a slower data-parallel peer, or on a slower
    member of its EP all-to-all or CP ring), ``caused_wait_ns`` (others waited on it),
    ``straggler_dp_ns``, ``straggler_ep_ns``, ``straggler_cp_ns`` (the parts at DP syncs, EP
    all-to-alls and CP rings, each the same union on its own, so they may overlap and their sum
    can exceed ``straggler_wait_ns``; ``straggler_dp_ns`` equals it without EP/CP) and
    ``straggler_pp_ns`` (waits at PP and reshard receives).

    Receive waits are kept out of ``straggler_wait_ns``: a pipeline's own schedule makes its
    stages wait at receives (fill and drain) even when every stage is equally fast, so those
    waits measure the pipeline, not a straggler; they are part of ``bubble_ns`` and are
    reported alone in ``straggler_pp_ns`` (per receive, with its culprit, in the frame).

    A rank's waits in several synchronizations can overlap in time (DP sync groups of many
    layers wait on the same late backward at once), so adding them would count one idle
    second many times over. The rank's wait is therefore the length of the union of its wait
    intervals ``[ready_ns, last_ready_ns]``, minus the part of it in which the rank computes
    anyway (given ``tf``, the timeline frame): the time it sat blocked on a slower peer. That
    total is attributed to culprits in proportion to their share of the rank's raw per-sync
    waits, so ``sum(caused_wait_ns) == sum(straggler_wait_ns)``.
    """
    comp = None if tf is None else tf[tf["kind"] == KIND_COMPUTE]
    kinds = frame["kind"].to_numpy()
    is_dp = kinds == "dp"
    # peers in lockstep: the DP sync, and the EP all-to-all and CP ring inside a layer
    is_peer = is_dp | (kinds == "ep") | (kinds == "cp")
    waited, caused = _blocked(frame[is_peer], num_ranks, comp)
    dp_w = waited if is_peer.sum() == is_dp.sum() else _blocked(frame[is_dp], num_ranks, comp)[0]
    pp_w, _ = _blocked(frame[~is_peer], num_ranks, comp)
    zero = np.zeros(num_ranks)
    ep_w, cp_w = (_blocked(frame[kinds == k], num_ranks, comp)[0] if (kinds == k).any() else zero
                  for k in ("ep", "cp"))
    return pd.DataFrame({
        "rank": np.arange(num_ranks),
        "straggler_wait_ns": waited,
        "caused_wait_ns": caused,
        "straggler_dp_ns": dp_w,
        "straggler_pp_ns": pp_w,
        "straggler_ep_ns": ep_w,
        "straggler_cp_ns": cp_w,
    })
