"""Overlap switches, selective recompute and the B/W split in the generated DAG."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from helpers.gen import TINY, make_plan, topo_order

import xsim_adapters as xs
from xsim_adapters.plan.model import OverlapSpec
from xsim_adapters.trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload import generate
from xsim_adapters.workload.compute.costs import layer_costs
from xsim_adapters.workload.compute.kernels import microbatch_overhead_seconds
from xsim_adapters.workload.compute.passes import attention_core_flops, gemm_shares

MODEL = replace(TINY, hidden=1024, ffn_hidden=2816, heads=16, kv_heads=16, seq_len=512)


def _run(plan):
    trace = generate(plan)
    tl = xs.run(trace, "flow", topology=xs.build_topology(plan))
    return trace, xs.metrics(trace, tl)


def _preds(trace) -> pd.Series:
    """Predecessors per op, looking through a ring's timed NCCL-delay barrier (a barrier with
    ``duration_ns`` > 0 between a member's inputs and its first send)."""
    raw = trace.deps.groupby("succ")["pred"].apply(set)
    ops = trace.ops
    timed = set(ops.loc[(ops["kind"] == KIND_BARRIER) & (ops["duration_ns"] > 0), "op_id"])
    res = raw.apply(lambda ps: set().union(*(raw.get(p, set()) if p in timed else {p}
                                              for p in ps)))
    return res[res.apply(len) > 0]  # an op behind a root delay has no predecessors either


# ---------------------------------------------------------------- TP overlap


def _tp_plan(tp_comm: bool):
    # nccl_cost off: on this tiny model NCCL's per-collective latency (tens of us) outlasts
    # the last GEMM, so no flow would overlap compute; the overlap structure is the subject
    return make_plan(
        [[("h100", 0, 4, 0, 2), ("h100", 4, 8, 2, 4)]],
        model=MODEL,
        training={"sequence_parallel": True, "overlap": OverlapSpec(tp_comm=tp_comm)},
        collectives={"nccl_cost": False},
    )


