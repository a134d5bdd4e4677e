"""Per-rank metrics of one iteration (definitions in ``docs/metrics.md``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace.schema import COMM_PHASES, KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX, Trace
from ..trace.timeline import Timeline
from .intervals import clip, sort_consuming, union_blocks, union_length
from .straggler import straggler_by_rank, straggler_frame
from .timeline import as_frame, rank_table

# The per-rank time breakdown: disjoint parts of [0, iteration_time_ns] that sum to it exactly.
BREAKDOWN_COLUMNS = (
    "breakdown_compute_ns", "breakdown_exposed_comm_ns", "breakdown_straggler_wait_ns",
    "breakdown_bubble_ns", "breakdown_other_ns",
)
RANK_COLUMNS = (
    "rank", "group", "device_type", "replica", "stage",
    "iteration_time_ns", "compute_ns", "comm_ns", "exposed_comm_ns",
    "bubble_ns", "bubble_fraction", "straggler_wait_ns", "caused_wait_ns", "non_compute_ns",
    "idle_ns", *(f"comm_{p}_ns" for p in COMM_PHASES),
    "flop_count", "straggler_dp_ns", "straggler_pp_ns", "straggler_ep_ns", "straggler_cp_ns",
    *BREAKDOWN_COLUMNS,
)
# Intervals per slice of whole ranks in which rank_metrics measures its unions (the
# temporaries of one slice are ~50 bytes per interval: a fixed ~3 MB, not per op).
UNION_CHUNK = 1 << 16
# Time columns that add up meaningfully over ranks (summary ``rank_ns_sums``, in rank-ns).
SUMMABLE_COLUMNS = (
    "compute_ns", "comm_ns", "exposed_comm_ns", "bubble_ns", "straggler_wait_ns",
    "straggler_dp_ns", "straggler_pp_ns", "straggler_ep_ns", "straggler_cp_ns",
    "non_compute_ns", "idle_ns",
    *(f"comm_{p}_ns" for p in COMM_PHASES), *BREAKDOWN_COLUMNS,
)


def _comm_arrays(tf: pd.DataFrame, kind: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rank, start, end, phase) of every communication interval of a rank.

    Every flow counts twice: for its sender from its start (its start latency, the NCCL
    latency and protocol cost a ring member pays before its first send, ``workload/comm/nccl.py``,
    is the sender's), for its receiver from its first byte (start + ``duration_ns``). A timed
    barrier of a communication phase counts once, for the rank that owns it. The receiver of
    an EP all-to-all or CP ring flow is inside the same grouped kernel while the sender waits
    out its p2p latency, so its interval starts with the flow (or, behind a hierarchical
    proxy's timed barrier, where that barrier started): in lockstep that coincides with its
    own latency; behind a late peer it is the exchange's latency, not a pipeline bubble.
    Built from column arrays and masks (no copy of the frame: the metrics stay a few bytes
    per op).
    """
    rank = tf["rank"].to_numpy()
    phase = tf["phase"].to_numpy()
    start = tf["start_ns"].to_numpy()
    end = tf["end_ns"].to_numpy()
    dur = tf["duration_ns"].to_numpy()
    fm = kind == KIND_FLOW
    comm_phase = np.isin(phase, [PHASE_INDEX[p] for p in COMM_PHASES])
    tm = (kind == KIND_BARRIER) & (rank >= 0) & (dur > 0) & comm_phase
    s, e = start[fm], end[fm]
    first_byte = np.minimum(s + dur[fm], e)  # a flow ends no earlier than its latency
    recv = _peer_receive_start(tf, fm, tm, first_byte)
    # ranks as int32 (a few bytes per interval: this frame is the metrics' largest)
    return (np.concatenate([rank[fm], tf["dst"].to_numpy()[fm], rank[tm]]).astype(np.int32),
            np.concatenate([s, recv, start[tm]]), np.concatenate([e, e, end[tm]]),
            np.concatenate([phase[fm], phase[fm], phase[tm]]))


