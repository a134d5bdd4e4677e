"""Operator-level compute model: GEMM tile/wave quantization, kernel lists, precision peaks."""

from __future__ import annotations

import math
from dataclasses import replace
from math import ceil

import pytest
from helpers.gen import A100, H100

from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.model import ModelSpec, TrainingSpec
from xsim_adapters.plan.presets import device_presets
from xsim_adapters.workload.compute.costs import layer_costs, layer_flops
from xsim_adapters.workload.compute.gemm import Rates, gemm_quantization, gemm_seconds
from xsim_adapters.workload.compute.kernels import (
    HOST_OP_US,
    KERNEL_LAUNCH_US,
    attention_kernels,
    device_rates,
    make_ctx,
    mlp_kernels,
    unit_seconds,
)

A100_SM = replace(A100, sm_count=108)
GPT = ModelSpec("gpt", 24, 2304, 9216, 24, 24, 2048, 51200, "fp16", gated_mlp=False)
TR = TrainingSpec(global_batch=8, micro_batch=1)


def test_full_waves_reach_the_best_rate_and_a_tail_costs_a_wave() -> None:
    # 12 x 9 = 108 tiles of 256x128 on 108 SMs (MMGUIDE §3.2's A100 wave): one full wave
    assert gemm_quantization(256 * 12, 128 * 9, 4096, 1, 108) == (1.0, 1)
    # one more row of tiles: 117 tiles of 256x128 (108 + a 9-tile tail), 2 waves; 128x128
    # tiles give 26 x 9 = 234 tiles, 3 waves at 3/4 rate. The best of the two:
    m, n = 256 * 13, 128 * 9
    want = max(m * n / (2 * 108 * 256 * 128), m * n / (3 * 108 * 128 * 128) * 0.75)
    assert gemm_quantization(m, n, 4096, 1, 108)[0] == pytest.approx(want)
    # a partial tile pays a whole tile: 3073 rows need 13 row-tiles of 256, so a second wave
    q_pad = gemm_quantization(3073, 128 * 9, 4096, 1, 108)[0]
    assert q_pad < 0.6
    assert gemm_quantization(1000, 1000, 1000, 1, 0) == (1.0, 1)  # no SM count: no waves


def test_split_k_fills_the_sms_for_small_outputs() -> None:
    # 512 x 512 output = 4 tiles of 256x128 on 108 SMs; K = 16384 splits up to min(27, 64) = 27
    q, split = gemm_quantization(512, 512, 16384, 1, 108)
    assert split > 1
    assert q > 4 / 108  # better than 4 busy SMs out of 108
    assert q <= 1.0


def test_gemm_roofline_memory_bound_for_gemv() -> None:
    r = Rates(gemm_flops=312e12 * 0.869, hbm_Bps=2039e9 * 0.73, sm_count=108)
    m, n, k = 1, 8192, 8192  # a GEMV: always memory-bound (MMGUIDE §2)
    t = gemm_seconds(m, n, k, 1, 2, r)
    t_mem = 2 * (m * k + k * n + m * n) / r.hbm_Bps
    assert t_mem <= t == pytest.approx(t_mem, rel=0.01)  # + split-K's fp32 partials
    # a big square GEMM is compute-bound at exactly the best rate (full waves)
    t = gemm_seconds(256 * 108, 8192, 8192, 1, 2, r)
    assert t == pytest.approx(2 * 256 * 108 * 8192 * 8192 / r.gemm_flops)


def test_tp_splits_gemms_into_less_efficient_shapes() -> None:
    """Per-rank achieved TFLOP/s of a layer falls as TP shrinks the GEMMs."""
    def rate(tp: int) -> float:
        c = layer_costs(GPT, TR, A100_SM, tp)
        return (c.attn_flops + c.mlp_flops) / (c.attn_fwd_ns + c.mlp_fwd_ns) * 1e9

    rates = [rate(tp) for tp in (1, 2, 4, 8)]
    assert rates == sorted(rates, reverse=True)
    assert rates[-1] < 0.8 * rates[0]
    assert rates[0] < A100_SM.peak_tflops * 1e12 * A100_SM.efficiency  # never above the asymptote


