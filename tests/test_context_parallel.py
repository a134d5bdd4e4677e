"""Context parallelism: K/V ring bytes, compute split, batch accounting, memory, plan errors."""

from __future__ import annotations

from typing import Any

import pytest

from xsim_adapters.api import generate, run
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.feasibility.memory import stage_memory
from xsim_adapters.trace.schema import KIND_COMPUTE, KIND_FLOW, PHASE_INDEX

S, H, HEADS, KV = 4096, 1024, 16, 4  # seq_len, hidden, heads, kv heads (GQA) of the test model


def cp_plan(cp: int = 4, tp: int = 2, dp: int = 4, **training: Any):
    return plan_from_dict({
        "name": "cp-test",
        "model": {"layers": 2, "hidden": H, "ffn_hidden": 4096, "heads": HEADS,
                  "kv_heads": KV, "seq_len": S, "vocab": 32000},
        "training": {"global_batch": 2 * dp // cp, "micro_batch": 1,
                     "sequence_parallel": tp > 1, **training},
        "device_groups": {"h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8}},
        "replicas": {"uniform": {"group": "h100", "tp": tp, "pp": 1, "dp": dp, "cp": cp}},
    })


@pytest.mark.parametrize(("cp", "tp", "dp"), [(4, 2, 4), (2, 1, 8), (8, 1, 8)])
def test_ring_bytes_per_layer_are_the_kv_size_times_cp_minus_one(cp, tp, dp):
    trace = generate(cp_plan(cp, tp, dp))
    kv = 2 * 1 * (S // cp) * max(1, KV // tp) * (H // HEADS) * 2  # K and V, bf16
    ops = trace.ops
    flows = ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX["cp"])]
    rings = trace.collectives[trace.collectives["kind"] == "cp_ring"]
    groups, mbs = dp // cp, 2
    assert len(rings) == 2 * 2 * mbs * groups  # layers x (fwd, bwd) x micro-batches x groups
    per = flows.groupby(["collective", "rank"])["bytes"].agg(["sum", "count"])
    assert (per["count"] == cp - 1).all()
    fwd_like = per["sum"] == kv * (cp - 1)  # forward: K/V once per step
    bwd_like = per["sum"] == 2 * kv * (cp - 1)  # backward: K/V and dK/dV
    assert (fwd_like | bwd_like).all()
    assert fwd_like.sum() == bwd_like.sum() == 2 * mbs * groups * cp * tp
    # every flow goes to the next CP rank at the same TP position (replica + 1 = rank + tp*1)
    nxt = flows["rank"] + tp
    ring_wrap = flows["rank"] % (cp * tp) + tp >= cp * tp
    nxt[ring_wrap] -= cp * tp
    assert (flows["dst"] == nxt).all()


def test_cp_ranks_compute_one_cpth_of_the_flops():
    dense, ctx = generate(cp_plan(1, 2, 4)), generate(cp_plan(4, 2, 4))
    def per_rank(trace):
        c = trace.ops[(trace.ops["kind"] == KIND_COMPUTE) & (trace.ops["phase"] == 0)]
        return c.groupby(["rank", "microbatch"])["flops"].sum().mean()
    assert per_rank(ctx) == pytest.approx(per_rank(dense) / 4, rel=1e-9)


def test_tokens_and_batch_split_per_cp_group():
    plan = cp_plan(2, 1, 8)
    assert [r.micro_batches for r in plan.replicas] == [2] * 8  # 8 sequences over 4 CP groups
    assert generate(plan).manifest["workload"]["tokens_per_iteration"] == 8 * S


def test_memory_per_rank_shrinks_with_cp():
    a = stage_memory(cp_plan(1, 2, 4, global_batch=8), 0, 0)
    b = stage_memory(cp_plan(4, 2, 4, global_batch=8), 0, 0)
    assert b.weights == a.weights
    assert b.activations == pytest.approx(a.activations / 4, rel=0.02)


def test_ring_exchange_shows_as_cp_communication():
    plan = cp_plan(4, 2, 4)
    from xsim_adapters.metrics.summary import summary
    trace = generate(plan)
    s = summary(trace, run(plan, trace=trace))
    assert s["phases_rank_ns"]["cp"] > 0


