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

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..plan.model import DeviceType, Plan, Stage
from ..trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, LAYER_EMBEDDING, PHASE_INDEX
from .algorithms import lower
from .builder import BulkBuilder, Template
from .collectives import RingFlows, ring_flows
from .compute import embedding_cost, head_cost, layer_costs
from .context import CPCosts, cp_costs, cp_mark, local_model
from .kernels import microbatch_overhead_seconds
from .latency import gate_latency, latency_members
from .moe_units import StageMoE
from .passes import (
    GEMM_WGRAD_SHARE,
    attention_core_flops,
    attention_wgrad_share,
    gemm_shares,
    selective_recompute_ns,
    split_ns,
)
from .selection import Choice


@dataclass(frozen=True)
class Unit:
    """One compute op per rank, then TP collectives of ``kinds`` (may be empty)."""

    phase: str
    layer_start: int
    layer_stop: int
    duration_ns: int | tuple[int, ...]  # a tuple: one duration per local rank (MoE experts)
    flops: float | tuple[float, ...]
    kinds: tuple[str, ...]
    mark: object = None  # key under which the compute ids are remembered (DP readiness)
    # (first, last) GEMM shares of the duration, for TP overlap (None: the unit is not split)
    gemms: tuple[float, float] | None = None


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
    # Kinds lowered by another algorithm than the ring: their Choice (workload.selection)
    choices: tuple[tuple[str, Choice], ...] = ()


def tp_kinds(plan: Plan) -> tuple[str, ...]:
    """The collective kinds of a stage's TP ring."""
    return ("reduce_scatter", "all_gather") if plan.training.sequence_parallel else ("all_reduce",)