def test_kernel_lists_are_gqa_and_swiglu_aware() -> None:
    llama = ModelSpec("l", 2, 4096, 14336, 32, 8, 2048, 32000)
    c = make_ctx(llama, TR, H100, 2)
    qkv = next(k for k in attention_kernels(c, False) if k.name == "qkv")
    assert qkv.flops == 2 * 2048 * 4096 * (16 + 2 * 4) * 128  # 16 q heads + 2x4 kv heads / rank
    up = next(k for k in mlp_kernels(c, False) if k.name == "up")
    assert up.flops == 2 * 2048 * 4096 * 2 * 14336 // 2  # gate and up fused, / tp
    # gradient accumulation fusion (the default): the wgrad GEMMs accumulate into the buffer
    names = [k.name for k in mlp_kernels(c, True)]
    assert names == ["residual_bwd", "down_dgrad", "down_wgrad", "act_bwd", "up_dgrad",
                     "up_wgrad", "norm_bwd"]  # fmt: skip
    # unfused (PyTorch AccumulateGrad): a separate add of the 16-bit wgrad output into the fp32
    # buffer (TrainingSpec's bf16 default: fp32 gradients): read 2 + 4, write 4 bytes
    cu = make_ctx(llama, replace(TR, grad_accumulation_fusion=False), H100, 2)
    names = [k.name for k in mlp_kernels(cu, True)]
    assert names == ["residual_bwd", "down_dgrad", "down_wgrad", "down_grad_accum", "act_bwd",
                     "up_dgrad", "up_wgrad", "up_grad_accum", "norm_bwd"]  # fmt: skip
    acc = next(k for k in mlp_kernels(cu, True) if k.name == "down_grad_accum")
    assert acc.seconds == pytest.approx((2 + 2 * 4) * 4096 * 7168 / c.rates.hbm_Bps)
    # GEMM model FLOPs of the kernels add up to the trace's layer FLOPs (less the attention core)
    fl = layer_flops(llama, TR, 2)
    gemm = sum(k.flops for k in mlp_kernels(c, False))
    assert gemm == fl.mlp


def test_unfused_attention_with_dropout_is_slower_than_flash() -> None:
    unfused = replace(TR, flash_attention=False, dropout=True)
    c1 = layer_costs(GPT, TR, A100_SM, 1)
    c2 = layer_costs(GPT, unfused, A100_SM, 1)
    assert c2.attn_fwd_ns > 1.2 * c1.attn_fwd_ns
    names = [k.name for k in attention_kernels(make_ctx(GPT, unfused, A100_SM, 1), False)]
    assert names == ["norm", "qkv", "qk", "softmax", "attn_dropout", "pv", "proj", "residual"]


def test_unit_time_is_kernels_plus_launches_or_the_host_floor() -> None:
    c = make_ctx(GPT, TR, A100_SM, 1)
    ks = attention_kernels(c, False)
    assert unit_seconds(ks) == pytest.approx(
        sum(k.seconds for k in ks) + len(ks) * KERNEL_LAUNCH_US * 1e-6
    )
    tiny = ModelSpec("t", 1, 64, 128, 1, 1, 8, 64)
    kt = attention_kernels(make_ctx(tiny, TR, A100_SM, 1), False)
    assert unit_seconds(kt) == pytest.approx(len(kt) * HOST_OP_US * 1e-6)  # host-bound