def test_tp_comm_overlap_runs_collectives_beside_the_gemms() -> None:
    off, m_off = _run(_tp_plan(False))
    on, m_on = _run(_tp_plan(True))
    plan = _tp_plan(True)
    assert len(topo_order(on)[0]) == on.num_ops
    # the same flows and bytes; every layer unit's compute op is cut in three (first GEMM,
    # middle, last GEMM) with durations and FLOPs adding up to the unit's
    fo, fn = off.ops[off.ops["kind"] == KIND_FLOW], on.ops[on.ops["kind"] == KIND_FLOW]
    assert len(fo) == len(fn) and fo["bytes"].sum() == fn["bytes"].sum()
    co, cn = off.ops[off.ops["kind"] == KIND_COMPUTE], on.ops[on.ops["kind"] == KIND_COMPUTE]
    layer_ops = co["layer_start"].between(0, MODEL.layers - 1)
    units = co[layer_ops & (co["phase"] != PHASE_INDEX["optim"])]
    assert len(cn) == len(co) + 2 * len(units)
    key = ["rank", "microbatch", "phase", "layer_start"]
    assert (co.groupby(key)["duration_ns"].sum() == cn.groupby(key)["duration_ns"].sum()).all()
    # the shares come from the compute model: QKV and out-projection of the attention block
    shares = gemm_shares(MODEL, plan.training, 4)
    qkv = 2 * 512 * 1024 * (1024 + 2 * 16 * 64) / 4
    proj = 2 * 512 * 1024 * 1024 / 4
    core = attention_core_flops(MODEL, plan.training, 4)
    assert shares["attention"] == pytest.approx((qkv / (qkv + proj + core),
                                                 proj / (qkv + proj + core)))
    assert shares["mlp"] == pytest.approx((2 / 3, 1 / 3))
    # a layer unit's reduce-scatter starts after its middle piece, not after its last GEMM
    ops, preds = on.ops, _preds(on)
    comp = ops[ops["kind"] == KIND_COMPUTE]
    rs_ids = set(on.collectives.loc[on.collectives["kind"] == "reduce_scatter", "collective"])
    rs = ops[ops["collective"].isin(rs_ids) & (ops["step"] == 0) & (ops["layer_start"] >= 0)
             & (ops["layer_start"] < MODEL.layers)]
    cid, crank = comp["op_id"].to_numpy(), comp["rank"].to_numpy()
    for f, r in zip(rs["op_id"], rs["rank"], strict=True):
        mine = cid[(crank == r) & (cid < f)]
        last_gemm, middle = mine[-1], mine[-2]
        assert middle in preds[f] and last_gemm not in preds[f]
    # on the flow backend: TP flows run while rank 0 computes, and the iteration gets shorter
    tl = m_on.timeline
    c = tl[(tl["kind"] == KIND_COMPUTE) & (tl["rank"] == 0)]
    f = tl[(tl["kind"] == KIND_FLOW) & (tl["phase"] == PHASE_INDEX["tp"]) & (tl["rank"] == 0)]
    overlapped = (f["start_ns"].to_numpy()[:, None] < c["end_ns"].to_numpy()[None, :]) & (
        f["end_ns"].to_numpy()[:, None] > c["start_ns"].to_numpy()[None, :]
    )
    assert overlapped.any()
    so, sf = m_on.summary, m_off.summary
    assert so["iteration_time_ns"] < sf["iteration_time_ns"]
    assert so["rank_ns_sums"]["exposed_comm_ns"] < sf["rank_ns_sums"]["exposed_comm_ns"]
    # no faster than rank 0's compute alone
    r0 = off.ops[(off.ops["rank"] == 0) & (off.ops["kind"] == KIND_COMPUTE)]
    assert so["iteration_time_ns"] >= r0["duration_ns"].sum()


def test_overlapped_gemms_lose_the_sms_of_the_communication() -> None:
    """A split unit's last GEMM runs beside its reduce-scatter on sm_count - comm SMs (TE's
    set_sm_margin): 24 of an H100's 132 SMs after the out-projection, 16 after MLP-down."""
    from xsim_adapters.workload.blocks import TP_OVERLAP_SMS, Unit, _pieces

    u = Unit("fwd", 0, 1, 1_000_000, 10.0, ("reduce_scatter", "all_gather"), None, (0.5, 0.2),
             comm_sms=TP_OVERLAP_SMS["attention_fwd"])
    (d1, f1), (d2, f2), (d3, f3) = _pieces(u, True, 132)
    assert (d1, d2) == (500_000, 300_000)  # the all-gather runs on copy engines: no margin
    assert d3 == round(200_000 * 132 / (132 - 24))
    assert (f1, f2, f3) == pytest.approx((5.0, 3.0, 2.0))  # FLOPs are not inflated
    mlp = Unit("fwd", 0, 1, 1_000_000, 10.0, ("reduce_scatter",), None, (0.5, 0.2),
               comm_sms=TP_OVERLAP_SMS["mlp_fwd"])
    assert _pieces(mlp, True, 132)[2][0] == round(200_000 * 132 / 116)
    assert _pieces(u, True, 0) == [(500_000, 5.0), (300_000, 3.0), (200_000, 2.0)]  # no SMs
    assert _pieces(u, False, 132) == [(1_000_000, 10.0)]  # not overlapped: one op as before


# ---------------------------------------------------------------- DP overlap


def _dp_plan(**overlap):
    return make_plan(
        [
            [("h100", 0, 2, 0, 2), ("h100", 2, 4, 2, 4)],
            [("h100", 8, 10, 0, 2), ("h100", 10, 12, 2, 4)],
        ],
        model=MODEL,
        training={"zero_stage": 1, "overlap": OverlapSpec(**overlap)},
    )