def stage_units(
    plan: Plan,
    stage: Stage,
    device: DeviceType,
    first: bool,
    last: bool,
    layers: tuple[int, int] | None = None,
    split_w: bool = False,
    moe: StageMoE | None = None,
) -> list[list[Unit]]:
    """Units of one model chunk of a stage for one micro-batch: [forward, backward], or with
    ``split_w`` (zero-bubble) [forward, B, W] (see :mod:`.passes`).

    ``layers`` is the chunk's layer range (default: the stage's); ``first``/``last``: the chunk
    holds the embedding / the output head. Forward units carry marks ``("fwd", layer)`` and
    ``("fwd", "embedding")`` (where a parameter all-gather must have arrived); the unit after
    which a layer's weight gradient is complete carries the mark ``layer`` (``"embedding"``).
    ``moe``: the MoE layers' costs of this stage (:mod:`.moe_units`); their MLP units are
    replaced by the MoE units, marked for the expert-parallel all-to-all.
    """
    model, training = plan.model, plan.training
    n = stage.tp
    cpc: CPCosts | None = None
    if stage.cp > 1:  # every cost on the rank's s/cp tokens; ring steps add the rest of the core
        model = local_model(model, stage.cp)
        cpc = cp_costs(model, training, device, n, stage.cp)
    costs = layer_costs(model, training, device, n)
    core = attention_core_flops(model, training, n)
    tpk = tp_kinds(plan)
    a, b = stage.layers if layers is None else layers
    fwd: list[Unit] = []
    bwd: list[Unit] = []
    wgr: list[Unit] = []
    grads = wgr if split_w else bwd  # where weight gradients are complete
    attn_b, attn_w = split_ns(costs.attn_bwd_ns, attention_wgrad_share(costs.attn_flops, core))
    mlp_b, mlp_w = split_ns(costs.mlp_bwd_ns, GEMM_WGRAD_SHARE)
    attn_wfl = max(0.0, costs.attn_flops - core)  # weight-gradient GEMM FLOPs
    shares = gemm_shares(model, training, n)
    ga, gm = shares["attention"], shares["mlp"]
    ra, rm = ga[::-1], gm[::-1]  # backward runs a block's GEMMs in reverse
    if first:
        ns, fl = embedding_cost(model, training, device)
        emb = Unit("fwd", LAYER_EMBEDDING, LAYER_EMBEDDING + 1, ns, fl, tpk, ("fwd", "embedding"))
        fwd.append(emb)
    for layer in range(a, b):
        if cpc is not None:
            fwd.extend(_cp_units(cpc, layer, "fwd", costs.attn_fwd_ns, costs.attn_flops, tpk))
        else:
            fwd.append(
                Unit("fwd", layer, layer + 1, costs.attn_fwd_ns, costs.attn_flops, tpk,
                     ("fwd", layer), ga)
            )
        if moe is not None and layer in moe.layers:
            fwd.extend(_moe_units(moe, layer, "fwd", tpk))
            continue
        fwd.append(Unit("fwd", layer, layer + 1, costs.mlp_fwd_ns, costs.mlp_flops, tpk, None, gm))
    if last:
        ns, fl = head_cost(model, training, device, n)
        fwd.append(Unit("fwd", model.layers, model.layers + 1, ns, fl, ()))
    if training.recompute == "full":
        for layer in range(a, b):
            if cpc is not None:
                bwd.extend(_cp_units(cpc, layer, "recompute", costs.attn_fwd_ns,
                                     costs.attn_flops, tpk))
            else:
                bwd.append(
                    Unit("recompute", layer, layer + 1, costs.attn_fwd_ns, costs.attn_flops, tpk,
                         None, ga)
                )
            if moe is not None and layer in moe.layers:
                bwd.extend(_moe_units(moe, layer, "recompute", tpk))
                continue
            bwd.append(
                Unit("recompute", layer, layer + 1, costs.mlp_fwd_ns, costs.mlp_flops, tpk,
                     None, gm)
            )
    if last:
        ns, fl = head_cost(model, training, device, n, bwd=True)  # fl: backward (2x) FLOPs
        if split_w:
            hb, hw = split_ns(ns, GEMM_WGRAD_SHARE)
            bwd.append(Unit("bwd", model.layers, model.layers + 1, hb, fl / 2, tpk))
            wgr.append(Unit("wgrad", model.layers, model.layers + 1, hw, fl / 2, ()))
        else:
            bwd.append(Unit("bwd", model.layers, model.layers + 1, ns, fl, tpk))
    sel_ns = selective_recompute_ns(costs.attn_fwd_ns, costs.attn_flops, core)
    for layer in range(b - 1, a - 1, -1):
        is_moe = moe is not None and layer in moe.layers
        if split_w:
            if moe is not None and is_moe:  # the experts' W pass stays in B (not split)
                bwd.extend(_moe_units(moe, layer, "bwd", tpk))
            else:
                bwd.append(Unit("bwd", layer, layer + 1, mlp_b, costs.mlp_flops, tpk, None, rm))
            if training.recompute == "selective":
                bwd.append(Unit("recompute", layer, layer + 1, sel_ns, core, ()))
            bwd.append(
                Unit("bwd", layer, layer + 1, attn_b, costs.attn_flops + core, tpk, None, ra)
            )
            mw, mfl = (0, 0.0) if is_moe else (mlp_w, costs.mlp_flops)
            wgr.append(
                Unit("wgrad", layer, layer + 1, mw + attn_w, mfl + attn_wfl, (), mark=layer)
            )
            continue
        if moe is not None and is_moe:
            bwd.extend(_moe_units(moe, layer, "bwd", tpk))
        else:
            bwd.append(
                Unit("bwd", layer, layer + 1, costs.mlp_bwd_ns, 2 * costs.mlp_flops, tpk, None,
                     rm)
            )
        if training.recompute == "selective":
            bwd.append(Unit("recompute", layer, layer + 1, sel_ns, core, ()))
        if cpc is not None:
            bwd.extend(_cp_units(cpc, layer, "bwd", costs.attn_bwd_ns, 2 * costs.attn_flops, tpk))
            continue
        bwd.append(
            Unit("bwd", layer, layer + 1, costs.attn_bwd_ns, 2 * costs.attn_flops, tpk, layer, ra)
        )
    if first:
        ns, fl = embedding_cost(model, training, device, bwd=True)
        grads.append(
            Unit("wgrad" if split_w else "bwd", LAYER_EMBEDDING, LAYER_EMBEDDING + 1, ns, fl, (),
                 mark="embedding")
        )
    # Framework overhead per micro-batch pass, on the pass's first layer op. With interleaving
    # every model chunk is its own forward/backward step call (Megatron's forward_step per chunk
    # and micro-batch), so each chunk pays it.
    # (On its first transformer-layer op, so a stage's embedding or head op stays its own.)
    extra = int(round(microbatch_overhead_seconds() * 1e9))
    for units in (fwd, bwd):
        k = next((i for i, u in enumerate(units) if 0 <= u.layer_start < model.layers), None)
        if k is not None:
            d = units[k].duration_ns
            units[k] = replace(units[k], duration_ns=(
                d + extra if isinstance(d, int) else tuple(x + extra for x in d)))
    return [fwd, bwd, wgr] if split_w else [fwd, bwd]


