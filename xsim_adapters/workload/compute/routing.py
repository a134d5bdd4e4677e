"""MoE layers in the workload: expert placement, routing, all-to-all matrices, expert compute.

Per MoE layer and micro-batch, each EP rank routes its ``T`` tokens (``b*s/tp`` under sequence
parallelism, ``/cp`` more with context parallelism) to ``top_k`` experts each, i.e. ``T*k``
token-expert assignments. The assignment counts (EP member x expert, integers) come from
:func:`routing_counts`:

- ``balanced`` (default): every expert gets ``T*k/E`` of a member's assignments (largest
  remainder, the extra ones rotating over members so the totals stay balanced);
- ``zipf``: expert popularity ``p_e ~ 1 / rank_e^s`` (``s = model.moe.zipf_exponent``), where
  the ranks are a permutation of the experts drawn per layer from ``numpy.random.default_rng(
  [plan.seed, layer])``; ``p`` is capped at ``1/k`` (a token picks an expert at most once) with
  the excess spread over the others; each member sends its expected counts ``T*k*p``
  (largest remainder). Deterministic for a plan and seed; the same routing for every
  micro-batch (one representative step).
- ``capacity_factor`` ``c`` (optional): each member keeps at most ``ceil(c*T*k/E)`` assignments
  per expert and drops the rest (Megatron-Core drops at the source, before dispatch).

Dispatch bytes from member i to member j: the assignments of i routed to experts that j holds,
times ``hidden x dtype bytes``; combine sends the same matrix transposed. Experts are placed on
the EP group contiguously, equally (``placement: uniform``) or in proportion to each member's
device speed (``by_speed``; peak x efficiency, at least one expert each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ...plan.layout import apportion
from ...plan.model import DeviceType, ModelSpec, MoESpec, Plan, TrainingSpec
from ...plan.sizes import tokens_per_microbatch
from .kernels import Kernel, _gemm, _linear_bwd, _linear_fwd, _mem, make_ctx, unit_seconds

# Router probabilities and top-k indices written per token and expert (fp32): bytes per element.
ROUTER_PROB_BYTES = 4


def expert_counts(moe: MoESpec, speeds: list[float]) -> list[int]:
    """Experts held by each EP member (contiguous blocks in member order)."""
    n = len(speeds)
    if moe.placement == "uniform" or len(set(speeds)) == 1:
        return apportion(moe.num_experts, [1.0] * n)
    return apportion(moe.num_experts, speeds)


def owner_of_experts(counts: list[int]) -> np.ndarray:
    """(E,) the EP member holding each expert."""
    return np.repeat(np.arange(len(counts)), counts)


def _largest_remainder(total: int, p: np.ndarray, rotate: int) -> np.ndarray:
    """Integers summing to ``total`` proportional to ``p``; ties rotate with ``rotate``."""
    ideal = total * p
    out = np.floor(ideal).astype(np.int64)
    left = total - int(out.sum())
    if left > 0:
        frac = ideal - out
        order = np.lexsort(((np.arange(len(p)) - rotate) % len(p), -frac))
        out[order[:left]] += 1
    return out


def popularity(moe: MoESpec, layer: int, seed: int) -> np.ndarray:
    """(E,) the share of assignments each expert receives in ``layer`` (sums to 1, each share in
    [0, 1/k])."""
    e = moe.num_experts
    if moe.routing == "balanced":
        return np.full(e, 1.0 / e)
    rng = np.random.default_rng([seed, layer])
    rank = rng.permutation(e) + 1
    # In logs: 1 / rank^s overflows for large s (2^-1075 is 0, and the water-filling below then
    # divided 0 by 0); -s ln(rank) is finite for every exponent the plan accepts.
    return capped_shares(-moe.zipf_exponent * np.log(rank.astype(float)), 1.0 / moe.top_k)


def capped_shares(log_weights: np.ndarray, cap: float) -> np.ndarray:
    """Shares proportional to ``exp(log_weights)``, none above ``cap`` (water-filling: the
    heaviest are held at ``cap`` and the rest keep their proportions). Each free share is
    ``exp(w - logsumexp(free w))``, at most 1, so no weight over- or underflows into NaN."""
    n = len(log_weights)
    order = np.argsort(-log_weights, kind="stable")  # heaviest first
    w = np.maximum(log_weights[order], -np.finfo(float).max)  # -inf ties as the least weight
    out = np.zeros(n)
    for held in range(n + 1):  # the `held` heaviest at cap: the first count where the rest fit
        left = 1.0 - held * cap
        if left <= 0 or held == n:
            out[:held] = cap
            break
        rest = w[held:]
        top = rest[0]
        share = left * np.exp(rest - top) / np.exp(rest - top).sum()
        if share[0] <= cap * (1 + 1e-12):
            out[:held] = cap
            out[held:] = np.minimum(share, cap)  # rounding never lifts one above a token's one pick
            break
    shares = np.empty(n)
    shares[order] = out
    return shares


def routing_counts(moe: MoESpec, layer: int, tokens: int, members: int, seed: int) -> np.ndarray:
    """(members, E) token-expert assignments each EP member routes in ``layer`` (ints)."""
    p = popularity(moe, layer, seed)
    rows = [_largest_remainder(tokens * moe.top_k, p, j) for j in range(members)]
    counts = np.array(rows, dtype=np.int64)
    if moe.capacity_factor is not None:
        cap = math.ceil(moe.capacity_factor * tokens * moe.top_k / moe.num_experts)
        # no member routes more than its tokens to one expert, so a cap above them drops
        # nothing (and a huge factor's cap would not fit the int64 counts)
        counts = np.minimum(counts, min(cap, tokens))
    return counts


def alltoall_matrix(counts: np.ndarray, owner: np.ndarray, token_bytes: int) -> np.ndarray:
    """(members, members) dispatch bytes: member i's assignments to experts member j holds."""
    m = counts.shape[0]
    out = np.zeros((m, m), dtype=np.int64)
    for j in range(m):
        out[:, j] = counts[:, owner == j].sum(axis=1) * token_bytes
    return out


