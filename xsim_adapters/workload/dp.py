"""The end of the iteration: per-rank barriers, the data-parallel gradient sync, the optimizer.

ZeRO (``training.zero_stage`` >= 1, dp > 1): the DP sync is a reduce-scatter, the optimizer
steps over 1/dp of the stage's parameters, and an all-gather of the updated parameters on the
same rings follows: with ``overlap.param_gather`` at the start of the iteration ahead of the
forward that needs it (:func:`_param_gather`), otherwise after the optimizer step. Without ZeRO
an all-reduce precedes a full step. Each rank's optimizer step waits, through one barrier op
per rank, for its last block and every DP ring it is part of.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..plan.model import Plan, Stage
from ..plan.moe import routed_expert_params
from ..plan.parallel import fsdp_shard_size, group_replicas, uses_ep
from ..trace.schema import KIND_BARRIER, KIND_COMPUTE, PHASE_INDEX
from .comm.alltoall import MoEPlanner
from .comm.dpsetup import DPSetup, RingRows, emit_sync, sync_rings
from .comm.dpsync import buckets, chunk_rings, sweep_segments
from .comm.emit import Emitter, chunk_of
from .compute.costs import optimizer_time_ns, stage_params
from .fsdp import add_fsdp_gathers, hsdp_sync, zero3
from .schedule import BWD, WGRAD


def add_dp_and_optimizer(em: Emitter, rep: Sequence[int], moe: MoEPlanner | None) -> None:
    """Barriers, DP sync (dense and expert) and the optimizer step of every rank; ``rep``:
    replica -> the replica whose ops stand for it (coarsening)."""
    plan, tb = em.plan, em.tb
    zero = plan.training.zero_stage >= 1 and plan.dp > 1
    barrier_of = np.full(plan.num_ranks, -1, dtype=np.int64)
    last_ends: list[tuple[np.ndarray, np.ndarray, Stage, int, int]] = []
    for r, rp in enumerate(plan.replicas):
        if rep[r] != r:
            continue
        for i, st in enumerate(rp.stages):
            blk, mb = em.last_block(r, i)
            ranks = np.asarray(plan.stage_ranks(st), dtype=np.int64)
            last_ends.append((blk.ends[mb], blk.last[mb], st, r, i))
            if plan.dp > 1:
                ids = tb.add_ops(len(ranks), kind=KIND_BARRIER, rank=ranks,
                                 phase=PHASE_INDEX["optim"], replica=r, stage=i)
                barrier_of[ranks] = ids
                tb.add_edges(blk.ends[mb], ids[:, None])
    mirror_ranks(plan, rep, barrier_of)
    dp = dp_setup(em) if plan.dp > 1 else None
    sync = "reduce_scatter" if zero else "all_reduce"
    if dp is not None and zero3(plan) and fsdp_shard_size(plan) < plan.dp:
        dp = hsdp_sync(em, dp, barrier_of)  # HSDP: the gathers run on the shard rings
    elif dp is not None:
        tails, _ = emit_sync(em, dp, sync, dp.ready_op)
        tb.add_edges(tails, barrier_of[dp.members][:, None, :, None])
    edp = moe.edp_setup(em) if moe is not None and uses_ep(plan) else None
    if edp is not None:  # expert gradients over the expert-data-parallel group
        tails, _ = emit_sync(em, edp, sync, edp.ready_op)
        tb.add_edges(tails, barrier_of[edp.members][:, None, :, None])
    optim_of = _optimizer(em, last_ends, barrier_of, moe, zero)
    mirror_ranks(plan, rep, optim_of)
    if dp is not None and zero3(plan):  # FSDP: gathers per unit and pass, none after the step
        add_fsdp_gathers(em, dp)
    elif dp is not None and zero:
        if plan.training.overlap.param_gather:
            _param_gather(em, dp)
        else:
            emit_sync(em, dp, "all_gather", optim_of[dp.members])
    if edp is not None and zero:  # experts' all-gather after the step (not overlapped)
        emit_sync(em, edp, "all_gather", optim_of[edp.members])


def _optimizer(em: Emitter, last_ends: list[tuple[np.ndarray, np.ndarray, Stage, int, int]],
               barrier_of: np.ndarray, moe: MoEPlanner | None, zero: bool) -> np.ndarray:
    """The optimizer step of every built stage's ranks; returns the op id per global rank."""
    plan, tb = em.plan, em.tb
    optim_of = np.full(plan.num_ranks, -1, dtype=np.int64)
    shard = fsdp_shard_size(plan) if zero3(plan) else plan.dp  # ranks a ZeRO shard spans
    for ends, last, st, r, i in last_ends:
        ranks = np.asarray(plan.stage_ranks(st), dtype=np.int64)
        dev = plan.device_types[plan.group(st.group).type]
        params: float | np.ndarray = (
            stage_params(plan.model, st.layers) / st.tp / (shard if zero else 1))
        if moe is not None and uses_ep(plan):  # experts: own count, EDP-sharded
            edp_n = plan.dp // len(group_replicas(plan, r, i, "ep"))
            routed = routed_expert_params(plan.model, st.layers)
            params = params - routed / st.tp / (shard if zero else 1) + np.array(
                [moe.expert_params_of(r, i, k) for k in range(st.tp)]
            ) / (edp_n if zero else 1)
        ids = tb.add_ops(
            len(ranks),
            kind=KIND_COMPUTE,
            rank=ranks,
            duration_ns=(optimizer_time_ns(params, dev) if not isinstance(params, np.ndarray)
                         else np.array([optimizer_time_ns(float(x), dev) for x in params])),
            phase=PHASE_INDEX["optim"],
            replica=r,
            stage=i,
            layer_start=st.layers[0],
            layer_stop=st.layers[1],
        )
        optim_of[ranks] = ids
        tb.add_edges(last, ids)
        if plan.dp > 1:
            tb.add_edges(barrier_of[ranks], ids)
        else:
            tb.add_edges(ends, ids[:, None])
    return optim_of


