"""One stage's forward and backward blocks for one micro-batch, as templates with local ranks.

A block is a chain of *units*; a unit is one compute op per TP rank followed by its TP
collectives (Megatron): the attention block and the MLP block of each layer, each followed by an
all-reduce (or, with sequence parallelism, a reduce-scatter then an all-gather) of
S = b*s*h*dtype bytes. The forward block is [embedding + TP collective] (first stage), the
layers' (attention, MLP) units, [head forward] (last stage). The backward block mirrors it:
[recompute forward of the layers], [head backward + TP collective], the layers in reverse as
(MLP backward, attention backward) units, [embedding gradient] (first stage).

Every compute op depends on the previous compute op of its rank (explicit run order) and on
the last flows of the previous unit's collective that touch its rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..plan.model import DeviceType, Plan, Stage
from ..trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, LAYER_EMBEDDING, PHASE_INDEX
from .builder import BulkBuilder, Template
from .collectives import RingFlows, ring_flows
from .compute import embedding_cost, head_cost, layer_costs


@dataclass(frozen=True)
class Unit:
    """One compute op per rank, then TP collectives of ``kinds`` (may be empty)."""

    phase: str
    layer_start: int
    layer_stop: int
    duration_ns: int
    flops: float
    kinds: tuple[str, ...]
    mark: object = None  # key under which the compute ids are remembered (DP readiness)


@dataclass
class Block:
    """A block template and where to attach dependencies to it (local op ids, per local rank)."""

    template: Template
    head: np.ndarray  # (n,) first compute op of each rank
    last: np.ndarray  # (n,) last compute op of each rank
    tails: np.ndarray  # (n, k) ops after which each rank holds the block's result
    marks: dict[object, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class RingSpec:
    """TP ring setup of a stage: per-channel orders (local indices) and bytes per channel."""

    perm: tuple[tuple[int, ...], ...]  # (C, n)
    sizes: tuple[int, ...]  # (C,)
    label: str  # channel-0 order, local indices, comma-joined
    algorithm: str
    delays: tuple[tuple[str, int], ...] = ()  # (collective kind, NCCL delay ns before a ring)


def tp_kinds(plan: Plan) -> tuple[str, ...]:
    """The collective kinds of a stage's TP ring."""
    return ("reduce_scatter", "all_gather") if plan.training.sequence_parallel else ("all_reduce",)


def stage_units(plan: Plan, stage: Stage, device: DeviceType, first: bool, last: bool):
    """(forward units, backward units) of one stage for one micro-batch."""
    model, training = plan.model, plan.training
    n = stage.tp
    costs = layer_costs(model, training, device, n)
    tpk = tp_kinds(plan)
    a, b = stage.layers
    fwd: list[Unit] = []
    bwd: list[Unit] = []
    if first:
        ns, fl = embedding_cost(model, training, device)
        fwd.append(Unit("fwd", LAYER_EMBEDDING, LAYER_EMBEDDING + 1, ns, fl, tpk))
    for layer in range(a, b):
        fwd.append(Unit("fwd", layer, layer + 1, costs.attn_fwd_ns, costs.attn_flops, tpk))
        fwd.append(Unit("fwd", layer, layer + 1, costs.mlp_fwd_ns, costs.mlp_flops, tpk))
    if last:
        ns, fl = head_cost(model, training, device, n)
        fwd.append(Unit("fwd", model.layers, model.layers + 1, ns, fl, ()))
    if training.recompute:
        for layer in range(a, b):
            bwd.append(
                Unit("recompute", layer, layer + 1, costs.attn_fwd_ns, costs.attn_flops, tpk)
            )
            bwd.append(Unit("recompute", layer, layer + 1, costs.mlp_fwd_ns, costs.mlp_flops, tpk))
    if last:
        ns, fl = head_cost(model, training, device, n)
        bwd.append(Unit("bwd", model.layers, model.layers + 1, 2 * ns, 2 * fl, tpk))
    for layer in range(b - 1, a - 1, -1):
        bwd.append(Unit("bwd", layer, layer + 1, costs.mlp_bwd_ns, 2 * costs.mlp_flops, tpk))
        bwd.append(
            Unit("bwd", layer, layer + 1, costs.attn_bwd_ns, 2 * costs.attn_flops, tpk, mark=layer)
        )
    if first:
        ns, fl = embedding_cost(model, training, device)
        bwd.append(Unit("bwd", LAYER_EMBEDDING, LAYER_EMBEDDING + 1, ns, fl, (), mark="embedding"))
    return fwd, bwd


