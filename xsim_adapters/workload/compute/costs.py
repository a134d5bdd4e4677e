"""The compute model: FLOPs and durations of one stage's compute ops.

Model FLOPs per transformer layer and micro-batch on one rank of a TP group of size ``tp``
(b = micro_batch, s = seq_len, h = hidden, f = ffn_hidden, kv = kv_heads, hd = h / heads):

- attention block: QKV ``2bs*h*(h + 2*kv*hd)`` + out-projection ``2bs*h^2`` + scores and
  context ``4*b*s^2*h`` (halved with ``training.causal_attention_halving``), all / tp;
- MLP block: ``2bs*h*f*(3 if gated_mlp else 2)`` / tp.

Other attention shapes (``model.attention``: an explicit head width, MLA, sliding windows)
count as :func:`.passes.attention_block_flops` says; biases and sinks add no GEMM FLOPs.

These FLOPs (backward = 2x forward) are what the trace records for MFU. The *durations* come from
the operator-level model of :mod:`.kernels`: each block is the list of kernels a framework runs
(GEMMs at a shape-dependent rate, the attention core, the memory-bound operators), each
``max(FLOPs / achieved FLOP/s, bytes / achieved HBM B/s) + launch overhead`` at the peak of
``training.precision`` (docs/compute.md). A device type's profile CSV (columns ``tp,
micro_batch, seq_len, fwd_layer_us, bwd_layer_us``) wins where it has a matching row; the
measured layer time is split between the attention and MLP blocks in proportion to their FLOPs.

Parameter counts (layer, embedding, head) come from :mod:`xsim_adapters.plan.params`, so the
memory model, the optimizer step and the DP gradient bytes agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...plan.attention import attention_params, keys_per_query
from ...plan.model import DeviceType, ModelSpec, TrainingSpec
from ...plan.params import embedding_params, head_params, layer_params, span_params
from ...plan.sizes import tokens_per_microbatch
from .kernels import (
    KERNEL_LAUNCH_US,
    attention_kernels,
    embedding_kernels,
    head_kernels,
    make_ctx,
    mlp_kernels,
    unit_seconds,
)
from .passes import attention_block_flops

# Adam step traffic per parameter, bytes: it reads and writes 16 bytes of state per parameter
# (fp32 master weight, m and v = 12, plus the bf16 weight and gradient = 4): 2 x 16.
ADAM_BYTES_PER_PARAM = 32
# Gradient-norm clipping reads every fp32 gradient once more (Megatron clip_grad_norm_fp32);
# fp16 loss scaling adds one more read for the inf/nan check before the step.
GRAD_NORM_BYTES_PER_PARAM = 4
FP16_INF_CHECK_BYTES_PER_PARAM = 4


def mlp_params(model: ModelSpec) -> int:
    """Weights of one layer's MLP matrices, in parameters (3 matrices if gated, else 2)."""
    return model.hidden * model.ffn_hidden * (3 if model.gated_mlp else 2)


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one layer for one micro-batch on one TP rank, split by block."""

    attention: float
    mlp: float

    @property
    def total(self) -> float:
        return self.attention + self.mlp


def layer_flops(model: ModelSpec, training: TrainingSpec, tp: int,
                window: bool = False) -> LayerFlops:
    """Forward FLOPs per rank of one layer for one micro-batch (backward is 2x this);
    ``window``: a sliding-window layer (:func:`.passes.attention_block_flops`)."""
    b, s, h = training.micro_batch, model.seq_len, model.hidden
    bs = b * s
    qkv, proj, scores = attention_block_flops(model, training, window)
    mlp = 2.0 * bs * h * model.ffn_hidden * (3 if model.gated_mlp else 2)
    return LayerFlops(attention=(qkv + proj + scores) / tp, mlp=mlp / tp)


def compute_time_ns(flops: float, nbytes: float, device: DeviceType) -> int:
    """Plain roofline in ns at the bf16 best-GEMM rate: max(flops / sustained_tflops,
    bytes / (HBM * hbm_efficiency)). For callers without a kernel list (estimates, tests)."""
    t_compute = flops / (device.sustained_tflops * 1e12)
    t_memory = nbytes / (device.hbm_GBps * 1e9 * device.hbm_efficiency)
    return int(round(max(t_compute, t_memory) * 1e9))


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def profile_layer_us(
    device: DeviceType, tp: int, micro_batch: int, seq_len: int
) -> tuple[float, float] | None:
    """(fwd_layer_us, bwd_layer_us) from the device type's profile rows, or None if no row.

    The rows were read and checked by the plan loader (``DeviceType.profile_rows``); the first
    row matching (tp, micro_batch, seq_len) wins.
    """
    for row_tp, row_mb, row_seq, fwd_us, bwd_us in device.profile_rows:
        if (row_tp, row_mb, row_seq) == (tp, micro_batch, seq_len):
            return fwd_us, bwd_us
    return None


@dataclass(frozen=True)
class BlockCosts:
    """Durations (ns) and FLOPs per rank of one layer's blocks for one micro-batch."""

    attn_fwd_ns: int
    mlp_fwd_ns: int
    attn_bwd_ns: int
    mlp_bwd_ns: int
    attn_flops: float  # forward; backward is 2x
    mlp_flops: float
    profiled: bool