# ---------------------------------------------------------------- compute


def _ctx(model: ModelSpec, training: TrainingSpec, device: DeviceType, tokens: int, ffn: int,
         tp: int):  # type: ignore[no-untyped-def]
    m = replace(model, seq_len=max(1, tokens), ffn_hidden=ffn, moe=None)
    t = replace(training, micro_batch=1, sequence_parallel=False)
    return make_ctx(m, t, device, tp)


def _mlp(c, bwd: bool) -> list[Kernel]:  # type: ignore[no-untyped-def]
    """An expert MLP on ``c.tokens`` tokens: up (gate+up), activation, down; no norm/residual."""
    m = c.model
    t, h, e = c.tokens, m.hidden, c.act_bytes
    f = m.ffn_hidden // c.tp
    up_n = 2 * f if m.gated_mlp else f
    passes = (5 if m.gated_mlp else 3) if bwd else (3 if m.gated_mlp else 2)
    act = _mem("expert_act", t * f * e * passes, c)
    if bwd:
        return [*_linear_bwd("expert_down", t, h, f, c), act,
                *_linear_bwd("expert_up", t, up_n, h, c)]
    return [*_linear_fwd("expert_up", t, up_n, h, c), act, *_linear_fwd("expert_down", t, h, f, c)]


def experts_time_ns(plan: Plan, device: DeviceType, tokens: np.ndarray, tp: int,
                    bwd: bool) -> tuple[int, float]:
    """(ns, forward model FLOPs) of one rank's experts (grouped GEMM: one GEMM set per expert
    with its tokens) for ``tokens[e]`` tokens per local expert, each split ``tp`` ways."""
    moe = plan.model.moe
    assert moe is not None
    kernels: list[Kernel] = []
    flops = 0.0
    mult = 3 if plan.model.gated_mlp else 2
    for t in (int(x) for x in tokens):
        if t <= 0:
            continue
        c = _ctx(plan.model, plan.training, device, t, moe.expert_ffn_hidden, tp)
        kernels.extend(_mlp(c, bwd))
        flops += 2.0 * t * plan.model.hidden * moe.expert_ffn_hidden * mult / tp
    return (int(round(unit_seconds(kernels) * 1e9)) if kernels else 0), flops


@dataclass(frozen=True)
class MoESideCosts:
    """Durations (ns) and forward FLOPs per rank of the MoE layer around the experts."""

    pre_fwd_ns: int  # norm, router GEMM + top-k, shared experts, permute
    post_fwd_ns: int  # un-permute, weighted sum of the k outputs, residual
    pre_bwd_ns: int
    post_bwd_ns: int
    pre_flops: float


def side_costs(plan: Plan, device: DeviceType, tokens: int, tp: int) -> MoESideCosts:
    """Router, shared experts and (un)permutation on ``tokens`` local tokens (TP split ``tp``)."""
    moe = plan.model.moe
    assert moe is not None
    m = plan.model
    h, e_n, k = m.hidden, moe.num_experts, moe.top_k
    c = _ctx(m, plan.training, device, tokens, m.ffn_hidden, 1)
    e = c.act_bytes
    norm_f = _mem("norm", tokens * h * e * 2, c)
    norm_b = _mem("norm_bwd", tokens * h * e * 3, c)
    probs = tokens * e_n * ROUTER_PROB_BYTES * 2
    router_f = [_gemm("router", tokens, e_n, h, c), _mem("topk", probs, c)]
    router_b = [_gemm("router_dgrad", tokens, h, e_n, c), _gemm("router_wgrad", h, e_n, tokens, c),
                _mem("topk_bwd", probs, c)]
    permute = _mem("permute", tokens * k * h * e * 2, c)  # read one token copy, write k
    flops = 2.0 * tokens * h * e_n
    shared_f: list[Kernel] = []
    shared_b: list[Kernel] = []
    if moe.shared_experts:
        sc = _ctx(m, plan.training, device, tokens, moe.shared_ffn * moe.shared_experts, tp)
        shared_f, shared_b = _mlp(sc, False), _mlp(sc, True)
        flops += 2.0 * tokens * h * moe.shared_ffn * moe.shared_experts * (
            3 if m.gated_mlp else 2) / tp
    residual = _mem("residual", tokens * h * e * 3, c)
    ns = lambda ks: int(round(unit_seconds(ks) * 1e9))  # noqa: E731
    return MoESideCosts(
        pre_fwd_ns=ns([norm_f, *router_f, *shared_f, permute]),
        post_fwd_ns=ns([permute, residual]),
        pre_bwd_ns=ns([permute, *shared_b, *router_b, norm_b]),
        post_bwd_ns=ns([residual, permute]),
        pre_flops=flops,
    )


def local_tokens(plan: Plan, tp: int, cp: int = 1) -> int:
    """Tokens one rank routes per micro-batch: b*s, / tp under sequence parallelism, / cp."""
    t = tokens_per_microbatch(plan.model, plan.training.micro_batch, cp)
    return t // tp if plan.training.sequence_parallel else t