def build_block(
    units: list[Unit], n: int, ring: RingSpec, tp_bytes: int, granularity: str, chunks: int
) -> Block:
    """Lower ``units`` on a TP group of ``n`` local ranks into a block template."""
    tb = BulkBuilder()
    local = np.arange(n, dtype=np.int64)
    perm = np.asarray(ring.perm, dtype=np.int64)[None]  # (1, C, n)
    sizes = np.asarray(ring.sizes, dtype=np.int64)[None]
    head = last = tails = None
    marks: dict[object, np.ndarray] = {}
    tp_phase = PHASE_INDEX["tp"]
    lowered: dict[str, RingFlows] = {}  # every unit's collective of a kind has the same shape
    for u in units:
        ids = tb.add_ops(
            n,
            kind=KIND_COMPUTE,
            rank=local,
            duration_ns=u.duration_ns,
            flops=u.flops,
            phase=PHASE_INDEX[u.phase],
            layer_start=u.layer_start,
            layer_stop=u.layer_stop,
        )
        if head is None:
            head = ids
        else:
            assert last is not None
            tb.add_edges(last, ids)  # run order on each rank
            if tails is not None and tails.shape[1] and not np.array_equal(tails[:, 0], last):
                tb.add_edges(tails, ids[:, None])
        if u.mark is not None:
            marks[u.mark] = ids
        last = ids
        tails = ids[:, None]
        for kind in u.kinds if n > 1 else ():
            if kind not in lowered:
                lowered[kind] = ring_flows(local[None], perm, sizes, kind, granularity, chunks)
            rf = lowered[kind]
            coll = tb.add_collectives(
                1,
                kind=kind,
                phase=tp_phase,
                bytes=tp_bytes,
                ranks=ring.label,
                algorithm=ring.algorithm,
                channels=perm.shape[1],
                layer_start=u.layer_start,
                layer_stop=u.layer_stop,
            )
            fl = tb.add_ops(
                rf.size,
                kind=KIND_FLOW,
                rank=rf.src,
                dst=rf.dst,
                bytes=rf.nbytes,
                phase=tp_phase,
                layer_start=u.layer_start,
                layer_stop=u.layer_stop,
                collective=coll[0],
                step=rf.step,
                channel=rf.channel,
            )
            base = fl[0]
            tb.add_edges(rf.pred + base, rf.succ + base)
            start = rf.start[0] + base  # (C, n): first send of member m on channel c
            delay = dict(ring.delays).get(kind, 0)
            if delay > 0:  # NCCL latency and protocol cost: a timed barrier per member
                dl = tb.add_ops(n, kind=KIND_BARRIER, rank=local, duration_ns=delay,
                                phase=tp_phase, layer_start=u.layer_start,
                                layer_stop=u.layer_stop, collective=coll[0])
                tb.add_edges(tails, dl[:, None])
                tb.add_edges(dl[:, None], start.T)
            else:
                tb.add_edges(tails[:, :, None], start.T[:, None, :])
            tails = (rf.tails[0] + base).transpose(1, 0, 2).reshape(n, -1)  # (n, 2C)
    assert head is not None and last is not None and tails is not None
    return Block(template=tb.freeze(), head=head, last=last, tails=tails, marks=marks)