def test_precision_picks_the_peak() -> None:
    h100 = device_presets()["H100-80GB"]
    rates = {p: device_rates(h100, replace(TR, precision=p))[0].gemm_flops for p in
             ("bf16", "fp16", "fp8", "tf32", "fp32")}  # fmt: skip
    # the MAMF fractions were measured in bursts at the 1980 MHz boost clock; a training step
    # holds 1768 MHz at the 700 W cap (11.04 ms bursty vs 12.36 ms back to back, 16k^3 matmul)
    clock = 1768 / 1980
    assert h100.sustained_clock_fraction == pytest.approx(clock)
    assert 1980 * 11.04 / 12.36 == pytest.approx(h100.sustained_clock_MHz, abs=1.0)
    eff = h100.efficiency * 1e12 * clock
    # fp8 at its own measured best-shape fraction (MAMF H100 SXM fp8 1402.6 of 1979)
    assert h100.fp8_efficiency == pytest.approx(1402.6 / 1979, abs=5e-4)
    assert rates == pytest.approx(
        {"bf16": 989 * eff, "fp16": 989 * eff, "fp8": 1979 * h100.fp8_efficiency * 1e12 * clock,
         "tf32": 494.5 * eff, "fp32": 67 * eff}  # fmt: skip
    )
    # an fp8 part without an fp8 measurement runs fp8 at its bf16 fraction
    l40s = device_presets()["L40S"]
    assert l40s.fp8_efficiency == 0
    got = device_rates(l40s, replace(TR, precision="fp8"))[0].gemm_flops
    assert got == pytest.approx(733e12 * l40s.efficiency)
    # fp32 makes the layer GEMM-bound at the fp32 rate: far slower than bf16
    llama = ModelSpec("l", 2, 4096, 14336, 32, 8, 2048, 32000)
    fp32 = layer_costs(llama, replace(TR, precision="fp32"), h100, 1).mlp_fwd_ns
    bf16 = layer_costs(llama, TR, h100, 1).mlp_fwd_ns
    assert fp32 > 8 * bf16
    # V100 has no bf16: a bf16 plan runs at the fp16 tensor peak; tf32 falls back to fp32
    v100 = device_presets()["V100-32GB"]
    assert not v100.bf16
    assert device_rates(v100, TR)[0].gemm_flops == pytest.approx(125e12 * v100.efficiency)
    tf32 = device_rates(v100, replace(TR, precision="tf32"))[0].gemm_flops
    assert tf32 == pytest.approx(15.7e12 * v100.efficiency)


def _plan(device: str, precision: str) -> dict:
    return {
        "name": "p",
        "model": "tiny-gpt",
        "training": {"global_batch": 2, "micro_batch": 1, "precision": precision},
        "device_groups": {"g": {"type": device, "nodes": 1, "gpus_per_node": 1}},
        "replicas": {"uniform": {"group": "g", "tp": 1, "pp": 1, "dp": 1}},
    }


def test_precision_without_a_unit_is_a_plan_error() -> None:
    with pytest.raises(PlanError) as info:
        plan_from_dict(_plan("A100-80GB", "fp8"))
    assert str(info.value) == (
        "training.precision: fp8 needs device_types.A100-80GB.fp8_tflops > 0 "
        "(device type A100-80GB has none; got 'fp8')"
    )
    assert plan_from_dict(_plan("H100-80GB", "fp8")).training.precision == "fp8"
    with pytest.raises(PlanError, match=r"^training.precision: expected one of"):
        plan_from_dict(_plan("H100-80GB", "int4"))


def test_old_custom_type_fields_still_work() -> None:
    d = _plan("X1", "bf16")
    d["device_types"] = {
        "X1": {"peak_tflops": 100, "hbm_GB": 80, "hbm_GBps": 1000, "scaleup_GBps": 100,
               "nic_gbps": 100, "efficiency": 0.5}  # fmt: skip
    }
    x = plan_from_dict(d).device_types["X1"]
    assert (x.peak_tflops, x.efficiency, x.sm_count, x.hbm_efficiency) == (100, 0.5, 0, 0.8)
    d["device_types"]["X1"].update({"sm_count": 64, "fp8_tflops": 200, "hbm_efficiency": 0.9})
    x = plan_from_dict(d).device_types["X1"]
    assert (x.sm_count, x.fp8_tflops, x.hbm_efficiency) == (64, 200, 0.9)


