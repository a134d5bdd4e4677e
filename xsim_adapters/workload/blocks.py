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
from functools import partial
from typing import Any

import numpy as np

from ..plan.attention import is_window_layer
from ..plan.model import DeviceType, ModelSpec, Plan, Stage, TrainingSpec
from ..trace.schema import KIND_COMPUTE, LAYER_EMBEDDING, PHASE_INDEX
from .builder import BulkBuilder, Template
from .comm.algorithms import lower
from .comm.collectives import RingFlows, ring_flows
from .comm.context import CPCosts, cp_costs, cp_mark, local_model
from .comm.emit import emit_lowered
from .comm.selection import Choice
from .compute.costs import BlockCosts, embedding_cost, head_cost, layer_costs
from .compute.kernels import microbatch_overhead_seconds
from .compute.moe_units import StageMoE
from .compute.passes import (
    GEMM_WGRAD_SHARE,
    attention_core_flops,
    attention_wgrad_share,
    gemm_shares,
    selective_recompute_ns,
    split_ns,
)

# SMs that Transformer Engine's TP communication takes from the GEMM it overlaps, per block
# and pass as (first GEMM, last GEMM) of the unit in run order; the median of the H100
# userbuffer configs shipped with NeMo-Framework-Launcher (f932a6ee, launcher_scripts/conf/
# training/tp_overlap/ub_cfg_h100_*.yaml). Forward: the all-gather feeding QKV / MLP-up runs
# as ring_exchange on copy engines (0 SMs); the reduce-scatter after the out-projection
# (proj_fprop, pipeline, num_sm 24) and after MLP-down (fc2_fprop, 16) keeps its SMs from the
# GEMM (set_sm_margin). Backward: proj / fc2 dgrad overlap a ring_exchange all-gather (0); the
# QKV and MLP-up dgrad + wgrad overlap bulk collectives (qkv 4 and 20 SMs: 12 over the pair,
# fc1 2 and 4: 3).
TP_OVERLAP_SMS: dict[str, tuple[int, int]] = {
    "attention_fwd": (0, 24),
    "mlp_fwd": (0, 16),
    "attention_bwd": (0, 12),
    "mlp_bwd": (0, 3),
}


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
    # The collective kind of this unit that moves MLA latents instead of hidden states (the
    # sequence-parallel all-gather ahead of an MLA attention block, its reduce-scatter in the
    # backward); lowered with ``RingSpec.latent``.
    latent: str | None = None
    # SMs the TP communication overlapped with the (first, last) GEMM occupies (TP overlap)
    comm_sms: tuple[int, int] = (0, 0)
    # a second key for the unit's first compute op: ``("bwd", layer)`` on a layer's (or, with
    # ``layer`` = model.layers, the head's) first backward op, where ZeRO-3's backward
    # parameter all-gather must have arrived
    gate: object = None


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
    # Kinds lowered by another algorithm than the ring: their Choice (workload.comm.selection)
    choices: tuple[tuple[str, Choice], ...] = ()
    # The same group's ring for the MLA latents (Unit.latent) and their bytes per micro-batch
    latent: RingSpec | None = None
    latent_bytes: int = 0


def tp_kinds(plan: Plan) -> tuple[str, ...]:
    """The collective kinds of a stage's TP ring."""
    return ("reduce_scatter", "all_gather") if plan.training.sequence_parallel else ("all_reduce",)