def _peer_receive_start(tf: pd.DataFrame, fm: np.ndarray, tm: np.ndarray,
                        first_byte: np.ndarray) -> np.ndarray:
    """Start of each flow (mask ``fm``) on its receiver's side: its first byte, or for an EP
    or CP flow its start, or the start of its sender's latest timed barrier of the same
    collective that ended by then (``tm``: the timed communication barriers)."""
    peer_ph = [PHASE_INDEX["ep"], PHASE_INDEX["cp"]]
    phase = tf["phase"].to_numpy()
    pf = np.isin(phase[fm], peer_ph)
    if not pf.any():
        return first_byte  # no EP/CP flow (dense plans): no copy
    start = tf["start_ns"].to_numpy()
    out = np.where(pf, start[fm], first_byte)
    bm = tm & np.isin(phase, peer_ph)
    if not bm.any():
        return out
    coll = tf["collective"].to_numpy()
    rank = tf["rank"].to_numpy()
    end = tf["end_ns"].to_numpy()
    fl = pd.DataFrame({"i": np.flatnonzero(pf), "c": coll[fm][pf].astype(np.int64),
                       "r": rank[fm][pf].astype(np.int64),
                       "t": out[pf].astype(np.float64)}).sort_values("t", kind="stable")
    bar = pd.DataFrame({"c": coll[bm].astype(np.int64), "r": rank[bm].astype(np.int64),
                        "t": end[bm].astype(np.float64),
                        "b": start[bm]}).sort_values("t", kind="stable")
    j = pd.merge_asof(fl, bar, on="t", by=["c", "r"], direction="backward")
    ok = j["b"].notna().to_numpy()
    out[j["i"].to_numpy()[ok]] = j["b"].to_numpy()[ok].astype(out.dtype)
    return out


