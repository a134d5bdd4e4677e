"""The kernels a framework runs for one layer block, forward and backward, and their times.

Megatron-style transformer layer on one rank of a TP group of ``tp`` (b = micro-batch, s =
sequence, T = b*s tokens, h = hidden, f = ffn_hidden, hq / hkv = query / key-value heads,
hd = h / hq; Tr = T / tp for the norm/residual region under sequence parallelism, else T):

- attention block (MLA: :func:`_mla_kernels`; a sliding window shortens the core's keys per
  query, ``Ctx.kv_len``): norm, QKV GEMM [T, h] x [h, (hq + 2 hkv) hd / tp], rotary on Q and K
  (Llama conventions, ``model.gated_mlp``), the attention core (FlashAttention, or Megatron's
  unfused core: batched QK^T, fused scale-mask-softmax, dropout, batched PV), the output
  projection [T, hq hd / tp] x [hq hd / tp, h], and the residual add (with dropout: Megatron's
  fused bias-dropout-add);
- MLP block: norm, up GEMM [T, h] x [h, f / tp] (gate and up fused: 2 f / tp for SwiGLU), the
  activation (SwiGLU or bias-GELU), down GEMM [T, f / tp] x [f / tp, h], residual add.
- backward: each GEMM becomes two (input gradient ``dX = dY W^T`` and weight gradient
  ``dW = X^T dY``) plus the accumulation of ``dW`` into the parameter's gradient across
  micro-batches (PyTorch AccumulateGrad), each memory-bound op its backward (norm: x, dy -> dx;
  activation: inputs and dy -> dx; dropout: dy, mask -> dx), the flash core its backward kernel
  (2.5x the forward work, FA2/FA3 §4.1), the unfused core four batched GEMMs and the
  softmax/dropout backward.

Every kernel's time is the roofline of :mod:`.gemm` plus :data:`KERNEL_LAUNCH_US`; a unit (one
compute op of the trace) takes the sum of its kernels' times, but never less than the host time
to issue them (:data:`HOST_OP_US` per kernel: eager frameworks issue ops from Python, so a unit
of many tiny kernels is bound by the host, not the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import log2

from ...plan.model import DeviceType, ModelSpec, TrainingSpec
from ...plan.sizes import tokens_per_microbatch
from .gemm import Rates, gemm_seconds, tiled_quantization

# --- global constants (docs/compute.md lists every one with its source) ---------------------
# GPU-side cost per kernel beyond its roofline time: 3.4 us per graph-launched 2.9 us kernel on
# V100 (NVIDIA blog "Getting Started with CUDA Graphs", 2019) -> 0.5 us between kernels.
KERNEL_LAUNCH_US = 0.5
# Host time per framework op in eager PyTorch: ~280,000 ops/s on tiny tensors (horace.io
# brrr_intro), 3.6 us; consistent with 3.8 us per overlapped launch in the CUDA Graphs blog.
HOST_OP_US = 3.6
# Host ops per micro-batch pass outside the layers (batch fetch and broadcast, loss function,
# schedule bookkeeping). No public figure exists (gpu-calibration.md §8); an assumption.
MICROBATCH_HOST_OPS = 20
# FlashAttention: rates relative to the device's best GEMM, from FA2 on A100 (FA2 §4.1: forward
# up to 73%, backward up to 63% of the 312 TFLOP/s peak; A100 MAMF 86.9%): 0.73/0.869, 0.63/0.869.
FLASH_FWD_RATE = 0.84
FLASH_BWD_RATE = 0.725
FLASH_BWD_WORK = 2.5  # backward FLOPs / forward FLOPs (FA2, FA3 §4.1: recomputes S and P)
FLASH_BLOCK_Q = 128  # query rows per thread block (FA2), for wave quantization
# Hopper (compute capability 90): the fused attention Transformer Engine runs there (cuDNN) as
# measured on H100 SXM5, head dim 128, batch x sequence = 16k tokens, 16 heads (FlashAttention-3
# paper, Shah et al. 2024, Figs. 5 and 6, cuDNN bars; TFLOP/s with FLOPs counted causally for the
# causal forward). Used relative to the H100 SXM MAMF (HOPPER_ATTN_REF_TFLOPS), so a Hopper part
# scales them by its own best GEMM rate; interpolated in log2(sequence), clamped at the ends.
HOPPER_ATTN_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
HOPPER_FWD_TFLOPS = (497.0, 574.0, 617.0, 609.0, 600.0, 595.0)  # non-causal forward
HOPPER_FWD_CAUSAL_TFLOPS = (315.0, 410.0, 484.0, 518.0, 529.0, 539.0)  # causal forward
HOPPER_BWD_TFLOPS = (305.0, 408.0, 465.0, 499.0, 518.0, 516.0)  # non-causal backward
HOPPER_ATTN_REF_TFLOPS = 794.5  # H100 SXM bf16 MAMF (the device the curves were measured on)
# The FA3 paper's measurements lock the H100's SM clock at 1830 MHz (FA3 App. C.1): a part that
# sustains less under its power cap (DeviceType.sustained_clock_MHz) runs the curves slower.
HOPPER_ATTN_REF_CLOCK_MHZ = 1830.0
HOPPER_ATTN_REF_BLOCKS = 16 * 16384 // FLASH_BLOCK_Q  # thread blocks of the measured shape
DROPOUT_MASK_BYTES = 1  # one byte per element (PyTorch bool / uint8 mask)
FP32_BYTES = 4
FP8_BYTES = 1


@dataclass(frozen=True)
class Kernel:
    """One kernel of a unit: name, roofline seconds (no launch overhead), model FLOPs."""

    name: str
    seconds: float
    flops: float = 0.0


@dataclass(frozen=True)
class Ctx:
    """Everything the kernel lists need: shapes per rank and the device's rates."""

    model: ModelSpec
    training: TrainingSpec
    tp: int
    rates: Rates  # GEMM rate at the precision's peak
    attn_rates: Rates  # attention-core rate (16-bit peak for fp8 training)
    act_bytes: int  # bytes per activation element (2 mixed precision, 4 fp32/tf32)
    gemm_in_bytes: float  # bytes per GEMM operand element (1 for fp8)
    kv_len: int = 0  # keys per query at the attention core; 0: the sequence (a window: fewer)
    grad_bytes: int = 2  # bytes per element of the gradient buffer (training.grad_reduce_bytes)
    compute_capability: int = 0  # the device's (x 10): 90 picks the Hopper attention curves
    # The measured Hopper attention curves' TFLOP/s -> this device's: its best attention GEMM
    # over the H100 SXM MAMF, times its sustained clock over the curves' locked 1830 MHz
    attn_curve_scale: float = 1.0

    @property
    def tokens(self) -> int:
        return tokens_per_microbatch(self.model, self.training.micro_batch)

    @property
    def tokens_norm(self) -> float:
        """Tokens a rank normalizes and adds (split over TP under sequence parallelism)."""
        return self.tokens / self.tp if self.training.sequence_parallel else float(self.tokens)


