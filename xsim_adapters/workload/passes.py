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

from ..plan.model import ModelSpec, TrainingSpec


def attention_core_flops(model: ModelSpec, training: TrainingSpec, tp: int) -> float:
    """Forward FLOPs per rank of one layer's attention core (scores and context) for one
    micro-batch: ``4*b*s^2*h / tp`` (halved with ``causal_attention_halving``), the s^2 term of
    :func:`~.compute.layer_flops`."""
    b, s, h = training.micro_batch, model.seq_len, model.hidden
    return 4.0 * b * s * s * h * (0.5 if training.causal_attention_halving else 1.0) / tp


def split_ns(total_ns: int, w_share: float) -> tuple[int, int]:
    """(B ns, W ns) of a backward of ``total_ns``: W = round(total * share), B the rest."""
    w = int(round(total_ns * w_share))
    return total_ns - w, w


def attention_wgrad_share(attn_flops: float, core_flops: float) -> float:
    """W share of the attention block's backward: weight GEMMs over 2x the block's forward."""
    return max(0.0, attn_flops - core_flops) / (2.0 * attn_flops) if attn_flops > 0 else 0.0


def gemm_shares(
    model: ModelSpec, training: TrainingSpec, tp: int
) -> dict[str, tuple[float, float]]:
    """Per block (``"attention"``, ``"mlp"``): the FLOP shares (first, last) of its first GEMM
    and its last GEMM, the ones TP communication overlaps with (Megatron-Core's TP overlap: the
    sequence-parallel all-gather pipelined with the GEMM it feeds, the reduce-scatter with the
    GEMM that produces it). Attention: QKV first, out-projection last (the core in between);
    MLP: up (and gate) first, down last. The same shares serve the backward (each GEMM's
    backward is 2x its forward, as the core's)."""
    b, s, h = training.micro_batch, model.seq_len, model.hidden
    bs = b * s
    qkv = 2.0 * bs * h * (h + 2 * model.kv_heads * model.head_dim) / tp
    proj = 2.0 * bs * h * h / tp
    attn = qkv + proj + attention_core_flops(model, training, tp)
    g = 3 if model.gated_mlp else 2
    return {"attention": (qkv / attn, proj / attn), "mlp": ((g - 1) / g, 1 / g)}


GEMM_WGRAD_SHARE = 0.5  # MLP and head: dX and dW GEMMs have equal FLOPs (see module docstring)


def selective_recompute_ns(attn_fwd_ns: int, attn_flops: float, core_flops: float) -> int:
    """Time of the attention core's forward again: the block's forward time x core/attn FLOPs."""
    return int(round(attn_fwd_ns * core_flops / attn_flops)) if attn_flops > 0 else 0