def rank_metrics(trace: Trace, timeline: Timeline | pd.DataFrame,
                 stragglers: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per rank with times in ns (columns :data:`RANK_COLUMNS`).

    ``timeline``: a Timeline, or its :func:`~xsim_adapters.metrics.timeline.timeline_frame`
    (pass the frame to reuse it); ``stragglers`` is
    :func:`~xsim_adapters.metrics.straggler.straggler_frame` (computed if not given).

    - ``iteration_time_ns``: end of the rank's last op (ops it owns and flows it receives);
      the iteration starts at 0.
    - ``compute_ns``: length of the union of its compute intervals.
    - ``comm_ns`` / ``comm_<phase>_ns``: union of the intervals of flows it sends (from their
      start, the NCCL latency before a ring's first send included) or receives (from their
      first byte), and of its timed communication barriers.
    - ``exposed_comm_ns``: communication time not overlapped by its own compute.
    - ``bubble_ns``: inside [first fwd start, last bwd or wgrad end], time it neither computes
      nor takes part in a ``tp``, ``ep`` or ``cp`` flow nor waits on a slower member of its EP
      all-to-all or CP ring (that is straggler wait); ``bubble_fraction`` = bubble_ns /
      iteration_time_ns.
    - ``straggler_wait_ns`` / ``caused_wait_ns``: time blocked on a slower peer (union of its
      wait intervals minus its own compute) and the share of others' waits it caused; see
      :func:`~xsim_adapters.metrics.straggler.straggler_by_rank`.
    - ``non_compute_ns`` = iteration_time_ns - compute_ns (includes exposed communication;
      this was ``idle_ns`` before); ``idle_ns``: time it neither computes nor communicates.
    - ``flop_count``: model FLOPs (a count, not a rate) of its compute ops.
    - ``breakdown_*_ns``: the disjoint parts of [0, iteration_time_ns], in priority order
      compute > exposed comm > straggler wait > bubble > other; they sum to
      ``iteration_time_ns`` exactly (see :func:`_breakdown`).

    Every ``*_ns`` column is int64 (the timeline frame is rounded to integer ns).
    """
    tf = as_frame(trace, timeline)
    rt = rank_table(trace)
    n = len(rt)
    kind = tf["kind"].to_numpy()
    cm = kind == KIND_COMPUTE
    c_rank = tf["rank"].to_numpy()[cm].astype(np.int32)
    c_s = tf["start_ns"].to_numpy()[cm]
    c_e = tf["end_ns"].to_numpy()[cm]
    c_phase = tf["phase"].to_numpy()[cm]
    f_rank, f_s, f_e, f_ph = _comm_arrays(tf, kind)

    # Iteration end per rank: owned ops and received flows.
    owner = tf["rank"].to_numpy()
    om = owner >= 0
    it = np.zeros(n)
    np.maximum.at(it, owner[om], tf["end_ns"].to_numpy()[om])
    del owner, om
    np.maximum.at(it, f_rank, f_e)
    lo, hi, has = _window(c_phase, c_rank, c_s, c_e, n)
    if np.issubdtype(c_s.dtype, np.integer):  # whole-ns times: clip in int64, no float copy
        lo, hi = lo.astype(np.int64), hi.astype(np.int64)
    flop_count = np.bincount(
        c_rank, weights=tf["flops"].to_numpy(dtype=np.float64)[cm], minlength=n)[:n]

    # Sort every interval once by (rank, start); each metric below is a masked subset of
    # these arrays, which keeps that order, so no further sorting is needed. This step is the
    # metrics' peak: each column is joined (its pieces freed) before the sort, then permuted
    # one at a time, so the joined columns, the order and one permuted copy are held at most.
    nc = len(c_rank)
    s = np.concatenate([c_s, f_s])
    del c_s, f_s
    k = np.concatenate([c_rank, f_rank])
    del c_rank, f_rank
    e = np.concatenate([c_e, f_e])
    del c_e, f_e
    ph = np.concatenate([np.full(nc, -1, dtype=np.int8), f_ph.astype(np.int8)])
    del f_ph
    cols = [k, s]
    del k, s
    order, k, s = sort_consuming(cols)
    e = e[order]
    ph = ph[order]
    is_comp = order < nc
    del order

    # Unions run over slices of whole ranks of at most ~UNION_CHUNK intervals (views of the
    # sorted arrays), so their temporaries stay a fixed size whatever the trace's.
    cuts = np.unique(np.concatenate([[0], np.searchsorted(
        k, k[np.arange(0, len(k), UNION_CHUNK)], side="left"), [len(k)]]))

    def union(mask: np.ndarray | None, lo=None, hi=None) -> np.ndarray:
        total = np.zeros(n)
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
            kk, ss, ee = k[a:b], s[a:b], e[a:b]
            if mask is not None:
                m = mask[a:b]
                kk, ss, ee = kk[m], ss[m], ee[m]
            if lo is not None:
                ss, ee = clip(ss, ee, lo[kk], hi[kk])  # monotone per rank: order kept
            total += union_length(kk, ss, ee, n, presorted=True)
        return total

    def blocks() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [union_blocks(k[a:b], s[a:b], e[a:b], presorted=True)
                 for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True)]
        if not parts:
            return union_blocks(k, s, e, presorted=True)
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore

    compute_ns = union(is_comp)
    comm_ns = union(~is_comp)
    both = union(None)
    out = rt[["rank", "group", "device_type", "replica", "stage"]].copy()
    out["iteration_time_ns"] = it
    out["compute_ns"] = compute_ns
    out["comm_ns"] = comm_ns
    out["exposed_comm_ns"] = both - compute_ns
    # Collectives of the rank's own stage (TP, and the EP all-to-all and CP ring, which run
    # inside a layer) are work, not waiting on the pipeline.
    own_stage = np.isin(ph, [PHASE_INDEX["tp"], PHASE_INDEX["ep"], PHASE_INDEX["cp"]])
    if stragglers is None:
        stragglers = straggler_frame(trace, tf)
    # ... and so is waiting on a slower member of its EP all-to-all or CP ring (straggler wait)
    pk, ps, pe = _wait_intervals(stragglers, ("ep", "cp"))
    mk = is_comp | own_stage
    if len(pk):
        bk = np.concatenate([k[mk], pk])
        bs, be = clip(np.concatenate([s[mk], ps]), np.concatenate([e[mk], pe]), lo[bk], hi[bk])
        busy = union_length(bk, bs, be, n)
        del bk, bs, be
    else:  # no EP/CP waits (every dense plan): the presorted masked union, no copies
        busy = union(mk, lo, hi)
    del mk, own_stage
    out["bubble_ns"] = np.where(has, (hi - lo) - busy, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["bubble_fraction"] = np.where(it > 0, out["bubble_ns"].to_numpy() / it, 0.0)
    sb = straggler_by_rank(stragglers, n, tf)
    out["straggler_wait_ns"] = sb["straggler_wait_ns"].to_numpy()
    out["caused_wait_ns"] = sb["caused_wait_ns"].to_numpy()
    out["straggler_dp_ns"] = sb["straggler_dp_ns"].to_numpy()
    out["straggler_pp_ns"] = sb["straggler_pp_ns"].to_numpy()
    out["straggler_ep_ns"] = sb["straggler_ep_ns"].to_numpy()
    out["straggler_cp_ns"] = sb["straggler_cp_ns"].to_numpy()
    out["non_compute_ns"] = it - compute_ns
    out["idle_ns"] = it - both
    for p in COMM_PHASES:
        out[f"comm_{p}_ns"] = union(ph == PHASE_INDEX[p])
    out["flop_count"] = flop_count
    parts = _breakdown(blocks(), _wait_intervals(stragglers),
                       (lo, hi, has), compute_ns, it, n)
    for name, v in zip(BREAKDOWN_COLUMNS, parts, strict=True):
        out[name] = v
    ns_cols = [c for c in RANK_COLUMNS if c.endswith("_ns")]
    out[ns_cols] = np.rint(out[ns_cols].to_numpy(dtype=np.float64)).astype(np.int64)
    return out[list(RANK_COLUMNS)]


PEER_WAIT_KINDS = ("dp", "ep", "cp")  # synchronizations of peers in lockstep (straggler wait)


def _wait_intervals(stragglers: pd.DataFrame, kinds: tuple[str, ...] = PEER_WAIT_KINDS
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(waiter, ready_ns, last_ready_ns) of the waits on another rank at synchronizations of
    ``kinds``: by default the DP sync, the EP all-to-all and the CP ring."""
    w = stragglers[stragglers["kind"].isin(kinds) & (stragglers["wait_ns"] > 0)
                   & (stragglers["culprit"] != stragglers["waiter"])]
    return (w["waiter"].to_numpy(dtype=np.int64), w["ready_ns"].to_numpy(dtype=np.float64),
            w["last_ready_ns"].to_numpy(dtype=np.float64))


def _breakdown(busy: tuple[np.ndarray, np.ndarray, np.ndarray],
               waits: tuple[np.ndarray, np.ndarray, np.ndarray],
               window: tuple[np.ndarray, np.ndarray, np.ndarray],
               compute_ns: np.ndarray, it: np.ndarray, n: int) -> list[np.ndarray]:
    """Per rank, disjoint parts of [0, it] (ns): compute, exposed comm, straggler wait, bubble,
    other.

    ``busy``: the merged blocks (rank, lo, hi) of compute and communication; ``waits``: wait
    intervals (rank, ready, last_ready) on a slower DP, EP or CP peer; ``window``: the pipeline
    window (lo, hi, has); ``compute_ns``: |C|, the union of the rank's compute intervals. B is
    [0, end of the rank's last backward or wgrad]: idle time before that is the pipeline's fill,
    drain and waits at receives. Each part is the time the next set adds to the union of the
    sets before it, every set clipped to [0, it]: compute |C|, exposed comm |C∪M| - |C|,
    straggler wait |C∪M∪W| - |C∪M|, bubble |C∪M∪W∪B| - |C∪M∪W| and other = it - |C∪M∪W∪B|.
    With integer endpoints every length is an exact integer, so the parts sum to ``it`` exactly.
    """
    def clipped(key: np.ndarray, lo: np.ndarray, hi: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s, e = clip(lo, hi, np.zeros(len(key)), it[key])
        return key, s, e

    def cat(*sets: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        return union_length(np.concatenate([x[0] for x in sets]),
                            np.concatenate([x[1] for x in sets]),
                            np.concatenate([x[2] for x in sets]), n)

    cm = clipped(*busy)
    w = clipped(*waits)
    r = np.flatnonzero(window[2])
    b = clipped(r, np.zeros(len(r)), window[1][r])
    u_cm = cat(cm)
    u_cmw = cat(cm, w)
    u_all = cat(cm, w, b)
    return [compute_ns, u_cm - compute_ns, u_cmw - u_cm, u_all - u_cmw, it - u_all]


def _window(ph: np.ndarray, c_rank: np.ndarray, c_s: np.ndarray, c_e: np.ndarray,
            n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pipeline window per rank: (first fwd start, last backward end, whether it has one),
    from the compute ops' phases, ranks, starts and ends.

    The backward includes the weight-gradient passes (``wgrad``) of zero-bubble schedules.
    """
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    fwd = ph == PHASE_INDEX["fwd"]
    bwd = (ph == PHASE_INDEX["bwd"]) | (ph == PHASE_INDEX["wgrad"])
    np.minimum.at(lo, c_rank[fwd], c_s[fwd])
    np.maximum.at(hi, c_rank[bwd], c_e[bwd])
    has = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
    return np.where(has, lo, 0.0), np.where(has, hi, 0.0), has


def bubble_intervals(tf: pd.DataFrame, num_ranks: int, stragglers: pd.DataFrame | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, start_ns, end_ns) of every pipeline-bubble gap: inside the rank's pipeline
    window, the times it neither computes nor takes part in a ``tp``, ``ep`` or ``cp`` flow
    nor (given ``stragglers``, the straggler frame) waits on a slower EP/CP peer: the
    definition of ``bubble_ns``, so per rank the lengths sum to it. ``tf``: the metrics
    timeline frame."""
    kind = tf["kind"].to_numpy()
    cm = kind == KIND_COMPUTE
    c_rank = tf["rank"].to_numpy()[cm].astype(np.int64)
    c_s = tf["start_ns"].to_numpy()[cm].astype(np.float64)
    c_e = tf["end_ns"].to_numpy()[cm].astype(np.float64)
    f_rank, f_s, f_e, f_ph = _comm_arrays(tf, kind)
    tp = np.isin(f_ph, [PHASE_INDEX["tp"], PHASE_INDEX["ep"], PHASE_INDEX["cp"]])
    lo, hi, has = _window(tf["phase"].to_numpy()[cm], c_rank, c_s, c_e, num_ranks)
    pk, ps, pe = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0)) if stragglers is None \
        else _wait_intervals(stragglers, ("ep", "cp"))
    k = np.concatenate([c_rank, f_rank[tp], pk])
    s, e = clip(np.concatenate([c_s, f_s[tp], ps]), np.concatenate([c_e, f_e[tp], pe]), lo[k],
                hi[k])
    bk, blo, bhi = union_blocks(k, s, e)
    # the gaps of each rank's window: before its first busy block, between blocks, after the last
    ranks_w = np.flatnonzero(has)
    starts = np.concatenate([lo[ranks_w], bhi])
    ends = np.concatenate([np.full(len(ranks_w), np.nan), np.full(len(bk), np.nan)])
    keys = np.concatenate([ranks_w, bk])
    order = np.lexsort((starts, keys))
    keys, starts = keys[order], starts[order]
    # each gap ends where the rank's next busy block starts, or at its window's end
    nxt_lo = np.concatenate([blo, hi[ranks_w]])
    nxt_key = np.concatenate([bk, ranks_w])
    o2 = np.lexsort((nxt_lo, nxt_key))
    nxt_lo = nxt_lo[o2]
    ends = nxt_lo  # same count and (rank, position) order as starts: one gap per boundary
    keep = ends > starts
    return keys[keep], starts[keep], ends[keep]


def straggler_intervals(stragglers: pd.DataFrame, tf: pd.DataFrame
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rank, start_ns, end_ns) of the time each rank sat blocked on a slower peer (DP sync,
    EP all-to-all, CP ring): the union of its waits ``[ready_ns, last_ready_ns]`` minus its
    compute (the definition of ``straggler_wait_ns``: per rank the lengths sum to it)."""
    wk, ws, we = _wait_intervals(stragglers)
    comp = tf[tf["kind"].to_numpy() == KIND_COMPUTE]
    ck = comp["rank"].to_numpy(dtype=np.int64)
    return _minus(wk, ws, we, ck, comp["start_ns"].to_numpy(dtype=np.float64),
                  comp["end_ns"].to_numpy(dtype=np.float64))


def _minus(ak: np.ndarray, a_s: np.ndarray, a_e: np.ndarray, bk: np.ndarray, b_s: np.ndarray,
           b_e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per key, the union of the intervals a minus the union of the intervals b, as
    (key, start, end) blocks (a sweep over +1/-1 events; counts return to 0 per key)."""
    key = np.concatenate([ak, ak, bk, bk])
    t = np.concatenate([a_s, a_e, b_s, b_e])
    da = np.concatenate([np.ones(len(ak)), -np.ones(len(ak)), np.zeros(2 * len(bk))])
    db = np.concatenate([np.zeros(2 * len(ak)), np.ones(len(bk)), -np.ones(len(bk))])
    order = np.lexsort((t, key))
    key, t = key[order], t[order]
    in_a = np.cumsum(da[order]) > 0.5
    in_b = np.cumsum(db[order]) > 0.5
    seg = in_a[:-1] & ~in_b[:-1] & (key[:-1] == key[1:]) & (t[1:] > t[:-1])
    k, lo, hi = key[:-1][seg], t[:-1][seg], t[1:][seg]
    return union_blocks(k, lo, hi)
