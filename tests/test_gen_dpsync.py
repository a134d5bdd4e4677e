"""DP gradient sync: the sweep line, multi-ring chunks, readiness and the optimizer barrier."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from helpers.gen import TINY, make_plan

from xsim_adapters.plan.model import OverlapSpec
from xsim_adapters.plan.params import embedding_params, head_params, layer_params
from xsim_adapters.trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload import generate
from xsim_adapters.workload.comm.dpsync import Segment, sweep_segments

MODEL32 = replace(TINY, layers=32)


def _example(**kw):
    # replica 0: TP 4 [0,20) + TP 4 [20,32); replica 1: TP 2 [0,18) + TP 6 [18,32)
    return make_plan(
        [
            [("h100", 0, 4, 0, 20), ("h100", 4, 8, 20, 32)],
            [("h100", 8, 10, 0, 18), ("h100", 10, 16, 18, 32)],
        ],
        model=MODEL32,
        micro_batches=[3, 2],
        **kw,
    )


def test_sweep_line_on_the_example() -> None:
    assert sweep_segments(_example()) == [
        Segment(0, 18, ((0, 0), (1, 0))),
        Segment(18, 20, ((0, 0), (1, 1))),
        Segment(20, 32, ((0, 1), (1, 1))),
    ]


def test_sweep_line_single_replica_and_identical_splits() -> None:
    plan = make_plan([[("h100", 0, 4, 0, 2), ("h100", 4, 8, 2, 4)]] * 1)
    assert sweep_segments(plan) == [Segment(0, 2, ((0, 0),)), Segment(2, 4, ((0, 1),))]
    assert generate(plan).ops["phase"].eq(PHASE_INDEX["dp"]).sum() == 0  # dp == 1: no sync


def _dp_collectives(trace) -> pd.DataFrame:
    c = trace.collectives
    return c[c["phase"] == PHASE_INDEX["dp"]]


@pytest.mark.parametrize("bucket_layers", [1, 4])
def test_every_layer_is_synchronized_exactly_once(bucket_layers: int) -> None:
    plan = _example(collectives={"dp_bucket_layers": bucket_layers})
    trace = generate(plan)
    dp = _dp_collectives(trace)
    # sum the chunk rings of each bucket: exactly the gradient bytes of its layers (bf16
    # parameters: fp32 gradients, Megatron-LM's rule for training.grad_reduce_dtype auto)
    per_bucket = dp.groupby(["layer_start", "layer_stop"])["bytes"].sum()
    covered = np.zeros(MODEL32.layers, dtype=int)
    for (lo, hi), nbytes in per_bucket.items():
        params = (hi - lo) * layer_params(MODEL32)
        params += embedding_params(MODEL32) if lo == 0 else 0
        params += head_params(MODEL32) if hi == MODEL32.layers else 0
        assert nbytes == params * 4, (lo, hi)
        covered[lo:hi] += 1
    assert covered.tolist() == [1] * MODEL32.layers
    assert all(hi - lo <= bucket_layers for lo, hi in per_bucket.index)
    # buckets never straddle a sync group
    for row in dp.itertuples():
        seg = sweep_segments(plan)[row.sync_group]
        assert seg.start <= row.layer_start < row.layer_stop <= seg.stop
    # every ring has one member per replica, and its flows carry 2(n-1)/n of the chunk
    flows = trace.flows()
    dpf = flows[flows["phase"] == PHASE_INDEX["dp"]]
    for coll, g in dpf.groupby("collective"):
        size = int(dp.loc[dp["collective"] == coll, "bytes"].iloc[0])
        sent = g.groupby("rank")["bytes"].sum()
        assert len(sent) == 2
        assert sent.tolist() == [size, size]  # 2(n-1)/n * S with n = 2


@pytest.mark.parametrize(("dtype", "grad_bytes"), [("auto", 4), ("bf16", 2), ("fp32", 4)])
def test_gradient_and_parameter_bytes_of_zero(dtype: str, grad_bytes: int) -> None:
    """ZeRO-1: the reduce-scatter moves the gradient format's bytes (auto: fp32 for bf16
    parameters), the all-gather of the updated parameters the model dtype's (bf16: 2)."""
    plan = _example(training={"zero_stage": 1, "grad_reduce_dtype": dtype})
    dp = _dp_collectives(generate(plan))
    total = layer_params(MODEL32) * MODEL32.layers + embedding_params(MODEL32) + head_params(
        MODEL32)
    by_kind = dp.groupby("kind")["bytes"].sum()
    assert set(by_kind.index) == {"reduce_scatter", "all_gather"}
    assert by_kind["reduce_scatter"] == total * grad_bytes
    assert by_kind["all_gather"] == total * 2
    # the fp16 path reduces fp16 gradients (Megatron-LM's fp16 optimizer)
    fp16 = _example(training={"zero_stage": 1, "precision": "fp16"})
    got = _dp_collectives(generate(fp16)).groupby("kind")["bytes"].sum()
    assert got["reduce_scatter"] == total * 2