def _peaks_tflops(device: DeviceType, precision: str) -> tuple[float, float]:
    """(GEMM peak, attention-core peak) in TFLOP/s of ``device`` at ``precision``: fp8 runs
    attention (and the bf16 output layer) at the 16-bit peak (Transformer Engine)."""
    peak = {
        "bf16": device.peak_tflops,
        "fp16": device.peak_tflops,
        "fp8": device.fp8_tflops,
        "tf32": device.tf32_tflops or device.fp32_tflops,
        "fp32": device.fp32_tflops,
    }[precision]
    if peak <= 0:  # only reachable for plans built without the loader's precision check
        raise ValueError(f"device type {device.name} has no {precision} peak")
    return peak, (device.peak_tflops if precision == "fp8" else peak)


def device_rates(device: DeviceType, training: TrainingSpec) -> tuple[Rates, Rates]:
    """(GEMM rates, attention-core rates) of ``device`` at ``training.precision``.

    bf16/fp16 use ``peak_tflops`` (parts without bf16 run bf16 plans as fp16 mixed precision);
    fp8 uses ``fp8_tflops`` x ``fp8_efficiency`` (``efficiency`` where unmeasured) for the
    GEMMs and the 16-bit peak for attention (and the bf16 output layer); tf32 uses
    ``tf32_tflops`` (or ``fp32_tflops`` where 0); fp32 uses ``fp32_tflops``. Both tensor-core
    rates are scaled by the device's ``sustained_clock_fraction`` (the efficiencies are short
    benchmarks at the burst clock; a training step runs at the power-capped clock); HBM
    bandwidth follows the memory clock, which SM clock capping leaves alone.
    """
    p = training.precision
    peak, attn_peak = _peaks_tflops(device, p)
    hbm = device.hbm_GBps * 1e9 * device.hbm_efficiency
    eff = (device.fp8_efficiency or device.efficiency) if p == "fp8" else device.efficiency
    clock = device.sustained_clock_fraction
    gemm = Rates(peak * 1e12 * eff * clock, hbm, device.sm_count)
    return gemm, Rates(attn_peak * 1e12 * device.efficiency * clock, hbm, device.sm_count)


