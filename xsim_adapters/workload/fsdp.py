"""ZeRO-3 / FSDP (``training.zero_stage: 3``, dp > 1): the per-unit parameter all-gathers.

An FSDP unit is a DP bucket (:mod:`.comm.dpsync`: ``collectives.dp_bucket_layers`` layers, the
embedding in the first, the head in the last); each rank holds 1/dp of every unit's
parameters (of its TP shard, on the bucket's DP rings). Per micro-batch, on every member of a
unit's rings, one all-gather of the unit's parameters (model dtype, :attr:`DPSetup.param_bytes`)
before the unit's forward and, with ``training.fsdp.reshard_after_forward`` (the default),
another before its backward (the first op of the unit's last layer's backward, the head's
backward, or with full recompute the layer's recompute). The gradients are reduce-scattered
once per iteration as under ZeRO-1/2 (:mod:`.dp`), and nothing is gathered after the optimizer
step (the parameters stay sharded).

Order, as PyTorch FSDP issues them (FSDP2 ``FSDPParamGroup`` / forward and backward prefetch;
DeepSpeed's ZeRO-3 prefetch coordinator does the same): a rank's all-gathers run one after
another on one communication stream, in the pass's unit order (layer order forward, reverse
layer order backward); unit q of a pass (q-th in that order) starts after unit q-1's gather
has arrived and, for q >= p (``training.fsdp.prefetch``), once unit q-p's first op has run:
at most p + 1 units are gathered ahead of the compute. The first p gathers of a pass start
when the rank's previous block in run order is done (the pass begins). The unit's first op
waits for its gather.
"""

from __future__ import annotations

import numpy as np

from ..plan.model import Plan
from ..plan.parallel import check_fsdp, fsdp_shard_size, zero3
from .comm.dpsetup import DPSetup, emit_sync, subset_setup
from .comm.emit import Emitter, chunk_of
from .schedule import BWD, FWD


def fsdp_micro_batches(plan: Plan) -> int:
    """Gathers per unit and pass: the most micro-batches of any replica. The gathers are
    collectives over every replica, so a replica with fewer micro-batches joins the extra ones
    (padding, as a framework must) once its own last pass of that kind is done; no compute of
    that replica waits for them."""
    return max(rp.micro_batches for rp in plan.replicas)


def add_fsdp_gathers(em: Emitter, dp: DPSetup) -> None:
    """Emit the ZeRO-3 all-gathers of every micro-batch's forward and (reshard after forward)
    backward, gated as the module says."""
    plan = em.plan
    check_fsdp(plan)
    fs = plan.training.fsdp
    m = fsdp_micro_batches(plan)
    for kind in [FWD, BWD] if fs.reshard_after_forward else [FWD]:
        gate, prev = _unit_gates(em, dp, kind)
        pred1, predp = _chains(em, dp, kind, fs.prefetch)
        for mb in range(m):
            tails, starts = emit_sync(em, dp, "all_gather", None)
            _gate_pass(em, gate[:, mb], prev[:, mb], (pred1, predp), tails, starts)


def hsdp_sync(em: Emitter, dp: DPSetup, barrier_of: np.ndarray) -> DPSetup:
    """HSDP (``training.fsdp.hsdp_shard`` n < dp): each bucket's gradients are reduce-scattered
    within every shard group of n consecutive replicas, then each shard is all-reduced across
    the dp / n groups over the members holding it (PyTorch HYBRID_SHARD); every member's
    optimizer waits for its all-reduce. Returns the shard rings (the parameter gathers run on
    them)."""
    plan = em.plan
    n = fsdp_shard_size(plan)
    reps = plan.dp // n
    shard = subset_setup(em, dp, [list(range(g * n, (g + 1) * n)) for g in range(reps)])
    repl = subset_setup(em, dp, [list(range(k, plan.dp, n)) for k in range(n)], divide=n)
    rs_tails, _ = emit_sync(em, shard, "reduce_scatter", shard.ready_op)
    ar_tails, ar_starts = emit_sync(em, repl, "all_reduce", None)
    # all-reduce ring i*n + k, member q (group q) holds shard k of shard ring i*reps + q
    i, k, q = (x.ravel() for x in np.meshgrid(np.arange(len(dp.members)), np.arange(n),
                                              np.arange(reps), indexing="ij"))
    src = rs_tails[i * reps + q, :, k, :].reshape(len(i), 1, -1)
    em.tb.add_edges_valid(src, ar_starts[i * n + k, :, q][:, :, None])
    em.tb.add_edges(ar_tails, barrier_of[repl.members][:, None, :, None])
    return shard