@pytest.mark.parametrize(("kw", "msg"), [
    ({"cp": 3, "tp": 1, "dp": 6}, r"cp: 2 x cp must divide model.seq_len 4096"),
    ({"cp": 8, "tp": 1, "dp": 4, "global_batch": 8}, r"cp: must divide the 4 replicas"),
])
def test_cp_plan_errors(kw, msg):
    with pytest.raises(PlanError, match=msg):
        cp_plan(**kw)


def test_tp_collectives_and_pipeline_sends_carry_the_local_chunk():
    plan = plan_from_dict({
        "name": "cp-pp",
        "model": {"layers": 4, "hidden": H, "ffn_hidden": 4096, "heads": HEADS, "kv_heads": KV,
                  "seq_len": S, "vocab": 32000},
        "training": {"global_batch": 4, "micro_batch": 1, "sequence_parallel": True},
        "device_groups": {"h100": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 8}},
        "replicas": {"uniform": {"group": "h100", "tp": 2, "pp": 2, "dp": 4, "cp": 2}},
    })
    trace = generate(plan)
    colls = trace.collectives
    local = 1 * (S // 2) * H * 2  # b x s/cp x h x bf16
    assert set(colls.loc[colls["kind"] == "reduce_scatter", "bytes"]) <= {local}
    pp = trace.ops[(trace.ops["kind"] == KIND_FLOW) & (trace.ops["phase"] == PHASE_INDEX["pp"])]
    assert pp.groupby(["collective"])["bytes"].sum().eq(local).all()
    assert run(plan, trace=trace).makespan_ns > 0


def test_a_ring_step_waits_for_its_own_send_as_well_as_its_receive():
    """Transformer Engine waits on both requests of a step's send/receive pair before the next
    step's attention core and before it forwards the chunk: every K/V flow is a predecessor of
    a compute op on its own sender and of one on its receiver, and of the sender's next send."""
    trace = generate(cp_plan(4, 1, 4))
    ops = trace.ops
    succ = trace.deps.groupby("pred")["succ"].apply(list)
    flows = ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX["cp"])]
    kind, rank = ops["kind"].to_numpy(), ops["rank"].to_numpy()
    for op_id, row in flows.iterrows():
        comp = {int(rank[s]) for s in succ[op_id] if kind[s] == KIND_COMPUTE}
        assert comp == {int(row["rank"]), int(row["dst"])}
        # the next step's send, on the sender and on the receiver (trace schema 2: its NCCL
        # latency is the flow's start latency, no barrier in between)
        nxt = [s for s in succ[op_id] if kind[s] == KIND_FLOW]
        assert {int(rank[s]) for s in nxt} == (
            set() if row["step"] == 2 else {int(row["rank"]), int(row["dst"])})
        assert all(ops.at[s, "step"] == row["step"] + 1 for s in nxt)