def test_multi_ring_chunk_ownership() -> None:
    plan = _example()
    dp = _dp_collectives(generate(plan))
    seg1 = dp[dp["sync_group"] == 1]  # [18, 20): TP 4 (ranks 0-3) vs TP 6 (ranks 10-15)
    assert sorted(seg1["chunk"].unique().tolist()) == list(range(12))
    layer18 = seg1[seg1["layer_start"] == 18].sort_values("chunk")
    want = [sorted([0 + c * 4 // 12, 10 + c * 6 // 12]) for c in range(12)]
    assert [sorted(map(int, r.split(","))) for r in layer18["ranks"]] == want
    total = layer18["bytes"].sum()
    assert total == layer_params(MODEL32) * 4  # fp32 gradients
    seg0 = dp[(dp["sync_group"] == 0) & (dp["layer_start"] == 5)]
    assert len(seg0) == 4  # lcm(4, 2)


def test_sync_starts_after_last_backward_and_optimizer_waits_for_it() -> None:
    plan = _example()
    trace = generate(plan)
    ops, deps = trace.ops, trace.deps
    preds = deps.groupby("succ")["pred"].apply(list)
    dpf = ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX["dp"])]
    first = dpf[dpf["step"] == 0]
    last_mb = {0: 2, 1: 1}
    for op in first.itertuples():
        # the first send carries its rank's NCCL delay as a start latency and waits for the
        # backward directly
        assert op.duration_ns > 0
        pre = ops.loc[preds[op.op_id]]
        c = pre[pre["kind"] == KIND_COMPUTE]
        assert len(c) == 1
        c = c.iloc[0]
        assert c["rank"] == op.rank and c["phase"] == PHASE_INDEX["bwd"]
        assert c["microbatch"] == last_mb[op.replica]
        want_layer = -2 if op.layer_start == 0 else op.layer_start  # embedding last
        assert c["layer_start"] == want_layer
    # every rank's optimizer waits (via its barrier) for the last flows of all its rings
    barriers = ops[(ops["kind"] == KIND_BARRIER) & (ops["phase"] == PHASE_INDEX["optim"])]
    assert sorted(barriers["rank"].tolist()) == list(range(16))
    max_step = dpf.groupby("collective")["step"].transform("max")
    last = dpf[dpf["step"] == max_step]
    for b in barriers.itertuples():
        mine = last[(last["rank"] == b.rank) | (last["dst"] == b.rank)]
        assert set(mine["op_id"]) <= set(preds[b.op_id])
        rings = set(dpf.loc[dpf["rank"] == b.rank, "collective"])
        assert set(mine["collective"]) == rings
    optim = ops[(ops["kind"] == KIND_COMPUTE) & (ops["phase"] == PHASE_INDEX["optim"])]
    for o in optim.itertuples():
        assert any(ops.at[p, "kind"] == KIND_BARRIER for p in preds[o.op_id])


def test_zero_shards_the_sync_and_the_optimizer() -> None:
    plan = _example(
        training={"zero_stage": 1, "overlap": OverlapSpec(param_gather=False)}
    )
    trace = generate(plan)
    ops, dp = trace.ops, _dp_collectives(trace)
    assert sorted(dp["kind"].unique()) == ["all_gather", "reduce_scatter"]
    rs = dp[dp["kind"] == "reduce_scatter"].drop(columns=["collective", "kind"])
    ag = dp[dp["kind"] == "all_gather"].drop(columns=["collective", "kind"])
    # the same rings; the all-gather moves bf16 parameters, the reduce-scatter fp32 gradients
    # (chunk cut points are integer divisions of each: a chunk may differ by a byte)
    assert np.abs(rs["bytes"].to_numpy() - 2 * ag["bytes"].to_numpy()).max() <= 2
    assert rs["bytes"].sum() == 2 * ag["bytes"].sum()
    pd.testing.assert_frame_equal(rs.drop(columns=["bytes"]).reset_index(drop=True),
                                  ag.drop(columns=["bytes"]).reset_index(drop=True))
    preds = trace.deps.groupby("succ")["pred"].apply(list)
    optim = ops[(ops["kind"] == KIND_COMPUTE) & (ops["phase"] == PHASE_INDEX["optim"])]
    optim_by_rank = dict(zip(optim["rank"], optim["op_id"], strict=True))
    ag_ids = set(dp.loc[dp["kind"] == "all_gather", "collective"])
    first_ag = ops[ops["collective"].isin(ag_ids) & (ops["step"] == 0)]
    for op in first_ag.itertuples():
        assert optim_by_rank[op.rank] in preds[op.op_id]  # the delay rides on the flow
    # the optimizer steps over 1/dp of the stage: replica 0 stage 0 (TP 4, layers 0-20, embedding)
    from xsim_adapters.workload.compute.costs import optimizer_time_ns, stage_params

    want = optimizer_time_ns(stage_params(MODEL32, (0, 20)) / 4 / 2, plan.device_types["H100"])
    assert optim.loc[optim["rank"] == 0, "duration_ns"].item() == want