@dataclass(frozen=True)
class _Chunk:
    """What every unit of one model chunk of a stage is built from (:func:`stage_units`)."""

    model: ModelSpec  # with cp > 1 the rank's s/cp tokens
    training: TrainingSpec
    device: DeviceType
    tp: int
    cpc: CPCosts | None  # ring-attention step costs (cp > 1)
    tpk: tuple[str, ...]  # the TP collective kinds after a unit
    kinds: dict[bool, _AttentionKind]  # is-window-layer -> that attention kind's costs
    gather: str | None  # "all_gather" of MLA's latents under sequence parallelism, else None
    moe: StageMoE | None


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
    ``split_w`` (zero-bubble) [forward, B, W] (see :mod:`.compute.passes`).

    ``layers`` is the chunk's layer range (default: the stage's); ``first``/``last``: the chunk
    holds the embedding / the output head. Forward units carry marks ``("fwd", layer)`` and
    ``("fwd", "embedding")`` (where a parameter all-gather must have arrived); the unit after
    which a layer's weight gradient is complete carries the mark ``layer`` (``"embedding"``).
    ``moe``: the MoE layers' costs of this stage (:mod:`.compute.moe_units`); their MLP units
    are replaced by the MoE units, marked for the expert-parallel all-to-all.
    """
    model, training = plan.model, plan.training
    n = stage.tp
    cpc: CPCosts | None = None
    if stage.cp > 1:  # every cost on the rank's s/cp tokens; ring steps add the rest of the core
        model = local_model(model, stage.cp)
        cpc = cp_costs(model, training, device, n, stage.cp)
    a, b = stage.layers if layers is None else layers
    # Megatron-Core gathers MLA's latents, not the hidden state, ahead of its attention block
    mla_sp = (model.attention is not None and model.attention.mla is not None and n > 1
              and training.sequence_parallel)
    c = _Chunk(model, training, device, n, cpc, tp_kinds(plan),
               {w: _attention_kind(model, training, device, n, w)
                for w in {is_window_layer(model, x) for x in range(a, b)}},
               "all_gather" if mla_sp else None, moe)
    fwd = _forward_units(c, a, b, first, last)
    bwd = _forward_units(c, a, b, False, False, "recompute") if training.recompute == "full" \
        else []
    wgr: list[Unit] = []
    if last:
        ns, fl = head_cost(model, training, device, n, bwd=True)  # fl: backward (2x) FLOPs
        gate = ("bwd", model.layers)
        if split_w:
            hb, hw = split_ns(ns, GEMM_WGRAD_SHARE)
            bwd.append(Unit("bwd", model.layers, model.layers + 1, hb, fl / 2, c.tpk, gate=gate))
            wgr.append(Unit("wgrad", model.layers, model.layers + 1, hw, fl / 2, ()))
        else:
            bwd.append(Unit("bwd", model.layers, model.layers + 1, ns, fl, c.tpk, gate=gate))
    scatter = "reduce_scatter" if mla_sp else None  # the latents' gradients, backward
    for layer in range(b - 1, a - 1, -1):
        i0 = len(bwd)
        if split_w:
            _split_backward_units(c, layer, scatter, bwd, wgr)
        else:
            _backward_units(c, layer, scatter, bwd)
        if training.recompute != "full":  # with full recompute its recompute is first
            bwd[i0] = replace(bwd[i0], gate=("bwd", layer))
    if first:
        ns, fl = embedding_cost(model, training, device, bwd=True)
        (wgr if split_w else bwd).append(  # where weight gradients are complete
            Unit("wgrad" if split_w else "bwd", LAYER_EMBEDDING, LAYER_EMBEDDING + 1, ns, fl, (),
                 mark="embedding")
        )
    _add_microbatch_overhead(model, (fwd, bwd))
    return [fwd, bwd, wgr] if split_w else [fwd, bwd]


def _forward_units(c: _Chunk, a: int, b: int, first: bool, last: bool,
                   phase: str = "fwd") -> list[Unit]:
    """The forward of layers [a, b) (with the embedding if ``first``, the head if ``last``),
    or with ``phase="recompute"`` its full recompute (no marks)."""
    model, tpk, moe = c.model, c.tpk, c.moe
    fwd = phase == "fwd"
    units: list[Unit] = []
    if first:
        ns, fl = embedding_cost(model, c.training, c.device)
        units.append(Unit("fwd", LAYER_EMBEDDING, LAYER_EMBEDDING + 1, ns, fl, tpk,
                          ("fwd", "embedding"), latent=c.gather))
    for layer in range(a, b):
        k = c.kinds[is_window_layer(model, layer)]
        costs = k.costs
        nxt = None if layer == model.layers - 1 else c.gather  # it feeds the next attention
        i0 = len(units)
        if c.cpc is not None:
            units.extend(_cp_units(c.cpc, layer, phase, costs.attn_fwd_ns, costs.attn_flops,
                                   tpk))
        else:
            units.append(
                Unit(phase, layer, layer + 1, costs.attn_fwd_ns, costs.attn_flops, tpk,
                     ("fwd", layer) if fwd else None, k.ga,
                     comm_sms=TP_OVERLAP_SMS["attention_fwd"])
            )
        if not fwd:  # full recompute: the layer's parameters are needed from here on
            units[i0] = replace(units[i0], gate=("bwd", layer))
        if moe is not None and layer in moe.layers:
            units.extend(_moe_units(moe, layer, phase, tpk, nxt))
            continue
        units.append(Unit(phase, layer, layer + 1, costs.mlp_fwd_ns, costs.mlp_flops, tpk, None,
                          k.gm, nxt, TP_OVERLAP_SMS["mlp_fwd"]))
    if last:
        ns, fl = head_cost(model, c.training, c.device, c.tp)
        units.append(Unit("fwd", model.layers, model.layers + 1, ns, fl, ()))
    return units


def _backward_units(c: _Chunk, layer: int, scatter: str | None, bwd: list[Unit]) -> None:
    """Append the backward of ``layer`` (MLP, selective recompute, attention) to ``bwd``."""
    k = c.kinds[is_window_layer(c.model, layer)]
    costs, tpk = k.costs, c.tpk
    if c.moe is not None and layer in c.moe.layers:
        bwd.extend(_moe_units(c.moe, layer, "bwd", tpk))
    else:
        bwd.append(
            Unit("bwd", layer, layer + 1, costs.mlp_bwd_ns, 2 * costs.mlp_flops, tpk, None,
                 k.rm, comm_sms=TP_OVERLAP_SMS["mlp_bwd"])
        )
    if c.training.recompute == "selective":
        bwd.append(Unit("recompute", layer, layer + 1, k.sel_ns, k.core, ()))
    if c.cpc is not None:
        bwd.extend(_cp_units(c.cpc, layer, "bwd", costs.attn_bwd_ns, 2 * costs.attn_flops, tpk,
                             scatter))
        return
    bwd.append(
        Unit("bwd", layer, layer + 1, costs.attn_bwd_ns, 2 * costs.attn_flops, tpk, layer,
             k.ra, scatter, TP_OVERLAP_SMS["attention_bwd"])
    )


def _split_backward_units(c: _Chunk, layer: int, scatter: str | None, bwd: list[Unit],
                          wgr: list[Unit]) -> None:
    """Zero-bubble: append ``layer``'s B pass to ``bwd`` and its W pass to ``wgr``."""
    k = c.kinds[is_window_layer(c.model, layer)]
    costs, tpk = k.costs, c.tpk
    is_moe = c.moe is not None and layer in c.moe.layers
    if c.moe is not None and is_moe:  # the experts' W pass stays in B (not split)
        bwd.extend(_moe_units(c.moe, layer, "bwd", tpk))
    else:
        bwd.append(Unit("bwd", layer, layer + 1, k.mlp_b, costs.mlp_flops, tpk, None,
                        k.rm, comm_sms=TP_OVERLAP_SMS["mlp_bwd"]))
    if c.training.recompute == "selective":
        bwd.append(Unit("recompute", layer, layer + 1, k.sel_ns, k.core, ()))
    if c.cpc is not None:  # B: the ring's input gradients; the local GEMMs' W deferred
        bwd.extend(_cp_units(c.cpc, layer, "bwd", k.attn_b, costs.attn_flops + k.core,
                             tpk, scatter))
    else:
        bwd.append(
            Unit("bwd", layer, layer + 1, k.attn_b, costs.attn_flops + k.core, tpk, None,
                 k.ra, scatter, TP_OVERLAP_SMS["attention_bwd"])
        )
    mw, mfl = (0, 0.0) if is_moe else (k.mlp_w, costs.mlp_flops)
    wgr.append(
        Unit("wgrad", layer, layer + 1, mw + k.attn_w, mfl + k.attn_wfl, (), mark=layer)
    )