def _dp_colls(trace, kind: str) -> set[int]:
    c = trace.collectives
    return set(c.loc[(c["phase"] == PHASE_INDEX["dp"]) & (c["kind"] == kind), "collective"])


def test_dp_grad_reduce_off_waits_for_the_whole_backward() -> None:
    trace = generate(_dp_plan(dp_grad_reduce=False))
    ops, preds = trace.ops, _preds(trace)
    rs = ops[ops["collective"].isin(_dp_colls(trace, "reduce_scatter")) & (ops["step"] == 0)]
    comp = ops[ops["kind"] == KIND_COMPUTE]
    last = comp[comp["phase"] != PHASE_INDEX["optim"]].groupby("rank")["op_id"].max()
    for fl in rs.itertuples():
        assert last[fl.rank] in preds[fl.op_id]
    on, m_on = _run(_dp_plan(dp_grad_reduce=True))
    _, m_off = _run(_dp_plan(dp_grad_reduce=False))
    assert m_on.summary["iteration_time_ns"] < m_off.summary["iteration_time_ns"]


def test_param_gather_overlaps_the_next_forward() -> None:
    trace, m_on = _run(_dp_plan(param_gather=True))
    ops, preds = trace.ops, _preds(trace)
    ag_ids = _dp_colls(trace, "all_gather")
    ag = ops[ops["collective"].isin(ag_ids)]
    optim = set(ops.loc[ops["phase"] == PHASE_INDEX["optim"], "op_id"])
    assert not any(preds.get(f, set()) & optim for f in ag["op_id"])  # not after the step
    # each rank's first bucket starts the iteration; later buckets wait for the one before
    first = ag[ag["step"] == 0]
    roots = first[[not (preds.get(f, set()) - set(ag["op_id"])) and f not in preds
                   for f in first["op_id"]]]
    assert set(roots["layer_start"]) == {0, 2}  # first layer of each stage
    # the first forward of every layer on every rank waits for its bucket's all-gather
    fwd0 = ops[(ops["kind"] == KIND_COMPUTE) & (ops["phase"] == PHASE_INDEX["fwd"])
               & (ops["microbatch"] == 0)]
    gated = fwd0[[bool(preds[o] & set(ag["op_id"])) for o in fwd0["op_id"]]]
    # 8 ranks x 2 layers each; the bucket of layer 0 holds the embedding, which runs first
    assert len(gated) == 8 * 2
    assert sorted(set(gated["layer_start"])) == [-2, 1, 2, 3]
    later = ops[(ops["kind"] == KIND_COMPUTE) & (ops["microbatch"] > 0)]["op_id"]
    assert not any(preds.get(o, set()) & set(ag["op_id"]) for o in later)
    # the same bytes move as without overlap; the iteration gets shorter
    off, m_off = _run(_dp_plan(param_gather=False))
    assert ag["bytes"].sum() == off.ops[off.ops["collective"].isin(_dp_colls(off, "all_gather"))][
        "bytes"].sum()
    assert m_on.summary["iteration_time_ns"] < m_off.summary["iteration_time_ns"]


# ---------------------------------------------------------------- recompute, B/W split