def test_presets_carry_sourced_per_precision_specs() -> None:
    dev = device_presets()
    want = {"V100-32GB", "T4", "A10", "A30", "L4", "MI250X", "MI300X", "GH200", "RTX-2080-Ti",
            "RTX-3090", "RTX-4090", "H100-80GB", "B200"}  # fmt: skip
    assert want <= set(dev)
    for name, d in dev.items():
        assert d.source, name
        assert d.sm_count > 0, name
        assert 0 < d.efficiency <= 1 and 0 < d.hbm_efficiency <= 1, name
        assert d.fp32_tflops > 0 and d.fp32_tflops < d.peak_tflops, name
        if d.tf32_tflops:
            assert d.fp32_tflops <= d.tf32_tflops <= d.peak_tflops, name
        if d.fp8_tflops:
            assert d.fp8_tflops == pytest.approx(2 * d.peak_tflops, rel=0.02), name
    # spot checks against shared/reference/gpu-specs.csv
    assert (dev["H100-80GB"].peak_tflops, dev["H100-80GB"].fp8_tflops) == (989, 1979)
    assert (dev["RTX-4090"].peak_tflops, dev["RTX-4090"].sm_count) == (165.2, 128)
    assert dev["MI250X"].peak_tflops == 383 / 2  # one GCD
    assert [dev[n].bf16 for n in ("V100-32GB", "T4", "RTX-2080-Ti", "A100-80GB")] == [
        False, False, False, True]  # fmt: skip


def test_wave_count_formula_matches_mle_example() -> None:
    """MLE's Llama-3.1-8B up-projection: 8192 x 14336 output, 128x256 tile = 3584 blocks."""
    assert ceil(8192 / 128) * ceil(14336 / 256) == 3584
    # 25 waves on 148 SMs, 24 on 152 (as MLE states): our quantization is blocks/(waves*SMs)
    q148 = 3584 / (ceil(3584 / 148) * 148)
    q152 = 3584 / (ceil(3584 / 152) * 152)
    assert (ceil(3584 / 148), ceil(3584 / 152)) == (25, 24)
    assert q152 / q148 == pytest.approx(25 / 24 * 148 / 152)


@pytest.mark.parametrize("device", sorted(device_presets()))
def test_every_preset_generates_a_plan(device: str) -> None:
    """Each preset runs a small plan: positive durations, slower parts take longer."""
    from xsim_adapters.workload import generate

    d = _plan(device, "bf16")
    d["model"] = {"layers": 24, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "seq_len": 1024,
                  "vocab": 50257, "gated_mlp": False}  # GPT-2 medium (0.35 B): fits in 11 GB
    trace = generate(plan_from_dict(d))
    comp = trace.ops[trace.ops["kind"] == 0]
    assert (comp["duration_ns"] > 0).all()
    total = int(comp["duration_ns"].sum())
    if device == "T4":  # 65 TFLOP/s at 38%, 320 GB/s vs H100's 989 at 80%, 3350 GB/s
        h100 = generate(plan_from_dict(_plan("H100-80GB", "bf16") | {"model": d["model"]}))
        ch = h100.ops[h100.ops["kind"] == 0]
        assert total > 10 * int(ch["duration_ns"].sum())


def test_fp8_kernels_follow_transformer_engine() -> None:
    """fp8: LayerNormLinear GEMMs get the fp8 copy from the norm and only transpose it (read 1,
    write 1); Linear GEMMs cast-transpose their input (read 2, write 1 + 1); every backward
    cast-transposes the output gradient; the output layer stays bf16 at the 16-bit peak."""
    from xsim_adapters.workload.compute.kernels import head_kernels

    llama = ModelSpec("l", 2, 4096, 14336, 32, 8, 2048, 32000)
    tr8 = replace(TR, precision="fp8")
    h100 = device_presets()["H100-80GB"]
    c = make_ctx(llama, tr8, h100, 1)
    fwd = {k.name: k for k in mlp_kernels(c, False)}
    t, h, f = 2048, 4096, 14336
    assert fwd["norm"].seconds == pytest.approx(t * h * (2 + 1) / c.rates.hbm_Bps)
    assert fwd["up_cast"].seconds == pytest.approx(t * h * 2 / c.rates.hbm_Bps)
    assert fwd["down_cast"].seconds == pytest.approx(t * f * 4 / c.rates.hbm_Bps)
    bwd = {k.name: k for k in mlp_kernels(c, True)}
    assert bwd["down_dy_cast"].seconds == pytest.approx(t * h * 4 / c.rates.hbm_Bps)
    assert bwd["up_dy_cast"].seconds == pytest.approx(t * 2 * f * 4 / c.rates.hbm_Bps)
    # the head: the same kernels and times as a bf16 run (no fp8 cast, 16-bit peak)
    c16 = make_ctx(llama, TR, h100, 1)
    for bwd_pass in (False, True):
        h8, h16 = head_kernels(c, bwd_pass), head_kernels(c16, bwd_pass)
        assert [k.name for k in h8] == [k.name for k in h16]
        assert [k.seconds for k in h8] == pytest.approx([k.seconds for k in h16])