def _gate_pass(em: Emitter, gate: np.ndarray, prev: np.ndarray,
               preds: tuple[np.ndarray, np.ndarray], tails: np.ndarray,
               starts: np.ndarray) -> None:
    """Edges of one pass's all-gathers (ring i, member j): ``gate`` (I, n) the op needing the
    gather, ``prev`` (I, n) the member's previous block's last op (-1: none), ``preds`` the
    rings one and p units earlier in the member's pass order (-1: none); tails (I, C, n, 2),
    starts (I, C, n) as :func:`.comm.dpsetup.emit_sync` returns them."""
    tb = em.tb
    pred1, predp = preds
    ii, jj = np.nonzero(pred1 >= 0)  # one stream: after the previous unit's gather arrived
    if len(ii):
        src = tails[pred1[ii, jj], :, jj, :].reshape(len(ii), 1, -1)
        tb.add_edges_valid(src, starts[ii, :, jj][:, :, None])
    ii, jj = np.nonzero(predp >= 0)  # prefetch depth: once unit q - p's compute has begun
    if len(ii):
        src = gate[predp[ii, jj], jj].reshape(len(ii), 1, 1)
        tb.add_edges_valid(src, starts[ii, :, jj][:, :, None])
    ii, jj = np.nonzero((predp < 0) & (prev >= 0))  # the first p units: when the pass begins
    if len(ii):
        tb.add_edges_valid(prev[ii, jj].reshape(len(ii), 1, 1), starts[ii, :, jj][:, :, None])
    n_i, n = gate.shape
    tb.add_edges_valid(tails.transpose(0, 2, 1, 3).reshape(n_i, n, -1), gate[:, :, None])


def _chains(em: Emitter, dp: DPSetup, kind: int, prefetch: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """(pred1, predp), each (I, n): the ring one and ``prefetch`` units before ring i in
    member j's pass order (forward: layer order; backward: reverse), within the member's model
    chunk; -1 where there is none."""
    members = dp.members
    n_i, n = members.shape
    order = range(n_i) if _ascending(em.plan, kind) else range(n_i - 1, -1, -1)
    pred1 = np.full(members.shape, -1, dtype=np.int64)
    predp = np.full(members.shape, -1, dtype=np.int64)
    seen: dict[tuple[int, int], list[int]] = {}
    for i in order:  # rings are in bucket (layer) order
        for j in range(n):
            r = int(em.rank_replica[members[i, j]])
            s = int(em.rank_stage[members[i, j]])
            c = chunk_of(em, r, s, int(dp.layer_start[i]))
            done = seen.setdefault((int(members[i, j]), c), [])
            if done:
                pred1[i, j] = done[-1]
            if len(done) >= prefetch:
                predp[i, j] = done[-prefetch]
            done.append(i)
    return pred1, predp


def _ascending(plan: Plan, kind: int) -> bool:
    """Whether pass ``kind`` needs its units in layer order: the forward, and with full
    recompute the backward too (the trace recomputes a chunk's layers in order before their
    backward, :mod:`.blocks`, so the unit is needed from its recompute on)."""
    return kind == FWD or plan.training.recompute == "full"


def _unit_gates(em: Emitter, dp: DPSetup, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """(gate, prev), each (I, M, n): per ring, micro-batch and member, the first op of the
    pass ``kind`` that needs the unit's parameters (-1: a padded gather), and the last op of
    the block the member's stage runs before that pass's block (-1: the first block of the
    iteration; a padded gather: the member's last block of the kind)."""
    plan = em.plan
    n_i, n = dp.members.shape
    m = fsdp_micro_batches(plan)
    gate = np.zeros((n_i, m, n), dtype=np.int64)
    prev = np.full((n_i, m, n), -1, dtype=np.int64)
    before: dict[tuple[int, int], dict[tuple[int, int, int], tuple[int, int, int]]] = {}
    for i in range(n_i):
        a, b = int(dp.layer_start[i]), int(dp.layer_stop[i])
        for j in range(n):
            rank = int(dp.members[i, j])
            r, s = int(em.rank_replica[rank]), int(em.rank_stage[rank])
            local = plan.stage_ranks(plan.replicas[r].stages[s]).index(rank)
            c = chunk_of(em, r, s, a)
            ops = em.stage_ops[(r, s, c)]
            if kind == FWD:
                mk: object = ("fwd", "embedding" if a == 0 else a)
            elif plan.training.recompute == "full":  # the unit's first layer's recompute
                mk = ("bwd", a)
            else:
                mk = ("bwd", plan.model.layers if b == plan.model.layers else b - 1)
            own = plan.replicas[r].micro_batches
            gate[i, :own, j] = ops[kind].marks[mk][:, local]
            gate[i, own:, j] = -1  # a padded gather: no compute of this member needs it
            if (r, s) not in before:
                rows = [(int(k), int(ch), int(b)) for k, ch, b in em.order(r, s)]
                before[(r, s)] = dict(zip(rows[1:], rows[:-1], strict=True))
            for mb in range(m):
                # a padded gather starts when the member's last pass of this kind is done
                pk = before[(r, s)].get((kind, c, mb)) if mb < own else (kind, c, own - 1)
                if pk is not None:
                    prev[i, mb, j] = em.stage_ops[(r, s, pk[1])][pk[0]].last[pk[2], local]
    return gate, prev


__all__ = ["add_fsdp_gathers", "check_fsdp", "fsdp_micro_batches", "hsdp_sync", "zero3"]