def attention_curve_scale(device: DeviceType, training: TrainingSpec) -> float:
    """Factor from the measured Hopper attention curves (H100 SXM, clock locked at
    :data:`HOPPER_ATTN_REF_CLOCK_MHZ`) to ``device``: its best attention GEMM at the burst
    clock over the H100 SXM MAMF, times its sustained clock over the curves' (at most 1)."""
    attn_peak = _peaks_tflops(device, training.precision)[1]
    scale = attn_peak * device.efficiency / HOPPER_ATTN_REF_TFLOPS
    if device.sustained_clock_MHz > 0:
        scale *= min(1.0, device.sustained_clock_MHz / HOPPER_ATTN_REF_CLOCK_MHZ)
    return scale


def make_ctx(model: ModelSpec, training: TrainingSpec, device: DeviceType, tp: int,
             kv_len: int = 0) -> Ctx:
    """The kernel context of one stage (``tp`` ranks of ``device``); ``kv_len``: keys per query
    of a sliding-window layer (0: full attention)."""
    gemm, attn = device_rates(device, training)
    act = FP32_BYTES if training.precision in ("fp32", "tf32") else 2
    kv = kv_len if 0 < kv_len < model.seq_len else 0
    return Ctx(model, training, tp, gemm, attn, act, 1 if training.precision == "fp8" else act,
               kv, training.grad_reduce_bytes(model.dtype_bytes), device.compute_capability,
               attention_curve_scale(device, training))


# ---------------------------------------------------------------- building blocks


def _mem(name: str, nbytes: float, c: Ctx) -> Kernel:
    return Kernel(name, nbytes / c.rates.hbm_Bps)


def _gemm(
    name: str, m: int, n: int, k: int, c: Ctx, batch: int = 1, rates: Rates | None = None,
    extra_bytes: float = 0.0,
) -> Kernel:
    r = rates or c.rates
    e = c.gemm_in_bytes if rates is None else c.act_bytes
    return Kernel(name, gemm_seconds(m, n, k, batch, e, r, extra_bytes), 2.0 * m * n * k * batch)


def _linear_fwd(name: str, m: int, n: int, k: int, c: Ctx, norm_fused: bool = False
                ) -> list[Kernel]:
    """A linear layer's forward; with fp8 GEMMs also the FP8 cast of its input.

    Transformer Engine (transformer_engine/pytorch/module/{linear,layernorm_linear}.py): a
    ``Linear`` casts its input with ``fp8_cast_transpose_fused`` (read 2 bytes, write the fp8
    copy and its transpose for the weight gradient: 4 bytes per element); a
    ``LayerNormLinear`` (``norm_fused``: the QKV and MLP-up GEMMs) gets the fp8 copy from the
    norm kernel itself (:func:`_norm`) and only transposes it (read 1, write 1).
    """
    out = [_gemm(name, m, n, k, c)]
    if c.training.precision == "fp8":
        per = 2 * FP8_BYTES if norm_fused else c.act_bytes + 2 * FP8_BYTES
        out.append(_mem(name + "_cast", m * k * per, c))
    return out


