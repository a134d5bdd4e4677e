"""How a layer's backward splits into B and W passes, and what selective recompute re-runs.

Both come from the compute model's FLOP counts (:func:`~.compute.layer_flops`), so they need
nothing from the user and follow whatever the compute model says a block costs:

- **B / W split** (zero-bubble schedules, Qi et al. 2023): a linear layer's backward is an
  input-gradient GEMM dX = dY·Wᵀ and a weight-gradient GEMM dW = Xᵀ·dY, each with the FLOPs of
  its forward GEMM. The attention core (QKᵀ, softmax, ·V) has no weights: its whole backward
  (2x its forward) is input gradient. So a block's W share of its backward is
  ``weight-GEMM forward FLOPs / backward FLOPs``: attention ``(attn - core) / (2*attn)``, MLP and
  output head ``1/2``; the embedding's gradient is all W. The block's backward *time* (from the
  compute model or a profile) is split in that ratio, so B + W is exactly the unsplit backward.
- **Selective recompute** (Korthikanti et al. 2022, Megatron's ``--recompute-granularity
  selective``): only the attention core's forward runs again, before the layer's backward; its
  time is the attention block's forward time times ``core / attn`` FLOPs.

``attention_core_flops`` is written here because the compute model has no function for the
attention core alone yet; when :mod:`.compute` gets one, this should call it (merge note).
"""

from __future__ import annotations

from ...plan.attention import attention_dims, is_standard, keys_per_query
from ...plan.model import ModelSpec, TrainingSpec


def attention_block_flops(model: ModelSpec, training: TrainingSpec,
                          window: bool = False) -> tuple[float, float, float]:
    """Forward FLOPs of one layer's attention block for one micro-batch, whole TP group:
    (projections into the core, output projection, core).

    Standard attention: QKV ``2bs*h*(hq*hd + 2*kv*hd)``, out ``2bs*hq*hd*h``, core
    ``4*b*s*s_k*hd*hq`` with s_k = s keys per query (halved with ``causal_attention_halving``)
    or, in a windowed layer, s_k = min(window, s) (a band: no halving). MLA: the down
    projections ``2bs*h*(q_lora + kv_lora + rope)``, the up projections ``2bs*(q_lora*H*
    (nope + rope) + kv_lora*H*(nope + v))`` (a direct ``2bs*h*H*(nope + rope)`` without a query
    latent), out ``2bs*H*v*h``, core ``2*b*s*s_k*H*(nope + rope + v)``."""
    b, s, h = training.micro_batch, model.seq_len, model.hidden
    bs = b * s
    a = model.attention
    if is_standard(model):  # the expressions as they were, bit for bit
        qkv = 2.0 * bs * h * (h + 2 * model.kv_heads * model.head_dim)
        proj = 2.0 * bs * h * h
        core = 4.0 * b * s * s * h * (0.5 if training.causal_attention_halving else 1.0)
        return qkv, proj, core
    hq, _, dqk, dv = attention_dims(model)
    if a is not None and a.mla is not None:
        x = a.mla
        q = x.q_lora_rank * (h + hq * dqk) if x.q_lora_rank else h * hq * dqk
        qkv = 2.0 * bs * (q + h * (x.kv_lora_rank + x.qk_rope_head_dim)
                          + x.kv_lora_rank * hq * (x.qk_nope_head_dim + dv))
    else:
        qkv = 2.0 * bs * h * (hq * dqk + 2 * model.kv_heads * dqk)
    proj = 2.0 * bs * hq * dv * h
    sk = keys_per_query(model, window)
    causal = 0.5 if training.causal_attention_halving and sk == s else 1.0
    core = 4.0 * b * s * sk * (0.5 * (dqk + dv)) * hq * causal
    return qkv, proj, core


def attention_core_flops(model: ModelSpec, training: TrainingSpec, tp: int,
                         window: bool = False) -> float:
    """Forward FLOPs per rank of one layer's attention core (scores and context) for one
    micro-batch: the core term of :func:`attention_block_flops` / tp (``4*b*s^2*h / tp`` for
    standard attention, halved with ``causal_attention_halving``)."""
    return attention_block_flops(model, training, window)[2] / tp


def split_ns(total_ns: int, w_share: float) -> tuple[int, int]:
    """(B ns, W ns) of a backward of ``total_ns``: W = round(total * share), B the rest."""
    w = int(round(total_ns * w_share))
    return total_ns - w, w


def attention_wgrad_share(attn_flops: float, core_flops: float) -> float:
    """W share of the attention block's backward: weight GEMMs over 2x the block's forward."""
    return max(0.0, attn_flops - core_flops) / (2.0 * attn_flops) if attn_flops > 0 else 0.0


def gemm_shares(
    model: ModelSpec, training: TrainingSpec, tp: int, window: bool = False
) -> dict[str, tuple[float, float]]:
    """Per block (``"attention"``, ``"mlp"``): the FLOP shares (first, last) of its first GEMM
    and its last GEMM, the ones TP communication overlaps with (Megatron-Core's TP overlap: the
    sequence-parallel all-gather pipelined with the GEMM it feeds, the reduce-scatter with the
    GEMM that produces it). Attention: QKV (with MLA: all its latent projections) first,
    out-projection last (the core in between); MLP: up (and gate) first, down last. The same
    shares serve the backward (each GEMM's backward is 2x its forward, as the core's)."""
    qkv, proj, core = (x / tp for x in attention_block_flops(model, training, window))
    attn = qkv + proj + core
    g = 3 if model.gated_mlp else 2
    return {"attention": (qkv / attn, proj / attn), "mlp": ((g - 1) / g, 1 / g)}


GEMM_WGRAD_SHARE = 0.5  # MLP and head: dX and dW GEMMs have equal FLOPs (see module docstring)


def selective_recompute_ns(attn_fwd_ns: int, attn_flops: float, core_flops: float) -> int:
    """Time of the attention core's forward again: the block's forward time x core/attn FLOPs."""
    return int(round(attn_fwd_ns * core_flops / attn_flops)) if attn_flops > 0 else 0