def mirror_ranks(plan: Plan, rep: Sequence[int], per_rank: np.ndarray) -> None:
    """A mirrored replica's ranks take the ops of their representative's matching ranks
    (same stage, same TP index) in ``per_rank`` (op id per global rank), in place."""
    for r, q in enumerate(rep):
        if q != r:
            for st, sq in zip(plan.replicas[r].stages, plan.replicas[q].stages, strict=True):
                per_rank[list(plan.stage_ranks(st))] = per_rank[list(plan.stage_ranks(sq))]


def _param_gather(em: Emitter, dp: DPSetup) -> None:
    """ZeRO all-gather overlapped with the forward (Megatron-Core ``overlap_param_gather``).

    One simulated iteration stands for the steady state: it begins with the all-gather of
    the parameters the previous iteration's optimizer updated (one all-gather per iteration,
    as without overlap). Each rank issues its buckets' all-gathers in forward (layer) order,
    the next when the previous has arrived (Megatron dispatches bucket k + 1 when bucket k's
    forward pre-hook waits on k); the first forward of a bucket's first layer (or of the
    embedding) waits for that bucket's all-gather on its rank.
    """
    tails, starts = emit_sync(em, dp, "all_gather", None)
    members = dp.members  # (I, n); member j belongs to replica j
    prev = np.full(members.shape, -1, dtype=np.int64)
    seen: dict[int, int] = {}
    for i in range(members.shape[0]):  # rings are in bucket (layer) order
        for j, rank in enumerate(members[i]):
            prev[i, j] = seen.get(int(rank), -1)
            seen[int(rank)] = i
    ii, jj = np.nonzero(prev >= 0)
    if len(ii):
        pred = tails[prev[ii, jj], :, jj, :].reshape(len(ii), 1, -1)
        em.tb.add_edges_valid(pred, starts[ii, :, jj][:, :, None])
    need = dp.first_fwd_op  # (I, n)
    assert need is not None
    em.tb.add_edges(tails.transpose(0, 2, 1, 3).reshape(*need.shape, -1), need[:, :, None])


def dp_setup(em: Emitter) -> DPSetup | None:
    """Rings of the DP sync (members, orders, bytes) and each member's readiness op.

    Readiness: with ``overlap.dp_grad_reduce``, the member's last weight-gradient pass of the
    bucket's first layer (or the embedding); otherwise the stage's last compute op of the
    iteration (every bucket after the whole backward, as Megatron without overlap).
    """
    plan = em.plan
    segs = sweep_segments(plan)
    bks = buckets(plan, segs)
    rings = chunk_rings(plan, segs, bks)
    if not rings:
        return None
    perm, sizes, gsizes, labels, delays, choices = sync_rings(em, RingRows(
        [list(cr.members) for cr in rings], [cr.nbytes for cr in rings],
        [cr.param_nbytes for cr in rings]))
    grad_kind = WGRAD if plan.training.schedule == "zb_h1" else BWD
    last_op: dict[tuple[int, int], np.ndarray] = {}  # (r, s) -> last compute ids (n,)
    last_grad: dict[tuple[int, int, int], int] = {}  # (r, s, chunk) -> last grad micro-batch
    for r, rp in enumerate(plan.replicas):
        for s in range(rp.pp):
            order = em.order(r, s)
            blk, mb = em.last_block(r, s)
            last_op[(r, s)] = blk.last[mb]
            for row in order[order[:, 0] == grad_kind]:  # in run order: the last one wins
                last_grad[(r, s, int(row[1]))] = int(row[2])
    members = np.array([cr.members for cr in rings], dtype=np.int64)  # (I, n)
    overlap_grads = plan.training.overlap.dp_grad_reduce
    ready = np.zeros(members.shape, dtype=np.int64)
    first_fwd = np.zeros(members.shape, dtype=np.int64)
    for k, cr in enumerate(rings):
        bk = bks[cr.bucket]
        mark = "embedding" if bk.has_embedding else bk.start
        for j, (r, s) in enumerate(segs[bk.segment].owners):
            local = cr.member_local[j]
            c = chunk_of(em, r, s, bk.start)
            ops = em.stage_ops[(r, s, c)]
            if overlap_grads:
                ready[k, j] = ops[grad_kind].marks[mark][last_grad[(r, s, c)], local]
            else:
                ready[k, j] = last_op[(r, s)][local]
            first_fwd[k, j] = ops[0].marks[("fwd", mark)][0, local]
    bk_of = [cr.bucket for cr in rings]
    return DPSetup(
        members=members, perm=perm, grad_channel_bytes=sizes, param_channel_bytes=gsizes,
        grad_bytes=np.array([cr.nbytes for cr in rings], dtype=np.int64),
        param_bytes=np.array([cr.param_nbytes for cr in rings], dtype=np.int64),
        delays_ns=delays, choices=choices, labels=labels,
        chunk=np.array([cr.chunk for cr in rings], dtype=np.int64),
        sync_group=np.array([bks[b].segment for b in bk_of], dtype=np.int64),
        layer_start=np.array([bks[b].start for b in bk_of], dtype=np.int64),
        layer_stop=np.array([bks[b].stop for b in bk_of], dtype=np.int64),
        ready_op=ready, first_fwd_op=first_fwd)


__all__ = ["add_dp_and_optimizer", "dp_setup", "mirror_ranks"]