def test_causal_flash_kernel_computes_the_lower_triangle_of_blocks() -> None:
    """FA2 skips key blocks above the diagonal: (nb + 1) / (2 nb) of the square with nb blocks
    of 128; the trace still records model FLOPs (the full square)."""
    from xsim_adapters.workload.compute.kernels import FLASH_FWD_RATE, causal_work_fraction

    assert causal_work_fraction(4096) == pytest.approx(33 / 64)
    assert causal_work_fraction(128) == 1.0
    assert causal_work_fraction(1 << 20) == pytest.approx(0.5, abs=1e-4)
    llama = ModelSpec("l", 2, 4096, 14336, 32, 8, 4096, 32000)
    c = make_ctx(llama, TR, H100, 1)  # sm_count 0: no wave quantization
    (k,) = [k for k in attention_kernels(c, False) if k.name == "flash_fwd"]
    full = 4.0 * 4096 * 4096 * 128 * 32
    assert k.flops == full
    assert k.seconds == pytest.approx(full * 33 / 64 / (c.attn_rates.gemm_flops * FLASH_FWD_RATE))


def test_head_runs_megatrons_unfused_cross_entropy() -> None:
    """Megatron-Core's vocab-parallel cross-entropy: fp32 cast, max, subtract, exp, sum and
    divide passes (38 bytes per logit), backward scale and cast back (14 bytes per logit)."""
    from xsim_adapters.workload.compute.kernels import head_kernels

    llama = ModelSpec("l", 2, 4096, 14336, 32, 8, 4096, 128256)
    c = make_ctx(llama, TR, H100, 2)
    fwd, bwd = head_kernels(c, False), head_kernels(c, True)
    assert [k.name for k in fwd] == ["norm", "logits", "ce_cast", "ce_max", "ce_sub", "ce_exp",
                                     "ce_sum", "ce_div"]  # fmt: skip
    assert [k.name for k in bwd][:2] == ["ce_grad", "ce_grad_cast"]
    n = 4096 * 128256 / 2  # logits per rank (TP 2)
    ce_fwd = sum(k.seconds for k in fwd if k.name.startswith("ce_"))
    ce_bwd = sum(k.seconds for k in bwd if k.name.startswith("ce_"))
    assert ce_fwd == pytest.approx(n * 38 / c.rates.hbm_Bps)
    assert ce_bwd == pytest.approx(n * 14 / c.rates.hbm_Bps)
    # fp32 training: the logits are fp32 already, no cast passes
    c32 = make_ctx(llama, replace(TR, precision="fp32"), device_presets()["H100-80GB"], 2)
    assert "ce_cast" not in [k.name for k in head_kernels(c32, False)]