def _cp_units(cpc: CPCosts, layer: int, phase: str, attn_ns: int, attn_flops: float,
              tpk: tuple[str, ...]) -> list[Unit]:
    """Ring attention of ``layer`` in ``phase``: the attention block on the local chunk, then
    cp - 1 core steps, step j on the K/V received in ring step j; the TP collectives after the
    last. Marks :func:`.context.cp_mark` (where the K/V flows attach)."""
    bwd = phase == "bwd"
    step_ns = cpc.step_bwd_ns if bwd else cpc.step_fwd_ns
    step_fl = cpc.step_flops * (2 if bwd else 1)
    x = layer, layer + 1
    out = [Unit(phase, *x, attn_ns, attn_flops, (), cp_mark(layer, 0, phase, cpc.cp))]
    for j in range(1, cpc.cp):
        out.append(Unit(phase, *x, step_ns, step_fl, tpk if j == cpc.cp - 1 else (),
                        cp_mark(layer, j, phase, cpc.cp)))
    return out


def _moe_units(moe: StageMoE, layer: int, phase: str, tpk: tuple[str, ...]) -> list[Unit]:
    """The units of MoE layer ``layer`` in pass ``phase`` (fwd, recompute or bwd).

    ``ep`` 1: one unit (router, shared and all experts TP-split) followed by the TP collectives
    of the MLP. ``ep`` > 1: pre (norm, router, shared experts, permute), experts, post
    (un-permute, combine, residual), no TP collective (the tokens stay sequence-parallel);
    marked ``("moe", layer, part, phase)`` where the all-to-all attaches (:mod:`.alltoall`):
    forward dispatch pre -> experts, combine experts -> post; backward the reverse.
    """
    c = moe.layers[layer]
    bwd = phase == "bwd"
    x = layer, layer + 1
    if moe.ep == 1:
        ns = c.pre_bwd_ns + c.post_bwd_ns + c.expert_bwd_ns[0] if bwd else (
            c.pre_fwd_ns + c.post_fwd_ns + c.expert_fwd_ns[0])
        fl = (c.pre_flops + c.expert_flops[0]) * (2 if bwd else 1)
        return [Unit(phase, *x, ns, fl, tpk)]
    mult = 2 if bwd else 1
    pre = Unit(phase, *x, c.pre_bwd_ns if bwd else c.pre_fwd_ns, c.pre_flops * mult, (),
               ("moe", layer, "pre", phase))
    exp = Unit(phase, *x, c.expert_bwd_ns if bwd else c.expert_fwd_ns,
               tuple(v * mult for v in c.expert_flops), (), ("moe", layer, "experts", phase))
    post = Unit(phase, *x, c.post_bwd_ns if bwd else c.post_fwd_ns, 0.0, (),
                ("moe", layer, "post", phase))
    return [post, exp, pre] if bwd else [pre, exp, post]


def _pieces(u: Unit, split: bool) -> list[tuple[Any, Any]]:
    """(ns, FLOPs) of the compute ops of ``u``: one, or with ``split`` its first GEMM, the middle
    and its last GEMM (durations by the unit's GEMM shares; they add up to the unit's)."""
    if not split or u.gemms is None:
        return [(u.duration_ns, u.flops)]
    assert isinstance(u.duration_ns, int) and isinstance(u.flops, float | int)
    a, z = u.gemms
    d1, d3 = int(round(u.duration_ns * a)), int(round(u.duration_ns * z))
    return [
        (d1, u.flops * a),
        (u.duration_ns - d1 - d3, u.flops * (1.0 - a - z)),
        (d3, u.flops * z),
    ]