def layer_costs(
    model: ModelSpec, training: TrainingSpec, device: DeviceType, tp: int, window: bool = False
) -> BlockCosts:
    """Forward/backward durations of the attention and MLP blocks of one layer on ``device``
    (``window``: a sliding-window layer; a profile row applies to full-attention layers)."""
    fl = layer_flops(model, training, tp, window)
    prof = None if window else profile_layer_us(device, tp, training.micro_batch, model.seq_len)
    if prof is not None:
        share = fl.attention / fl.total
        fwd_ns, bwd_ns = prof[0] * 1e3, prof[1] * 1e3
        return BlockCosts(
            attn_fwd_ns=int(round(fwd_ns * share)),
            mlp_fwd_ns=int(round(fwd_ns * (1 - share))),
            attn_bwd_ns=int(round(bwd_ns * share)),
            mlp_bwd_ns=int(round(bwd_ns * (1 - share))),
            attn_flops=fl.attention,
            mlp_flops=fl.mlp,
            profiled=True,
        )
    c = make_ctx(model, training, device, tp, keys_per_query(model, window))
    return BlockCosts(
        attn_fwd_ns=_ns(unit_seconds(attention_kernels(c, False))),
        mlp_fwd_ns=_ns(unit_seconds(mlp_kernels(c, False))),
        attn_bwd_ns=_ns(unit_seconds(attention_kernels(c, True))),
        mlp_bwd_ns=_ns(unit_seconds(mlp_kernels(c, True))),
        attn_flops=fl.attention,
        mlp_flops=fl.mlp,
        profiled=False,
    )


def embedding_cost(
    model: ModelSpec, training: TrainingSpec, device: DeviceType, bwd: bool = False
) -> tuple[int, float]:
    """(ns, FLOPs) of the embedding lookup (``bwd``: its gradient scatter) for one micro-batch.

    Memory-bound (:func:`.kernels.embedding_kernels`); no FLOPs.
    """
    c = make_ctx(model, training, device, 1)
    return _ns(unit_seconds(embedding_kernels(c, bwd))), 0.0


def head_cost(
    model: ModelSpec, training: TrainingSpec, device: DeviceType, tp: int, bwd: bool = False
) -> tuple[int, float]:
    """(ns, model FLOPs) per rank of the final norm, logits GEMM and loss for one micro-batch.

    Model FLOPs are the logits GEMM's ``2*b*s*h*V / tp`` (forward; 2x for ``bwd``).
    """
    bs = tokens_per_microbatch(model, training.micro_batch)
    flops = 2.0 * bs * model.hidden * model.vocab / tp
    c = make_ctx(model, training, device, tp)
    return _ns(unit_seconds(head_kernels(c, bwd))), flops * (2 if bwd else 1)


def optimizer_time_ns(
    params_per_rank: float, device: DeviceType, training: TrainingSpec | None = None
) -> int:
    """Adam step over ``params_per_rank`` parameters: memory-bound over the owned state.

    Bytes per parameter: ADAM_BYTES_PER_PARAM + GRAD_NORM_BYTES_PER_PARAM (+ the fp16 inf check)
    at the achieved HBM bandwidth, plus one kernel launch.
    """
    per = ADAM_BYTES_PER_PARAM + GRAD_NORM_BYTES_PER_PARAM
    if training is not None and training.precision == "fp16":
        per += FP16_INF_CHECK_BYTES_PER_PARAM
    hbm = device.hbm_GBps * 1e9 * device.hbm_efficiency
    return _ns(params_per_rank * per / hbm + KERNEL_LAUNCH_US * 1e-6)


def stage_params(model: ModelSpec, layers: tuple[int, int]) -> int:
    """All parameters of a stage holding ``layers`` (embedding on layer 0, head on the last)."""
    p = span_params(model, layers)
    if layers[0] == 0:
        p += embedding_params(model)
    if layers[1] == model.layers:
        p += head_params(model)
    return p


__all__ = [
    "ADAM_BYTES_PER_PARAM",
    "GRAD_NORM_BYTES_PER_PARAM",
    "BlockCosts",
    "LayerFlops",
    "attention_params",
    "compute_time_ns",
    "embedding_cost",
    "embedding_params",
    "head_cost",
    "head_params",
    "layer_costs",
    "layer_flops",
    "layer_params",
    "mlp_params",
    "optimizer_time_ns",
    "profile_layer_us",
    "stage_params",
]