def test_hopper_attention_follows_the_measured_cudnn_curves() -> None:
    """Hopper (compute capability 90): the causal forward runs at the measured cuDNN causal rate
    on the causal half (518 TFLOP/s at 4k on the H100 SXM of the FA3 paper), the backward at the
    non-causal backward rate times the forward's causal / non-causal ratio; both scale with the
    part's best GEMM rate relative to the H100 SXM MAMF and its sustained clock relative to the
    curves' locked 1830 MHz, between the measured lengths in log2."""
    from xsim_adapters.workload.compute.gemm import tiled_quantization
    from xsim_adapters.workload.compute.kernels import (
        HOPPER_ATTN_REF_BLOCKS,
        HOPPER_ATTN_REF_TFLOPS,
        HOPPER_BWD_TFLOPS,
        HOPPER_FWD_CAUSAL_TFLOPS,
        HOPPER_FWD_TFLOPS,
        _curve,
    )

    assert _curve(4096, HOPPER_FWD_CAUSAL_TFLOPS) == 518.0
    assert _curve(3000, HOPPER_FWD_CAUSAL_TFLOPS) == pytest.approx(
        484 + (518 - 484) * (math.log2(3000) - 11), rel=1e-12)
    assert _curve(100, HOPPER_FWD_TFLOPS) == 497.0 and _curve(1 << 20, HOPPER_BWD_TFLOPS) == 516
    h100 = device_presets()["H100-80GB"]
    assert h100.compute_capability == 90
    llama = ModelSpec("l", 2, 4096, 14336, 32, 8, 4096, 32000)
    c = make_ctx(llama, TR, h100, 1)
    full = 4.0 * 4096 * 4096 * 128 * 32
    # the curves' H100 at its own MAMF, at the 1768 MHz it sustains instead of the locked 1830
    scale = 989 * h100.efficiency / HOPPER_ATTN_REF_TFLOPS * 1768 / 1830
    wave = tiled_quantization(32 * 32, 132) / tiled_quantization(HOPPER_ATTN_REF_BLOCKS, 132)
    (f,) = [k for k in attention_kernels(c, False) if k.name == "flash_fwd"]
    assert f.flops == full
    assert f.seconds == pytest.approx(0.5 * full / (518e12 * scale * wave))
    (bk,) = [k for k in attention_kernels(c, True) if k.name == "flash_bwd"]
    assert bk.seconds == pytest.approx(2.5 * 0.5 * full / (499e12 * 518 / 609 * scale * wave))


def test_sustained_clock_derates_tensor_cores_not_memory() -> None:
    """A part whose benchmarks ran at a burst clock above what it sustains at its power cap
    runs GEMMs and attention at the ratio of the two clocks; HBM-bound kernels do not move.
    Unmeasured parts (0) are not derated."""
    a100 = device_presets()["A100-80GB"]
    assert (a100.burst_clock_MHz, a100.sustained_clock_MHz) == (0, 0)
    assert a100.sustained_clock_fraction == 1.0
    assert a100.sustained_tflops == pytest.approx(312 * a100.efficiency)
    fast = replace(a100, burst_clock_MHz=1410.0, sustained_clock_MHz=1410.0)
    slow = replace(a100, burst_clock_MHz=1410.0, sustained_clock_MHz=1128.0)  # 0.8
    g_fast, a_fast = device_rates(fast, TR)
    g_slow, a_slow = device_rates(slow, TR)
    assert g_slow.gemm_flops == pytest.approx(0.8 * g_fast.gemm_flops)
    assert a_slow.gemm_flops == pytest.approx(0.8 * a_fast.gemm_flops)
    assert g_slow.hbm_Bps == g_fast.hbm_Bps
    # a big GEMM-bound MLP takes 1/0.8 as long in its GEMMs; its norm (HBM-bound) is unchanged
    big = ModelSpec("l", 2, 8192, 28672, 64, 8, 4096, 32000)
    kf = {k.name: k.seconds for k in mlp_kernels(make_ctx(big, TR, fast, 1), False)}
    ks = {k.name: k.seconds for k in mlp_kernels(make_ctx(big, TR, slow, 1), False)}
    assert ks["up"] == pytest.approx(kf["up"] / 0.8)
    assert ks["norm"] == kf["norm"]


def test_hopper_attention_curves_scale_by_the_clock_they_were_locked_at() -> None:
    """The FA3 curves were measured with the clock locked at 1830 MHz: an H100 sustaining 1768
    MHz runs them at 1768/1830 (its bf16 MAMF is the curves' reference, 794.5 = 989 x 0.803)."""
    from xsim_adapters.workload.compute.kernels import attention_curve_scale

    h100 = device_presets()["H100-80GB"]
    assert attention_curve_scale(h100, TR) == pytest.approx(989 * 0.803 / 794.5 * 1768 / 1830,
                                                            rel=1e-3)
    unclocked = replace(h100, burst_clock_MHz=0.0, sustained_clock_MHz=0.0)
    assert attention_curve_scale(unclocked, TR) == pytest.approx(989 * 0.803 / 794.5, rel=1e-3)
    # an fp8 plan runs attention at the 16-bit peak: the same scale
    assert attention_curve_scale(h100, replace(TR, precision="fp8")) == pytest.approx(
        attention_curve_scale(h100, TR))