def _add_microbatch_overhead(model: ModelSpec, passes: tuple[list[Unit], ...]) -> None:
    """Framework overhead per micro-batch pass, on the pass's first layer op, in place.

    With interleaving every model chunk is its own forward/backward step call (Megatron's
    forward_step per chunk and micro-batch), so each chunk pays it. (On its first
    transformer-layer op, so a stage's embedding or head op stays its own.)"""
    extra = int(round(microbatch_overhead_seconds() * 1e9))
    for units in passes:
        i0 = next((i for i, u in enumerate(units) if 0 <= u.layer_start < model.layers), None)
        if i0 is not None:
            d = units[i0].duration_ns
            units[i0] = replace(units[i0], duration_ns=(
                d + extra if isinstance(d, int) else tuple(x + extra for x in d)))


@dataclass(frozen=True)
class _AttentionKind:
    """Costs of the layers of one attention kind (full, or sliding-window) on a stage."""

    costs: BlockCosts
    core: float  # forward FLOPs of the attention core per rank
    attn_b: int  # attention backward split into B and W (zero-bubble)
    attn_w: int
    attn_wfl: float  # its weight-gradient GEMM FLOPs
    mlp_b: int
    mlp_w: int
    ga: tuple[float, float]  # GEMM shares (first, last) of the attention block, forward
    gm: tuple[float, float]
    ra: tuple[float, float]  # the same, backward (GEMMs in reverse)
    rm: tuple[float, float]
    sel_ns: int  # selective recompute of the core