def _cp_pp_plan(schedule: str):
    return plan_from_dict({
        "name": "cp-zb",
        "model": {"layers": 4, "hidden": H, "ffn_hidden": 4096, "heads": HEADS, "kv_heads": KV,
                  "seq_len": S, "vocab": 32000},
        "training": {"global_batch": 8, "micro_batch": 1, "sequence_parallel": True,
                     "schedule": schedule},
        "device_groups": {"h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8}},
        "replicas": {"uniform": {"group": "h100", "tp": 2, "pp": 2, "dp": 2, "cp": 2}},
    })


def test_cp_with_zero_bubble_splits_only_the_local_weight_gradients():
    """ZB-H1 with CP: B is the ring attention's backward (all its steps and K/V/dK/dV flows),
    W the deferred weight gradients of the local GEMMs. Per rank and layer B + W equals the
    1F1B backward exactly, W carries the weight-GEMM FLOPs (attention without its core, and
    the MLP's half), the ring moves the same bytes, and the iteration is no longer."""
    from xsim_adapters.workload.compute.passes import attention_core_flops

    zb, base = _cp_pp_plan("zb_h1"), _cp_pp_plan("1f1b")
    tz, tb = generate(zb), generate(base)

    def per_layer(trace, phases):
        o = trace.ops
        c = o[(o["kind"] == KIND_COMPUTE) & o["phase"].isin([PHASE_INDEX[p] for p in phases])
              & (o["layer_start"] >= 0) & (o["layer_start"] < 4)]
        return c.groupby(["rank", "microbatch", "layer_start"])[["duration_ns", "flops"]].sum()

    b_w = per_layer(tz, ("bwd", "wgrad"))
    ref = per_layer(tb, ("bwd",))
    assert (b_w["duration_ns"] == ref["duration_ns"]).all()
    assert b_w["flops"].to_numpy() == pytest.approx(ref["flops"].to_numpy(), rel=1e-12)
    w = per_layer(tz, ("wgrad",))
    from xsim_adapters.workload.comm.context import local_model
    from xsim_adapters.workload.compute.costs import layer_flops

    local = local_model(zb.model, 2)
    fl = layer_flops(local, zb.training, 2)
    core = attention_core_flops(local, zb.training, 2)
    assert w["flops"].to_numpy() == pytest.approx(fl.attention - core + fl.mlp, rel=1e-12)

    def cp_bytes(trace):
        o = trace.ops
        return int(o.loc[(o["kind"] == KIND_FLOW) & (o["phase"] == PHASE_INDEX["cp"]),
                         "bytes"].sum())
    assert cp_bytes(tz) == cp_bytes(tb) > 0
    assert run(zb, trace=tz).makespan_ns <= run(base, trace=tb).makespan_ns


@pytest.mark.parametrize("device", ["H100-80GB", "A100-80GB"])
def test_an_off_diagonal_ring_step_computes_half_the_local_square_unmasked(device):
    """With causal load balancing a step after the first computes half of the local s/cp x
    s/cp score blocks with no mask: on Hopper at the measured non-causal FlashAttention rates
    (the forward, and 2.5x its work at the backward rate), elsewhere at the generic flash
    rates. Closed form: 0.5 x 4 s_l^2 hd heads FLOPs over the rate, plus one launch."""
    from xsim_adapters.plan.presets import device_presets
    from xsim_adapters.workload.comm.context import RING_STEP_BLOCKS, cp_costs, local_model
    from xsim_adapters.workload.compute import kernels as k

    cp = 2
    plan = cp_plan(cp, 1, 4)
    dt = device_presets()[device]
    local = local_model(plan.model, cp)
    costs = cp_costs(local, plan.training, dt, 1, cp)
    c = k.make_ctx(local, plan.training, dt, 1)
    s, hd = S // cp, H // HEADS
    work = RING_STEP_BLOCKS * 4.0 * s * s * hd * HEADS  # b = 1, tp = 1: every head
    q = k.tiled_quantization(HEADS * s // k.FLASH_BLOCK_Q, c.attn_rates.sm_count)
    if dt.compute_capability == 90:
        # the device's MAMF over the curves' H100 MAMF, at its sustained clock over the curves'
        # locked 1830 MHz (H100 SXM: 1768 MHz)
        scale = dt.peak_tflops * dt.efficiency / k.HOPPER_ATTN_REF_TFLOPS * min(
            1.0, dt.sustained_clock_MHz / k.HOPPER_ATTN_REF_CLOCK_MHZ)
        wave = q / k.tiled_quantization(k.HOPPER_ATTN_REF_BLOCKS, c.attn_rates.sm_count)
        fwd = k._curve(s, k.HOPPER_FWD_TFLOPS) * 1e12 * scale * wave
        bwd = k._curve(s, k.HOPPER_BWD_TFLOPS) * 1e12 * scale * wave
        # the causal diagonal block runs at the lower causal rate (2,048 tokens: 484 < 617)
        assert k._curve(s, k.HOPPER_FWD_CAUSAL_TFLOPS) < k._curve(s, k.HOPPER_FWD_TFLOPS)
    else:
        fwd = c.attn_rates.gemm_flops * k.FLASH_FWD_RATE * q
        bwd = c.attn_rates.gemm_flops * k.FLASH_BWD_RATE * q
    launch_ns = k.KERNEL_LAUNCH_US * 1e3
    assert costs.step_fwd_ns == pytest.approx(work / fwd * 1e9 + launch_ns, abs=1)
    assert costs.step_bwd_ns == pytest.approx(k.FLASH_BWD_WORK * work / bwd * 1e9 + launch_ns,
                                              abs=1)
