"""Compute model against hand calculations, profile tables, and pipeline schedule orders."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers.gen import H100, TINY, make_plan

from xsim_adapters.errors import PlanError
from xsim_adapters.plan.model import ModelSpec, TrainingSpec
from xsim_adapters.plan.sections import read_profile
from xsim_adapters.trace.schema import KIND_COMPUTE, PHASE_INDEX
from xsim_adapters.workload import generate
from xsim_adapters.workload.compute.costs import (
    compute_time_ns,
    layer_costs,
    layer_flops,
    optimizer_time_ns,
)
from xsim_adapters.workload.schedule import stage_order

LLAMA7B = ModelSpec("llama2-7b", 32, 4096, 11008, 32, 32, 4096, 32000)


def test_layer_flops_by_hand() -> None:
    tr = TrainingSpec(global_batch=8, micro_batch=1)
    fl = layer_flops(LLAMA7B, tr, tp=1)
    # QKV 2*4096*4096*(4096+2*32*128) + out-proj 2*4096*4096^2 + scores 4*4096^2*4096
    assert fl.attention == 412_316_860_416 + 137_438_953_472 + 274_877_906_944
    assert fl.mlp == 2 * 4096 * 4096 * 11008 * 3 == 1_108_101_562_368
    half = layer_flops(LLAMA7B, replace(tr, causal_attention_halving=True), tp=4)
    assert half.attention == (412_316_860_416 + 137_438_953_472 + 137_438_953_472) / 4
    gpt = layer_flops(replace(LLAMA7B, gated_mlp=False, kv_heads=8), tr, tp=2)
    assert gpt.mlp == 2 * 4096 * 4096 * 11008 * 2 / 2
    assert gpt.attention == (2 * 4096 * 4096 * (4096 + 2 * 8 * 128) + 137_438_953_472 * 3) / 2


def test_one_layer_on_h100_is_its_kernels() -> None:
    """The attention block is the sum of its kernels + launch overhead (no SM count: no waves)."""
    from xsim_adapters.workload.compute.kernels import KERNEL_LAUNCH_US, attention_kernels, make_ctx

    tr = TrainingSpec(global_batch=8, micro_batch=1)
    c = layer_costs(LLAMA7B, tr, H100, tp=1)
    ks = attention_kernels(make_ctx(LLAMA7B, tr, H100, 1), False)
    assert [k.name for k in ks] == ["norm", "qkv", "rotary", "flash_fwd", "proj", "residual"]
    want = sum(k.seconds for k in ks) + len(ks) * KERNEL_LAUNCH_US * 1e-6
    assert c.attn_fwd_ns == round(want * 1e9)
    # the QKV GEMM by hand: 2*4096*4096*12288 FLOPs at 989e12 * 0.5 (compute-bound)
    qkv = next(k for k in ks if k.name == "qkv")
    assert qkv.seconds == pytest.approx(412_316_860_416 / 494.5e12)
    # norm by hand: read + write 4096 x 4096 bf16 at 3350 GB/s * 0.8
    norm = ks[0]
    assert norm.seconds == pytest.approx(2 * 4096 * 4096 * 2 / (3350e9 * 0.8))
    assert not c.profiled


def test_memory_bound_ops_use_hbm_bandwidth() -> None:
    # 3.35 GB at 3,350 GB/s x hbm_efficiency 0.8 = 1.25 ms
    assert compute_time_ns(1e6, 3.35e9, H100) == 1_250_000
    # Adam: 32 bytes per parameter + the 4-byte gradient-norm read, + one launch (0.5 us)
    assert optimizer_time_ns(1e9, H100) == round(36e9 / (3350e9 * 0.8) * 1e9 + 500)


def test_profile_row_wins_and_is_split_by_flops(tmp_path) -> None:
    csv = tmp_path / "h100.csv"
    csv.write_text("tp,micro_batch,seq_len,fwd_layer_us,bwd_layer_us\n1,1,4096,1000,2500\n")
    path, rows = read_profile(str(csv), "device_types.H100.profile", None)
    assert rows == ((1, 1, 4096, 1000.0, 2500.0),)
    dev = replace(H100, profile=path, profile_rows=rows)
    tr = TrainingSpec(global_batch=8, micro_batch=1)
    c = layer_costs(LLAMA7B, tr, dev, tp=1)
    share = 824_633_720_832 / (824_633_720_832 + 1_108_101_562_368)
    assert c.profiled
    assert c.attn_fwd_ns == round(1_000_000 * share)
    assert c.attn_fwd_ns + c.mlp_fwd_ns == 1_000_000
    assert c.attn_bwd_ns + c.mlp_bwd_ns == 2_500_000
    # no matching row (tp 2): the analytic model
    assert not layer_costs(LLAMA7B, tr, dev, tp=2).profiled
    # the generator reads no file: the parsed rows are used even once the file is gone
    csv.unlink()
    assert layer_costs(LLAMA7B, tr, dev, tp=1).profiled
    bad = tmp_path / "bad.csv"
    bad.write_text("tp,fwd_layer_us\n1,3\n")
    with pytest.raises(PlanError, match=r"device_types.H100.profile: .*missing micro_batch"):
        read_profile(str(bad), "device_types.H100.profile", None)


def test_1f1b_and_gpipe_orders() -> None:
    def names(o: np.ndarray) -> list[str]:
        return [("B" if b else "F") + str(m) for b, _, m in o]

    assert names(stage_order("1f1b", 0, 4, 6)) == ("F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5".split())
    assert names(stage_order("1f1b", 3, 4, 3)) == "F0 B0 F1 B1 F2 B2".split()
    assert names(stage_order("1f1b", 0, 8, 2)) == "F0 F1 B0 B1".split()  # warm-up capped at m
    assert names(stage_order("gpipe", 1, 4, 3)) == "F0 F1 F2 B0 B1 B2".split()
    with pytest.raises(PlanError, match="training.schedule"):
        stage_order("zb", 0, 2, 2)


def test_trace_compute_ops_carry_the_model() -> None:
    plan = make_plan([[("h100", 0, 2, 0, 2), ("h100", 2, 4, 2, 4)]], training={"recompute": True})
    trace = generate(plan)
    ops = trace.ops
    comp = ops[ops["kind"] == KIND_COMPUTE]
    c = layer_costs(TINY, plan.training, H100, tp=2)
    fwd1 = comp[(comp["phase"] == PHASE_INDEX["fwd"]) & (comp["layer_start"] == 1)]
    assert len(fwd1) == 2 * 2 * 4  # attention + MLP, 2 ranks, 4 micro-batches
    assert sorted(set(fwd1["duration_ns"])) == sorted({c.attn_fwd_ns, c.mlp_fwd_ns})
    assert sorted(set(fwd1["flops"])) == sorted({c.attn_flops, c.mlp_flops})
    bwd1 = comp[(comp["phase"] == PHASE_INDEX["bwd"]) & (comp["layer_start"] == 1)]
    assert sorted(set(bwd1["flops"])) == sorted({2 * c.attn_flops, 2 * c.mlp_flops})
    rec = comp[comp["phase"] == PHASE_INDEX["recompute"]]
    layer_fwd = comp[(comp["phase"] == PHASE_INDEX["fwd"]) & comp["layer_start"].between(0, 3)]
    assert len(rec) == len(layer_fwd)
    # embedding on the first stage only, head on the last only
    assert set(comp.loc[comp["layer_start"] == -2, "stage"]) == {0}
    assert set(comp.loc[comp["layer_start"] == TINY.layers, "stage"]) == {1}
    assert (comp["flops"] >= 0).all() and (comp["duration_ns"] > 0).all()