def _attention_kind(model: Any, training: Any, device: DeviceType, n: int,
                    window: bool) -> _AttentionKind:
    costs = layer_costs(model, training, device, n, window)
    core = attention_core_flops(model, training, n, window)
    attn_b, attn_w = split_ns(costs.attn_bwd_ns, attention_wgrad_share(costs.attn_flops, core))
    mlp_b, mlp_w = split_ns(costs.mlp_bwd_ns, GEMM_WGRAD_SHARE)
    shares = gemm_shares(model, training, n, window)
    ga, gm = shares["attention"], shares["mlp"]
    return _AttentionKind(
        costs, core, attn_b, attn_w, max(0.0, costs.attn_flops - core), mlp_b, mlp_w, ga, gm,
        ga[::-1], gm[::-1], selective_recompute_ns(costs.attn_fwd_ns, costs.attn_flops, core))


def _cp_units(cpc: CPCosts, layer: int, phase: str, attn_ns: int, attn_flops: float,
              tpk: tuple[str, ...], latent: str | None = None) -> list[Unit]:
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
                        cp_mark(layer, j, phase, cpc.cp),
                        latent=latent if j == cpc.cp - 1 else None))
    return out


def _moe_units(moe: StageMoE, layer: int, phase: str, tpk: tuple[str, ...],
               latent: str | None = None) -> list[Unit]:
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
        return [Unit(phase, *x, ns, fl, tpk, latent=latent)]
    mult = 2 if bwd else 1
    pre = Unit(phase, *x, c.pre_bwd_ns if bwd else c.pre_fwd_ns, c.pre_flops * mult, (),
               ("moe", layer, "pre", phase))
    exp = Unit(phase, *x, c.expert_bwd_ns if bwd else c.expert_fwd_ns,
               tuple(v * mult for v in c.expert_flops), (), ("moe", layer, "experts", phase))
    post = Unit(phase, *x, c.post_bwd_ns if bwd else c.post_fwd_ns, 0.0, (),
                ("moe", layer, "post", phase))
    return [post, exp, pre] if bwd else [pre, exp, post]


def _pieces(u: Unit, split: bool, sm_count: int = 0) -> list[tuple[Any, Any]]:
    """(ns, FLOPs) of the compute ops of ``u``: one, or with ``split`` its first GEMM, the middle
    and its last GEMM (durations by the unit's GEMM shares; they add up to the unit's). A split
    GEMM runs on the SMs its overlapped TP communication leaves (``u.comm_sms`` of
    ``sm_count``), so it takes ``sm_count / (sm_count - comm SMs)`` times longer."""
    if not split or u.gemms is None:
        return [(u.duration_ns, u.flops)]
    assert isinstance(u.duration_ns, int) and isinstance(u.flops, float | int)
    a, z = u.gemms
    d1 = int(round(u.duration_ns * a))
    # the two roundings may overshoot by 1 ns when the GEMMs are the whole unit (a + z = 1)
    d3 = min(int(round(u.duration_ns * z)), u.duration_ns - d1)
    mid = u.duration_ns - d1 - d3

    def slowed(ns: int, sms: int) -> int:
        return int(round(ns * sm_count / (sm_count - sms))) if 0 < sms < sm_count else ns

    return [
        (slowed(d1, u.comm_sms[0]), u.flops * a),
        (mid, u.flops * (1.0 - a - z)),
        (slowed(d3, u.comm_sms[1]), u.flops * z),
    ]