def build_block(
    units: list[Unit],
    n: int,
    ring: RingSpec,
    tp_bytes: int,
    granularity: str,
    chunks: int,
    overlap_tp: bool = False,
) -> Block:
    """Lower ``units`` on a TP group of ``n`` local ranks into a block template.

    ``overlap_tp`` (``training.overlap.tp_comm``, sequence parallel): a unit with GEMM shares
    becomes three compute ops per rank, its first GEMM, the middle and its last GEMM. Its
    reduce-scatter starts after the middle, so it runs beside the last GEMM that produces it;
    the all-gather that follows runs beside the next unit's first GEMM, which waits only for
    the reduce-scatter; the next unit's middle waits for the all-gather (Megatron-Core's
    GEMM + reduce-scatter and all-gather + GEMM overlap, the chunk pipelining not resolved).
    """
    tb = BulkBuilder()
    local = np.arange(n, dtype=np.int64)
    perm = np.asarray(ring.perm, dtype=np.int64)[None]  # (1, C, n)
    sizes = np.asarray(ring.sizes, dtype=np.int64)[None]
    head = last = None
    prev_tails: np.ndarray | None = None  # (n, k) last flows of the previous unit's collectives
    prev_early: np.ndarray | None = None  # the same for all but its last collective
    marks: dict[object, np.ndarray] = {}
    tp_phase = PHASE_INDEX["tp"]
    lowered: dict[str, RingFlows] = {}  # every unit's collective of a kind has the same shape
    for u in units:
        split = overlap_tp and n > 1 and u.gemms is not None and bool(u.kinds)
        pieces: list[np.ndarray] = []
        for ns, flops in _pieces(u, split):
            ids = tb.add_ops(
                n,
                kind=KIND_COMPUTE,
                rank=local,
                duration_ns=np.asarray(ns, dtype=np.int64),
                flops=np.asarray(flops, dtype=np.float64),
                phase=PHASE_INDEX[u.phase],
                layer_start=u.layer_start,
                layer_stop=u.layer_stop,
            )
            if last is not None:
                tb.add_edges(last, ids)  # run order on each rank
            if not pieces and prev_tails is not None:  # data from the previous unit
                wait = prev_early if split and prev_early is not None else prev_tails
                tb.add_edges(wait, ids[:, None])
            if len(pieces) == 1 and split and prev_early is not None:
                assert prev_tails is not None
                tb.add_edges(prev_tails, ids[:, None])  # the middle needs the all-gather
            pieces.append(ids)
            last = ids
        if head is None:
            head = pieces[0]
        if u.mark is not None:  # forward marks: where inputs must have arrived; others: done
            fwd_mark = isinstance(u.mark, tuple) and u.mark[0] == "fwd"
            marks[u.mark] = pieces[0] if fwd_mark else pieces[-1]
        tails = (pieces[1] if split else pieces[-1])[:, None]  # where the collectives start
        prev_tails = prev_early = None
        for kind in u.kinds if n > 1 else ():
            choice = dict(ring.choices).get(kind)
            if kind not in lowered:
                if choice is None:
                    lowered[kind] = ring_flows(local[None], perm, sizes, kind, granularity,
                                               chunks)
                else:
                    assert choice.layout is not None
                    lowered[kind] = lower(choice.algorithm, kind, choice.layout, tp_bytes,
                                          choice.channels, choice.chunks)
            rf = lowered[kind]
            delay = dict(ring.delays).get(kind, 0)
            folded = latency_members(rf)[0] if delay > 0 else np.zeros(n, dtype=bool)
            coll = tb.add_collectives(
                1,
                kind=kind,
                phase=tp_phase,
                bytes=tp_bytes,
                ranks=ring.label,
                algorithm=ring.algorithm if choice is None else choice.label,
                channels=perm.shape[1] if choice is None else choice.channels,
                layer_start=u.layer_start,
                layer_stop=u.layer_stop,
            )
            fl = tb.add_ops(
                rf.size,
                kind=KIND_FLOW,
                rank=rf.src,
                dst=rf.dst,
                bytes=rf.nbytes,
                # NCCL latency and protocol cost: a start latency on each member's gate flows
                duration_ns=gate_latency(rf, delay, folded[None]) if delay > 0 else 0,
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
            if delay > 0:
                tb.add_edges(tails[folded][:, :, None], start.T[folded][:, None, :])
                slow = np.flatnonzero(~folded)  # gate flows that wait inside (a tree's inner)
                if len(slow):  # keep a timed barrier from the member's readiness
                    dl = tb.add_ops(len(slow), kind=KIND_BARRIER, rank=slow, duration_ns=delay,
                                    phase=tp_phase, layer_start=u.layer_start,
                                    layer_stop=u.layer_stop, collective=coll[0])
                    tb.add_edges(tails[slow], dl[:, None])
                    tb.add_edges(dl[:, None], start.T[slow])
            else:
                tb.add_edges(tails[:, :, None], start.T[:, None, :])
            prev_early = prev_tails
            tails = (rf.tails[0] + base).transpose(1, 0, 2).reshape(n, -1)  # (n, 2C)
            prev_tails = tails
    assert head is not None and last is not None
    tails = prev_tails if prev_tails is not None else last[:, None]
    return Block(template=tb.freeze(), head=head, last=last, tails=tails, marks=marks)