def _linear_bwd(name: str, m: int, n: int, k: int, c: Ctx) -> list[Kernel]:
    """Input gradient [m, n] x [n, k] (with fp8: after the FP8 cast-transpose of the output
    gradient, read 2 bytes, write 1 + 1), weight gradient [k, m] x [m, n], and the accumulation
    of the weight gradient into the parameter's gradient buffer (g bytes per element, the
    gradient format) across micro-batches.

    With ``training.grad_accumulation_fusion`` (Megatron's default) the wgrad GEMM accumulates
    into the buffer itself (its output read and written in the gradient format: 2 g bytes per
    element instead of the 16-bit write); otherwise PyTorch's AccumulateGrad adds the GEMM's
    16-bit output into the buffer in a separate kernel (read both, write the buffer)."""
    g = c.grad_bytes
    out = []
    if c.training.precision == "fp8":  # TE: the output gradient cast to fp8 and transposed
        out.append(_mem(name + "_dy_cast", m * n * (c.act_bytes + 2 * FP8_BYTES), c))
    out.append(_gemm(name + "_dgrad", m, k, n, c))
    if c.training.grad_accumulation_fusion:
        out.append(_gemm(name + "_wgrad", k, n, m, c, extra_bytes=k * n * (2 * g - c.act_bytes)))
        return out
    return out + [
        _gemm(name + "_wgrad", k, n, m, c),
        _mem(name + "_grad_accum", k * n * (c.act_bytes + 2 * g), c),
    ]


def _norm(c: Ctx, bwd: bool) -> Kernel:
    """Norm forward (read x, write y; with fp8 GEMMs y is written in fp8 for the next
    LayerNormLinear GEMM) or backward (x, dy -> dx)."""
    h, e = c.model.hidden, c.act_bytes
    if bwd:
        return _mem("norm_bwd", c.tokens_norm * h * e * 3, c)
    out_bytes = FP8_BYTES if c.training.precision == "fp8" else e
    return _mem("norm", c.tokens_norm * h * (e + out_bytes), c)


def _residual(c: Ctx, bwd: bool) -> Kernel:
    """Residual add (fused bias-dropout-add with dropout) or its backward (dropout: dy, mask)."""
    n = c.tokens_norm * c.model.hidden
    e, mask = c.act_bytes, DROPOUT_MASK_BYTES if c.training.dropout else 0
    if bwd:
        return _mem("residual_bwd", n * (2 * e + mask) if mask else n * 3 * e, c)
    return _mem("residual", n * (3 * e + mask), c)


def _heads(c: Ctx) -> tuple[int, int, int]:
    m = c.model
    return m.heads // c.tp, m.kv_heads // c.tp if m.kv_heads >= c.tp else 1, m.head_dim


def _core_dims(c: Ctx) -> tuple[int, int, int, int]:
    """(query heads, key/value heads per rank, q/k width, v width) at the attention core."""
    hq, hkv, hd = _heads(c)
    a = c.model.attention
    if a is not None and a.mla is not None:  # after the up-projections every head has its K, V
        return hq, hq, a.mla.qk_head_dim, a.mla.v_head_dim
    return hq, hkv, hd, hd