def test_selective_recompute_reruns_the_attention_core() -> None:
    plan = make_plan([[("h100", 0, 2, 0, 4)]], model=MODEL, training={"recompute": "selective"})
    ops = generate(plan).ops
    rec = ops[(ops["kind"] == KIND_COMPUTE) & (ops["phase"] == PHASE_INDEX["recompute"])]
    assert len(rec) == MODEL.layers * 2 * 4  # layers x ranks x micro-batches
    c = layer_costs(MODEL, plan.training, plan.device_types["H100"], 2)
    core = attention_core_flops(MODEL, plan.training, 2)
    assert core == 4 * 512 * 512 * 1024 / 2
    assert set(rec["flops"]) == {core}
    assert set(rec["duration_ns"]) == {round(c.attn_fwd_ns * core / c.attn_flops)}
    full = generate(make_plan([[("h100", 0, 2, 0, 4)]], model=MODEL,
                              training={"recompute": "full"})).ops
    rf = full[(full["kind"] == KIND_COMPUTE) & (full["phase"] == PHASE_INDEX["recompute"])]
    assert rf["duration_ns"].sum() > rec["duration_ns"].sum()
    # + the per-micro-batch framework overhead, charged to each backward pass's first layer op
    # (here the recompute of the last layer; workload/compute/kernels.py)
    extra = round(microbatch_overhead_seconds() * 1e9)
    per_mb = MODEL.layers * (c.attn_fwd_ns + c.mlp_fwd_ns) + extra
    assert rf["duration_ns"].sum() == 4 * 2 * per_mb


def test_zb_split_keeps_the_backward_time() -> None:
    plan = make_plan([[("h100", 0, 2, 0, 2), ("h100", 2, 4, 2, 4)]], model=MODEL,
                     training={"schedule": "zb_h1"})
    ops = generate(plan).ops
    c = layer_costs(MODEL, plan.training, plan.device_types["H100"], 2)
    core = attention_core_flops(MODEL, plan.training, 2)
    comp = ops[(ops["kind"] == KIND_COMPUTE) & (ops["rank"] == 0) & (ops["microbatch"] == 0)]
    for layer in (0, 1):
        mine = comp[comp["layer_start"] == layer]
        b = mine.loc[mine["phase"] == PHASE_INDEX["bwd"], "duration_ns"].sum()
        w = mine.loc[mine["phase"] == PHASE_INDEX["wgrad"], "duration_ns"].sum()
        # the split moves time, adds none (layer 1 opens the stage's backward pass: it also
        # carries the per-micro-batch framework overhead, workload/compute/kernels.py)
        extra = round(microbatch_overhead_seconds() * 1e9) if layer == 1 else 0
        assert b + w == c.attn_bwd_ns + c.mlp_bwd_ns + extra
        # W: the weight GEMMs, half the MLP backward and (attn - core)/(2 attn) of attention's
        want_w = round(c.mlp_bwd_ns * 0.5) + round(
            c.attn_bwd_ns * (c.attn_flops - core) / (2 * c.attn_flops))
        assert w == want_w
        wf = mine.loc[mine["phase"] == PHASE_INDEX["wgrad"], "flops"].sum()
        assert wf == pytest.approx(c.mlp_flops + c.attn_flops - core)
    # the embedding's gradient is a W pass on stage 0
    emb = comp[comp["layer_start"] == -2]
    assert set(emb["phase"]) == {PHASE_INDEX["fwd"], PHASE_INDEX["wgrad"]}
    assert np.isin(ops["phase"].unique(), list(PHASE_INDEX.values())).all()


def test_zb_h1_with_selective_recompute_and_tp_overlap() -> None:
    plan = make_plan(
        [[("h100", 0, 2, 0, 2), ("h100", 2, 4, 2, 4)]],
        model=MODEL,
        training={"schedule": "zb_h1", "recompute": "selective", "sequence_parallel": True,
                  "overlap": OverlapSpec(tp_comm=True)},
    )
    trace = generate(plan)
    ops = trace.ops
    assert len(topo_order(trace)[0]) == trace.num_ops
    comp = ops[ops["kind"] == KIND_COMPUTE]
    rec = comp[comp["phase"] == PHASE_INDEX["recompute"]]
    assert len(rec) == MODEL.layers * 2 * 4  # one per layer, rank and micro-batch
    w = comp[comp["phase"] == PHASE_INDEX["wgrad"]]
    assert len(w) == (MODEL.layers + 2) * 2 * 4  # + embedding and head gradients
    _, m = _run(plan)
    assert m.summary["iteration_time_ns"] > 0