def _same_tags(tags: dict[str, Any], _ranks: np.ndarray, _inst: np.ndarray) -> dict[str, Any]:
    """The op tags of a TP collective's ops: one set for all (the template is per stage)."""
    return tags


def build_block(
    units: list[Unit],
    n: int,
    ring: RingSpec,
    tp_bytes: int,
    granularity: str,
    chunks: int,
    overlap_tp: bool = False,
    sm_count: int = 0,
) -> Block:
    """Lower ``units`` on a TP group of ``n`` local ranks into a block template.

    ``overlap_tp`` (``training.overlap.tp_comm``, sequence parallel): a unit with GEMM shares
    becomes three compute ops per rank, its first GEMM, the middle and its last GEMM. Its
    reduce-scatter starts after the middle, so it runs beside the last GEMM that produces it;
    the all-gather that follows runs beside the next unit's first GEMM, which waits only for
    the reduce-scatter; the next unit's middle waits for the all-gather (Megatron-Core's
    GEMM + reduce-scatter and all-gather + GEMM overlap, the chunk pipelining not resolved).
    The overlapped GEMMs lose the SMs the communication kernels take (:data:`TP_OVERLAP_SMS`
    of the device's ``sm_count``).
    """
    tb = BulkBuilder()
    local = np.arange(n, dtype=np.int64)
    head = last = None
    prev_tails: np.ndarray | None = None  # (n, k) last flows of the previous unit's collectives
    prev_early: np.ndarray | None = None  # the same for all but its last collective
    marks: dict[object, np.ndarray] = {}
    tp_phase = PHASE_INDEX["tp"]
    # every unit's collective of a kind (and width: hidden or MLA latents) has the same shape
    lowered: dict[tuple[str, bool], RingFlows] = {}
    for u in units:
        split = overlap_tp and n > 1 and u.gemms is not None and bool(u.kinds)
        pieces: list[np.ndarray] = []
        for ns, flops in _pieces(u, split, sm_count):
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
        if u.gate is not None:
            marks[u.gate] = pieces[0]
        if u.mark is not None:  # forward marks: where inputs must have arrived; others: done
            fwd_mark = isinstance(u.mark, tuple) and u.mark[0] == "fwd"
            marks[u.mark] = pieces[0] if fwd_mark else pieces[-1]
        tails = (pieces[1] if split else pieces[-1])[:, None]  # where the collectives start
        prev_tails = prev_early = None
        for kind in u.kinds if n > 1 else ():
            lat = kind == u.latent and ring.latent is not None
            rs = ring.latent if lat and ring.latent is not None else ring
            nbytes = ring.latent_bytes if lat else tp_bytes
            choice = dict(rs.choices).get(kind)
            key = (kind, lat)
            if key not in lowered:
                if choice is None:
                    lowered[key] = ring_flows(
                        local[None], np.asarray(rs.perm, dtype=np.int64)[None],
                        np.asarray(rs.sizes, dtype=np.int64)[None], kind, granularity, chunks)
                else:
                    assert choice.layout is not None
                    lowered[key] = lower(choice.algorithm, kind, choice.layout, nbytes,
                                         choice.channels, choice.chunks)
            rf = lowered[key]
            coll = dict(
                n=1, kind=kind, phase=tp_phase, bytes=nbytes, ranks=rs.label,
                algorithm=rs.algorithm if choice is None else choice.label,
                channels=len(rs.perm) if choice is None else choice.channels,
                layer_start=u.layer_start, layer_stop=u.layer_stop,
            )
            # NCCL latency and protocol cost: a start latency on each member's gate flows
            # (a timed barrier where a gate flow waits inside the collective)
            tags: dict[str, Any] = dict(phase=tp_phase, layer_start=u.layer_start,
                                        layer_stop=u.layer_stop)
            rtails, start = emit_lowered(tb, rf, local[None], dict(rs.delays).get(kind, 0), coll,
                                         partial(_same_tags, tags))
            # each member's gate flows (or barrier) wait for the member's compute
            tb.add_edges_valid(tails.T[:, None, :], start[0][None])
            prev_early = prev_tails
            tails = rtails[0].transpose(1, 0, 2).reshape(n, -1)  # (n, 2C)
            prev_tails = tails
    assert head is not None and last is not None
    tails = prev_tails if prev_tails is not None else last[:, None]
    return Block(template=tb.freeze(), head=head, last=last, tails=tails, marks=marks)
