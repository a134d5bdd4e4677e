"""The rings of a gradient sync (dense DP or expert DP) as one frozen record, and their lowering.

:func:`sync_rings` turns a list of ring instances (members, gradient bytes, parameter bytes)
into a :class:`DPSetup`: channel orders, bytes per channel, the algorithm NCCL's tuner picks
and its delay per sync kind. :func:`emit_sync` emits one kind of it (all-reduce,
reduce-scatter, or ZeRO's all-gather of the updated parameters) through the emitter's one
lowering path (:func:`.emit.emit_lowered`). The dense DP sync (:mod:`..dp`) and the expert-DP
sync (:meth:`.alltoall.MoEPlanner.edp_setup`) both build their setup here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...trace.schema import PHASE_INDEX
from .emit import Emitter, emit_lowered
from .rings import ring_bottleneck_GBps, ring_delay_ns, split_bytes
from .selection import Choice, choose_algorithm, lower_instances

SYNC_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


@dataclass(frozen=True)
class RingRows:
    """The ring instances of a sync before lowering: (I,) rows."""

    members: list[list[int]]  # global ranks of each ring, member j from replica (group) j
    grad_bytes: list[int]  # gradient bytes of each ring (all-reduce, reduce-scatter)
    param_bytes: list[int]  # parameter bytes of each ring (ZeRO's all-gather)


@dataclass(frozen=True)
class DPSetup:
    """The rings of one gradient sync, one row per ring instance (I rings of n members, C
    channels each). Arrays are int64 unless said otherwise."""

    members: np.ndarray  # (I, n) global ranks
    perm: np.ndarray  # (I, C, n) channel orders as member positions
    grad_channel_bytes: np.ndarray  # (I, C) gradient bytes per channel
    param_channel_bytes: np.ndarray  # (I, C) ZeRO all-gather (model dtype) bytes per channel
    grad_bytes: np.ndarray  # (I,) gradient bytes of each ring
    param_bytes: np.ndarray  # (I,) parameter bytes of each ring
    delays_ns: dict[str, np.ndarray]  # sync kind -> (I,) NCCL delay; absent: no NCCL cost
    choices: dict[str, list[Choice]]  # sync kind -> (I,) the algorithm each ring runs
    labels: np.ndarray  # (I,) object: the ring's first channel order, "r0,r1,..."
    chunk: np.ndarray  # (I,) multi-ring chunk of the bucket (-1: none)
    sync_group: np.ndarray  # (I,) the sweep-line segment (-1: expert DP)
    layer_start: np.ndarray  # (I,)
    layer_stop: np.ndarray  # (I,)
    ready_op: np.ndarray  # (I, n) op after which each member's gradients are ready
    first_fwd_op: np.ndarray | None  # (I, n) first forward op needing the bucket (dense DP)


def sync_rings(em: Emitter, rows: RingRows) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray, dict[str, np.ndarray],
                                                     dict[str, list[Choice]]]:
    """Lower ``rows`` to rings: (perm, grad channel bytes, param channel bytes, labels, delays,
    choices), the fields of :class:`DPSetup` of the same names.

    ``channels: auto`` may open more rings for some DP rings than for others; the vectorized
    lowering wants one channel count, so rings with fewer repeat theirs (the same NIC load,
    the bytes split over the copies)."""
    info = em.info
    perms, sizes, gsizes, labels = [], [], [], []
    delays: dict[str, list[int]] = {k: [] for k in SYNC_KINDS}
    choices: dict[str, list[Choice]] = {k: [] for k in SYNC_KINDS}
    seen: dict[tuple, int] = {}
    picked: dict[tuple, Choice] = {}
    ring_orders = [em.ring(list(m), nb) for m, nb in zip(rows.members, rows.grad_bytes,
                                                          strict=True)]
    width = max(len(o) for o, _ in ring_orders)
    for members, nb, pb, (orders, sz) in zip(rows.members, rows.grad_bytes, rows.param_bytes,
                                             ring_orders, strict=True):
        bott: list[float] = []
        if len(orders) < width:
            orders = [orders[i % len(orders)] for i in range(width)]
            bott = [ring_bottleneck_GBps(info, o) for o in orders]
            sz = split_bytes(nb, bott)
        # gradients (all-reduce, reduce-scatter) in the gradient format; ZeRO's all-gather
        # of the updated parameters in the model dtype, on the same rings
        if pb == nb:
            gsz = sz
        elif bott:
            gsz = split_bytes(pb, bott)
        else:
            gsz = em.ring(list(members), pb)[1]
        pos = {rk: k for k, rk in enumerate(members)}
        perms.append([[pos[rk] for rk in o] for o in orders])
        sizes.append(sz)
        gsizes.append(gsz)
        labels.append(",".join(map(str, orders[0])))
        _sync_choices(em, members, orders, (nb, sz), (pb, gsz), choices, delays, picked, seen)
    return (np.array(perms, dtype=np.int64), np.array(sizes, dtype=np.int64),
            np.array(gsizes, dtype=np.int64), np.array(labels, dtype=object),
            {k: np.array(v, dtype=np.int64) for k, v in delays.items() if v}, choices)


def _sync_choices(em: Emitter, members: Sequence[int], orders: list[list[int]],
                  grads: tuple[int, list[int]], params: tuple[int, list[int]],
                  choices: dict[str, list[Choice]], delays: dict[str, list[int]],
                  picked: dict[tuple, Choice], seen: dict[tuple, int]) -> None:
    """Append one ring's algorithm (NCCL's tuner pick) and NCCL delay per sync kind to
    ``choices`` / ``delays``: all-reduce and reduce-scatter move the gradients ``grads``
    (bytes, per-channel sizes), ZeRO's all-gather the parameters ``params``. ``picked``
    and ``seen`` cache the picks by server shape and the delays by ring layout."""
    plan, info = em.plan, em.info
    mem = np.asarray(members, dtype=np.int64)
    shape = (tuple(info.group[mem]), tuple(np.unique(info.server[mem],
                                                     return_inverse=True)[1]),
             tuple(info.local[mem]))
    for kd in choices:
        nb, ksz = params if kd == "all_gather" else grads
        if (kd, *shape, nb) not in picked:
            picked[(kd, *shape, nb)] = choose_algorithm(plan, info, list(members), kd, nb)
        ch = picked[(kd, *shape, nb)]
        choices[kd].append(ch)
        if plan.collectives.nccl_cost:
            key = (kd, tuple(map(tuple, orders)), tuple(ksz))
            if key not in seen:
                seen[key] = ring_delay_ns(info, kd, orders, ksz)
            delays[kd].append(seen[key] if ch.algorithm == "ring" else ch.delay_ns)


def subset_setup(em: Emitter, dp: DPSetup, groups: list[list[int]], divide: int = 1
                 ) -> DPSetup:
    """The rings of ``dp`` cut by member position into ``groups`` (HSDP): ring i becomes one
    ring per group, over members ``dp.members[i, group]``, in the order ring-major then group;
    its bytes divided by ``divide`` (the replicate all-reduce moves one shard)."""
    n_g = len(groups)
    idx = np.array(groups, dtype=np.int64)  # (G, k)
    members = dp.members[:, idx].reshape(-1, idx.shape[1])  # (I * G, k)
    rep = np.repeat(np.arange(len(dp.members)), n_g)
    grad = [int(x) // divide for x in dp.grad_bytes[rep]]
    par = [int(x) // divide for x in dp.param_bytes[rep]]
    perm, sizes, gsizes, labels, delays, choices = sync_rings(em, RingRows(
        [list(m) for m in members], grad, par))
    ff = dp.first_fwd_op
    return DPSetup(
        members=members, perm=perm, grad_channel_bytes=sizes, param_channel_bytes=gsizes,
        grad_bytes=np.array(grad, dtype=np.int64), param_bytes=np.array(par, dtype=np.int64),
        delays_ns=delays, choices=choices, labels=labels, chunk=dp.chunk[rep],
        sync_group=dp.sync_group[rep], layer_start=dp.layer_start[rep],
        layer_stop=dp.layer_stop[rep],
        ready_op=dp.ready_op[:, idx].reshape(members.shape),
        first_fwd_op=None if ff is None else ff[:, idx].reshape(members.shape))


def emit_sync(em: Emitter, dp: DPSetup, kind: str, start_after: np.ndarray | None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Emit one ``kind`` collective per ring of ``dp``; member j of ring i starts after
    ``start_after[i, j]`` (None: no predecessor). Returns the global tails (I, C, n, 2) and
    gate flows (I, C, n) (a member whose delay stays a timed barrier has that barrier at
    channel 0 and -1 elsewhere: add edges into them with ``add_edges_valid``)."""
    c = em.plan.collectives
    # ZeRO's parameter all-gather moves model-dtype bytes
    gather = kind == "all_gather"
    sizes = dp.param_channel_bytes if gather else dp.grad_channel_bytes
    nbytes = dp.param_bytes if gather else dp.grad_bytes
    rf, algos, chans = lower_instances(
        dp.members, dp.perm, sizes, nbytes, dp.choices[kind], kind,
        c.granularity, c.chunks, em.ring_label, int(dp.perm.shape[1]))
    phase = PHASE_INDEX["dp"]
    coll = dict(n=len(dp.members), kind=kind, phase=phase, bytes=nbytes, ranks=dp.labels,
                algorithm=algos, channels=chans, sync_group=dp.sync_group,
                layer_start=dp.layer_start, layer_stop=dp.layer_stop, chunk=dp.chunk)
    tails, starts = emit_lowered(
        em.tb, rf, dp.members, dp.delays_ns.get(kind), coll,
        lambda rk, inst: em.tags(rk, phase=phase, layer_start=dp.layer_start[inst],
                                 layer_stop=dp.layer_stop[inst]))
    if start_after is not None:
        em.tb.add_edges_valid(start_after[:, None, :], starts)
    return tails, starts


__all__ = ["DPSetup", "RingRows", "SYNC_KINDS", "emit_sync", "subset_setup", "sync_rings"]