def causal_work_fraction(s: int) -> float:
    """Share of the s x s score blocks a causal flash kernel computes: FlashAttention skips the
    key blocks entirely above the diagonal (FA2 §3.1, "Causal masking"), so with ``nb`` blocks
    of :data:`FLASH_BLOCK_Q` per side it computes nb (nb + 1) / 2 of the nb^2 blocks."""
    nb = -(-s // FLASH_BLOCK_Q)
    return (nb + 1) / (2 * nb)


def _curve(seq: int, values: tuple[float, ...]) -> float:
    """``values`` at ``seq`` on :data:`HOPPER_ATTN_SEQ`, linear in log2(seq), clamped."""
    x = log2(max(HOPPER_ATTN_SEQ[0], min(seq, HOPPER_ATTN_SEQ[-1])))
    xs = [log2(v) for v in HOPPER_ATTN_SEQ]
    k = min(len(xs) - 2, max(0, next((i for i in range(len(xs) - 1) if x <= xs[i + 1]), 0)))
    f = (x - xs[k]) / (xs[k + 1] - xs[k])
    return values[k] + f * (values[k + 1] - values[k])


def _hopper_rate_factor(c: Ctx, q: float) -> float:
    """FLOP/s per TFLOP/s of the measured Hopper curves on this device and shape: the device's
    :func:`attention_curve_scale` and the shape's wave quantization ``q`` over the measured
    shape's."""
    q_ref = tiled_quantization(HOPPER_ATTN_REF_BLOCKS, c.attn_rates.sm_count)
    return 1e12 * c.attn_curve_scale * (q / q_ref if q_ref > 0 else 1.0)


def _hopper_flash(c: Ctx, bwd: bool, full: float, fwd_flops: float, q: float, b: int, s: int,
                  dims: tuple[int, int, int, int]) -> Kernel:
    """Causal fused attention on Hopper from the measured cuDNN curves: the forward at the causal
    rate on the causal half of the square; the backward (2.5x the work) at the non-causal
    backward rate scaled by the forward's causal / non-causal ratio at the same length."""
    at = _hopper_rate_factor(c, q)  # TFLOP/s of the curves -> FLOP/s on this device and shape
    fwd_causal = _curve(s, HOPPER_FWD_CAUSAL_TFLOPS) * at
    if bwd:
        ratio = _curve(s, HOPPER_FWD_CAUSAL_TFLOPS) / _curve(s, HOPPER_FWD_TFLOPS)
        rate = _curve(s, HOPPER_BWD_TFLOPS) * ratio * at
        t = FLASH_BWD_WORK * 0.5 * full / rate
        return Kernel("flash_bwd", max(t, _flash_io(c, True, b, s, dims) / c.rates.hbm_Bps),
                      2 * fwd_flops)
    return Kernel("flash_fwd", max(0.5 * full / fwd_causal,
                                   _flash_io(c, False, b, s, dims) / c.rates.hbm_Bps), fwd_flops)


def _hopper_unmasked(c: Ctx, bwd: bool, work: float, fwd_flops: float, q: float, b: int,
                     s: int, dims: tuple[int, int, int, int]) -> Kernel:
    """``work`` FLOPs of unmasked score blocks on Hopper at the measured non-causal forward
    and backward rates (the backward does :data:`FLASH_BWD_WORK` x the forward's work)."""
    at = _hopper_rate_factor(c, q)
    if bwd:
        rate = _curve(s, HOPPER_BWD_TFLOPS) * at
        return Kernel("flash_bwd", max(FLASH_BWD_WORK * work / rate,
                                       _flash_io(c, True, b, s, dims) / c.rates.hbm_Bps),
                      2 * fwd_flops)
    rate = _curve(s, HOPPER_FWD_TFLOPS) * at
    return Kernel("flash_fwd", max(work / rate, _flash_io(c, False, b, s, dims) / c.rates.hbm_Bps),
                  fwd_flops)


def _flash_io(c: Ctx, bwd: bool, b: int, s: int, dims: tuple[int, int, int, int]) -> float:
    """HBM bytes of a flash kernel: forward q k v in, o out (and the fp32 softmax row
    statistics); backward q k v o do in, dq dk dv out, and o, do once more for the row sums."""
    hq, hkv, dqk, dv = dims
    e = c.act_bytes
    if bwd:
        return e * b * s * (2 * (hq + hkv) * dqk + 2 * hkv * dv + 3 * hq * dv)
    return e * b * s * ((hq + hkv) * dqk + (hkv + hq) * dv) + FP32_BYTES * b * hq * s


def _attention_core(c: Ctx, bwd: bool, unmasked: float = 0.0) -> list[Kernel]:
    """The attention core of one micro-batch: a flash kernel, or Megatron's unfused core.

    The trace's FLOPs are model FLOPs (4 b s^2 hd hq, halved only with
    ``causal_attention_halving``); the flash kernel's *time* follows the blocks it computes
    for a causal (decoder) model, :func:`causal_work_fraction` of the full square.
    ``unmasked`` > 0: the kernel computes that fraction of the s x s square with no mask
    (a load-balanced ring-attention step off the diagonal: half the square, Transformer
    Engine's causal CP), at the non-causal rate."""
    b, s = c.training.micro_batch, c.model.seq_len
    hq, hkv, dqk, dv = _core_dims(c)
    sk = c.kv_len or s  # keys per query: the sequence, or a sliding window
    d = 0.5 * (dqk + dv)  # mean of the two GEMMs' widths (= head_dim for standard attention)
    e = c.act_bytes
    causal = 0.5 if c.training.causal_attention_halving and not c.kv_len else 1.0
    if c.training.flash_attention:
        full = 4.0 * b * s * sk * d * hq  # every score block (a window: s x sk of them)
        fwd_flops = full * causal
        blocks = b * hq * -(-s // FLASH_BLOCK_Q)
        q = tiled_quantization(blocks, c.attn_rates.sm_count)
        dims = (hq, hkv, dqk, dv)
        if unmasked > 0 and c.compute_capability == 90:  # the measured non-causal curves
            return [_hopper_unmasked(c, bwd, unmasked * full, fwd_flops, q, b, s, dims)]
        if unmasked > 0:
            work = unmasked * full
        elif c.kv_len:  # a sliding window: the kernel computes the band of s x window blocks
            work = full
        elif c.compute_capability == 90:  # causal, from the measured Hopper curves
            return [_hopper_flash(c, bwd, full, fwd_flops, q, b, s, dims)]
        else:
            work = full * causal_work_fraction(s)
        if bwd:
            t = FLASH_BWD_WORK * work / (c.attn_rates.gemm_flops * FLASH_BWD_RATE * q)
            return [Kernel("flash_bwd", max(t, _flash_io(c, True, b, s, dims) / c.rates.hbm_Bps),
                           2 * fwd_flops)]
        t = work / (c.attn_rates.gemm_flops * FLASH_FWD_RATE * q)
        io = _flash_io(c, False, b, s, dims)
        return [Kernel("flash_fwd", max(t, io / c.rates.hbm_Bps), fwd_flops)]
    # Unfused core: the s x s scores of every head are materialized (causal masking does not
    # save work here: the fused softmax masks after QK^T).
    scores = b * hq * s * s
    mask = DROPOUT_MASK_BYTES if c.training.dropout else 0
    r = c.attn_rates
    if not bwd:
        out = [_gemm("qk", s, s, dqk, c, b * hq, r), _mem("softmax", scores * 2 * e, c)]
        if c.training.dropout:
            out.append(_mem("attn_dropout", scores * (2 * e + mask), c))
        out.append(_gemm("pv", s, dv, s, c, b * hq, r))
        return out
    out = [_gemm("pv_dgrad", s, s, dv, c, b * hq, r), _gemm("pv_wgrad", s, dv, s, c, b * hq, r)]
    if c.training.dropout:
        out.append(_mem("attn_dropout_bwd", scores * (2 * e + mask), c))
    out.append(_mem("softmax_bwd", scores * 3 * e, c))
    out += [_gemm("qk_dgrad", s, dqk, s, c, b * hq, r),
            _gemm("qk_wgrad", s, dqk, s, c, b * hq, r)]
    return out


# ---------------------------------------------------------------- layer units


def _mla_kernels(c: Ctx, bwd: bool) -> list[Kernel]:
    """Multi-head latent attention as Megatron-Core runs it: the down projections (and the
    latents' norms) duplicated on every TP rank over its own tokens (T / tp under sequence
    parallelism, else all T), the up projections column-parallel over the heads on all T
    tokens, rotary on the rope parts of Q (every head) and K (shared), the core, the
    row-parallel output projection."""
    m = c.model
    a = m.attention
    assert a is not None and a.mla is not None
    x = a.mla
    hq, _, dqk, dv = _core_dims(c)
    t, h, e = c.tokens, m.hidden, c.act_bytes
    tl = int(c.tokens_norm)  # tokens of the duplicated down projections
    kv_a = x.kv_lora_rank + x.qk_rope_head_dim
    up_kv = hq * (x.qk_nope_head_dim + dv)
    rotary = _mem("rotary", t * (hq + 1) * x.qk_rope_head_dim * 2 * e, c)
    if not bwd:
        q = ([*_linear_fwd("q_down", tl, x.q_lora_rank, h, c),
              _mem("q_norm", tl * x.q_lora_rank * e * 2, c),
              *_linear_fwd("q_up", t, hq * dqk, x.q_lora_rank, c)] if x.q_lora_rank
             else _linear_fwd("q_proj", t, hq * dqk, h, c))
        return [
            _norm(c, False), *q,
            *_linear_fwd("kv_down", tl, kv_a, h, c),
            _mem("kv_norm", tl * x.kv_lora_rank * e * 2, c),
            *_linear_fwd("kv_up", t, up_kv, x.kv_lora_rank, c),
            rotary, *_attention_core(c, False),
            *_linear_fwd("proj", t, h, hq * dv, c), _residual(c, False),
        ]
    q = ([*_linear_bwd("q_up", t, hq * dqk, x.q_lora_rank, c),
          _mem("q_norm_bwd", tl * x.q_lora_rank * e * 3, c),
          *_linear_bwd("q_down", tl, x.q_lora_rank, h, c)] if x.q_lora_rank
         else _linear_bwd("q_proj", t, hq * dqk, h, c))
    return [
        _residual(c, True), *_linear_bwd("proj", t, h, hq * dv, c),
        *_attention_core(c, True), rotary,
        *_linear_bwd("kv_up", t, up_kv, x.kv_lora_rank, c),
        _mem("kv_norm_bwd", tl * x.kv_lora_rank * e * 3, c),
        *_linear_bwd("kv_down", tl, kv_a, h, c), *q, _norm(c, True),
    ]


def attention_kernels(c: Ctx, bwd: bool) -> list[Kernel]:
    """Kernels of the attention block (forward, or backward in run order)."""
    m = c.model
    if m.attention is not None and m.attention.mla is not None:
        return _mla_kernels(c, bwd)
    hq, hkv, hd = _heads(c)
    t, h, e = c.tokens, m.hidden, c.act_bytes
    qkv_n = (hq + 2 * hkv) * hd
    rotary = [_mem("rotary", t * (hq + hkv) * hd * 2 * e, c)] if m.gated_mlp else []
    if not bwd:
        return [
            _norm(c, False),
            *_linear_fwd("qkv", t, qkv_n, h, c, norm_fused=True),
            *rotary,
            *_attention_core(c, False),
            *_linear_fwd("proj", t, h, hq * hd, c),
            _residual(c, False),
        ]
    return [
        _residual(c, True),
        *_linear_bwd("proj", t, h, hq * hd, c),
        *_attention_core(c, True),
        *rotary,
        *_linear_bwd("qkv", t, qkv_n, h, c),
        _norm(c, True),
    ]


def mlp_kernels(c: Ctx, bwd: bool) -> list[Kernel]:
    """Kernels of the MLP block (forward, or backward in run order)."""
    m = c.model
    t, h, e = c.tokens, m.hidden, c.act_bytes
    f = m.ffn_hidden // c.tp
    up_n = 2 * f if m.gated_mlp else f
    # SwiGLU reads gate and up, writes one; bias-GELU reads one, writes one. Backward reads the
    # forward inputs and dy and writes the input gradients.
    passes = (5 if m.gated_mlp else 3) if bwd else (3 if m.gated_mlp else 2)
    act = _mem("act_bwd" if bwd else "act", t * f * e * passes, c)
    if not bwd:
        return [
            _norm(c, False),
            *_linear_fwd("up", t, up_n, h, c, norm_fused=True),
            act,
            *_linear_fwd("down", t, h, f, c),
            _residual(c, False),
        ]
    return [
        _residual(c, True),
        *_linear_bwd("down", t, h, f, c),
        act,
        *_linear_bwd("up", t, up_n, h, c),
        _norm(c, True),
    ]


def embedding_kernels(c: Ctx, bwd: bool) -> list[Kernel]:
    """Embedding lookup (plus learned positions and dropout, GPT) or its gradient scatter-add."""
    n = c.tokens * c.model.hidden
    e = c.act_bytes
    gpt = not c.model.gated_mlp
    if bwd:  # read dy, read-modify-write the touched rows of the fp32 gradient
        return [_mem("embedding_bwd", n * (e + 2 * FP32_BYTES), c)] * (2 if gpt else 1)
    out = [_mem("embedding", n * 2 * e, c)]
    if gpt:
        out.append(_mem("position_add", n * 3 * e, c))
    if c.training.dropout:
        out.append(_mem("embedding_dropout", n * (2 * e + DROPOUT_MASK_BYTES), c))
    return out


def head_kernels(c: Ctx, bwd: bool) -> list[Kernel]:
    """Final norm, logits GEMM [T, h] x [h, V / tp] and Megatron-Core's vocab-parallel
    cross-entropy, unfused (``megatron/core/tensor_parallel/cross_entropy.py``, the default
    without ``cross_entropy_loss_fusion``): the logits cast to fp32, then max, subtract, exp,
    sum and divide passes over the fp32 copy (the softmax kept for backward); backward scales
    the softmax in place and casts the gradient back to 16 bits for the logits GEMMs.

    With fp8 training the head stays 16-bit: Megatron's output layer is its own
    ColumnParallelLinear, not a Transformer Engine module.
    """
    if c.training.precision == "fp8":
        c = replace(c, training=replace(c.training, precision="bf16"), rates=c.attn_rates,
                    gemm_in_bytes=c.act_bytes)
    t, h = c.tokens, c.model.hidden
    v = c.model.vocab / c.tp
    n = t * v  # logits per rank
    e, f = c.act_bytes, FP32_BYTES
    cast = e != f  # .float() copies 16-bit logits; fp32 logits are used in place
    if not bwd:
        ce = [_mem("ce_max", n * f, c), _mem("ce_sub", n * 2 * f, c),
              _mem("ce_exp", n * 2 * f, c), _mem("ce_sum", n * f, c),
              _mem("ce_div", n * 2 * f, c)]
        return [
            _norm(c, False),
            *_linear_fwd("logits", t, int(v), h, c),
            *([_mem("ce_cast", n * (e + f), c)] if cast else []),
            *ce,
        ]
    return [
        _mem("ce_grad", n * 2 * f, c),
        *([_mem("ce_grad_cast", n * (f + e), c)] if cast else []),
        *_linear_bwd("logits", t, int(v), h, c),
        _norm(c, True),
    ]


def unit_seconds(kernels: list[Kernel]) -> float:
    """A unit's time: sum of kernel rooflines + launch overhead, at least the host issue time."""
    gpu = sum(k.seconds for k in kernels) + len(kernels) * KERNEL_LAUNCH_US * 1e-6
    return max(gpu, len(kernels) * HOST_OP_US * 1e-6)


def microbatch_overhead_seconds() -> float:
    """Framework overhead of one micro-batch pass (forward or backward) of one stage."""
    return MICROBATCH_HOST_OPS * HOST_OP_US * 1e-6


__all__ = [
    "DROPOUT_MASK_BYTES",
    "FLASH_BWD_RATE",
    "FLASH_BWD_WORK",
    "FLASH_FWD_RATE",
    "HOST_OP_US",
    "KERNEL_LAUNCH_US",
    "MICROBATCH_HOST_OPS",
    "Ctx",
    "Kernel",
    "attention_kernels",
    "device_rates",
    "embedding_kernels",
    "head_kernels",
    "make_ctx",
    "microbatch_overhead_seconds",
    "mlp_kernels",
    "unit_seconds",
]
