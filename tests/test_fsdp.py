"""ZeRO-3 / FSDP (training.zero_stage 3): per-unit parameter all-gathers (docs/trace.md)."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from helpers.gen import TINY, make_plan, topo_order

from xsim_adapters.errors import PlanError, PlanWarning
from xsim_adapters.plan.model import FSDPSpec
from xsim_adapters.plan.params import embedding_params, head_params, layer_params
from xsim_adapters.trace.schema import KIND_COMPUTE, PHASE_INDEX
from xsim_adapters.workload import generate
from xsim_adapters.workload.estimate import estimate_by_kind

MODEL8 = replace(TINY, layers=8)
TOTAL = layer_params(MODEL8) * 8 + embedding_params(MODEL8) + head_params(MODEL8)


def _plan(zero: int, mbs: int = 1, dp: int = 4, tp: int = 2, pp: int = 1, **fsdp) -> object:
    """dp replicas of TP ``tp`` x PP ``pp`` (8 layers split evenly) on one 2x8 H100 group."""
    per = 8 // pp
    reps = [[("h100", (r * pp + s) * tp, (r * pp + s + 1) * tp, s * per, (s + 1) * per)
             for s in range(pp)] for r in range(dp)]
    tr: dict = {"zero_stage": zero, "grad_reduce_dtype": "bf16"}
    if fsdp:
        tr["fsdp"] = FSDPSpec(**fsdp)
    return make_plan(reps, model=MODEL8, micro_batches=[mbs] * dp, training=tr)


def _dp(trace) -> pd.DataFrame:
    c = trace.collectives
    return c[c["phase"] == PHASE_INDEX["dp"]]


def test_unit_gathers_move_the_shard_bytes_closed_form() -> None:
    """Per micro-batch one all-gather per unit before forward and one before backward, each the
    unit's parameter bytes (bf16) of the TP shard; a rank receives (n-1)/n of them."""
    mbs = 2
    trace = generate(_plan(3, mbs=mbs))
    dp = _dp(trace)
    ag = dp[dp["kind"] == "all_gather"]
    # 8 units (layer buckets) x 2 TP chunk rings x 2 passes x 2 micro-batches
    assert len(ag) == 8 * 2 * 2 * mbs
    assert ag["bytes"].sum() == TOTAL * 2 * 2 * mbs
    unit0 = (layer_params(MODEL8) + embedding_params(MODEL8)) * 2 // 2  # TP chunk 0 of layer 0
    first = ag[(ag["layer_start"] == 0) & (ag["chunk"] == 0)]
    assert set(first["bytes"]) == {unit0}
    # the flows of one gather: each member receives (n-1)/n of the unit's bytes
    flows = trace.ops[trace.ops["collective"] == first["collective"].iloc[0]]
    n = 4
    assert flows.groupby("rank")["bytes"].sum().tolist() == [unit0 * (n - 1) // n] * n
    rs = dp[dp["kind"] == "reduce_scatter"]
    assert rs["bytes"].sum() == TOTAL * 2  # once per iteration, bf16 gradients


def test_zero3_moves_one_and_a_half_times_zero1() -> None:
    """ZeRO-1: reduce-scatter + all-gather = 2 (n-1)/n P per rank; ZeRO-3 with reshard after
    forward: reduce-scatter + 2 all-gathers = 3 (n-1)/n P (one micro-batch, bf16 gradients)."""
    def sent(zero: int, **kw) -> int:
        tr = generate(_plan(zero, **kw))
        ids = set(_dp(tr)["collective"])
        return int(tr.ops.loc[tr.ops["collective"].isin(ids), "bytes"].sum())

    z1, z3 = sent(1), sent(3)
    assert 2 * z3 == 3 * z1
    assert sent(2) == z1  # ZeRO-2 traces as ZeRO-1 (it only shards the gradient memory)
    assert sent(3, reshard_after_forward=False) == z1  # one gather + one reduce-scatter


def _gathers_and_gates(trace):
    ops, dp = trace.ops, _dp(trace)
    ag = dp[dp["kind"] == "all_gather"]
    flows = ops[ops["collective"].isin(set(ag["collective"]))]
    return ops, ag, flows


def test_forward_of_a_unit_never_before_its_gather() -> None:
    """The forward op of unit k on rank r depends (transitively) on every flow of its gather
    into r: check with finish times of a zero-cost topological sweep replaced by the DAG."""
    trace = generate(_plan(3, mbs=1))
    ops, ag, flows = _gathers_and_gates(trace)
    preds = trace.deps.groupby("succ")["pred"].apply(list)
    comp = ops[(ops["kind"] == KIND_COMPUTE) & (ops["phase"] == PHASE_INDEX["fwd"])]
    # forward all-gathers are the first 16 rows (8 units x 2 chunks), in unit order
    fwd_ids = list(ag["collective"])[:16]
    for cid in fwd_ids:
        row = ag[ag["collective"] == cid].iloc[0]
        for rank, fl in flows[flows["collective"] == cid].groupby("rank"):
            first = comp[(comp["rank"] == rank) & (comp["layer_start"] == row["layer_start"])]
            op = int(first["op_id"].min())
            if row["layer_start"] == 0:  # the embedding comes first
                op = int(comp[(comp["rank"] == rank)]["op_id"].min())
            tails = set(fl["op_id"]) & set().union(*(preds.get(op, []),))
            assert tails, (cid, rank)


def test_prefetch_orders_the_gathers() -> None:
    """Unit q's gather starts after unit q-1's arrived and after unit q-p's first op: with
    prefetch p the gather flows of unit q descend from the forward op of unit q-p."""
    for p in (1, 2):
        trace = generate(_plan(3, mbs=1, prefetch=p))
        order, _ = topo_order(trace)
        ops, ag, flows = _gathers_and_gates(trace)
        deps = trace.deps
        preds = deps.groupby("succ")["pred"].apply(set)
        comp = ops[(ops["kind"] == KIND_COMPUTE) & (ops["phase"] == PHASE_INDEX["fwd"])]
        fwd = ag.iloc[:16]
        for _, row in fwd.iterrows():
            q = int(row["layer_start"])
            fl = flows[(flows["collective"] == row["collective"]) & (flows["step"] == 0)]
            direct = set().union(*(preds.get(int(i), set()) for i in fl["op_id"]))
            if q >= p:
                rank = int(fl["rank"].iloc[0])
                gate = comp[(comp["rank"] == rank) & (comp["layer_start"] == q - p)]
                gate_op = int(gate["op_id"].min()) if q - p else int(
                    comp[comp["rank"] == rank]["op_id"].min())
                assert gate_op in direct, (p, q)
            else:
                assert not any(int(i) in set(comp["op_id"]) for i in direct), (p, q)
        assert len(order) == len(ops)  # still a DAG


def test_estimate_counts_the_new_ops_exactly() -> None:
    for kw in ({}, {"mbs": 3}, {"mbs": 2, "pp": 2}, {"reshard_after_forward": False}):
        plan = _plan(3, **kw)
        trace = generate(plan)
        est = estimate_by_kind(plan)
        assert sum(est.values()) == len(trace.ops), kw
        assert est["dp"] == int((trace.ops["phase"] == PHASE_INDEX["dp"]).sum()), kw


def test_pp_and_tp_combine() -> None:
    """With PP every stage's units gather over that stage's DP group (torchtitan's 2D/3D)."""
    trace = generate(_plan(3, mbs=2, dp=2, tp=2, pp=2))
    ag = _dp(trace)
    ag = ag[ag["kind"] == "all_gather"]
    assert ag["bytes"].sum() == TOTAL * 2 * 2 * 2
    order, _ = topo_order(trace)
    assert len(order) == len(trace.ops)


def test_fsdp_errors_and_warning() -> None:
    from xsim_adapters.plan.sections import parse_training

    with pytest.raises(PlanError, match=r"training.fsdp: needs training.zero_stage: 3 "):
        parse_training({"global_batch": 8, "micro_batch": 1, "zero_stage": 1,
                        "fsdp": {"prefetch": 1}}, "training")
    with pytest.raises(PlanError, match=r"training.fsdp.prefetch"):
        parse_training({"global_batch": 8, "micro_batch": 1, "zero_stage": 3,
                        "fsdp": {"prefetch": 0}}, "training")
    with pytest.raises(PlanError, match=r"training.fsdp"):
        parse_training({"global_batch": 8, "micro_batch": 1, "zero_stage": 3,
                        "fsdp": {"unit": 1}}, "training")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        parse_training({"global_batch": 8, "micro_batch": 1, "zero_stage": 3}, "training")
        parse_training({"global_batch": 8, "micro_batch": 1, "zero_stage": 3,
                        "fsdp": {}}, "training")
    got = [str(x.message) for x in w if issubclass(x.category, PlanWarning)]
    assert len(got) == 1 and got[0].startswith("training.zero_stage: 3 now gathers")


def test_replicas_with_fewer_micro_batches_join_the_extra_gathers() -> None:
    """Replica 0 runs 2 micro-batches, replica 1 three: three gathers per unit and pass; replica
    0 joins the third after its last pass of that kind; the estimate stays exact."""
    plan = make_plan([[("h100", 0, 2, 0, 4)], [("h100", 2, 4, 0, 4)]],
                     micro_batches=[2, 3], training={"zero_stage": 3})
    trace = generate(plan)
    ag = _dp(trace)
    ag = ag[ag["kind"] == "all_gather"]
    assert len(ag) == 4 * 2 * 2 * 3  # units x TP chunks x passes x max micro-batches
    assert sum(estimate_by_kind(plan).values()) == len(trace.ops)
    order, _ = topo_order(trace)
    assert len(order) == len(trace.ops)


def test_flow_run_is_bounded_below_by_the_gathers() -> None:
    """Flow backend, DP 2 across two servers (TP 8 each): a rank's gathers run one after
    another and each receives (n-1)/n of its unit's TP-chunk bytes through its 400 Gb/s NIC,
    and so does its gradient reduce-scatter: the iteration is at least those bytes over the
    NIC rate (4.22 ms against 3.07 ms); ZeRO-3 is slower than ZeRO-1."""
    from xsim_adapters.backends.flow import FlowBackend
    from xsim_adapters.topology import build_topology

    big = replace(TINY, layers=8, hidden=2048, ffn_hidden=5504, heads=16, kv_heads=16)
    reps = [[("h100", 8 * r, 8 * r + 8, 0, 8)] for r in range(2)]

    def iteration(zero: int) -> tuple[float, object]:
        plan = make_plan(reps, model=big, micro_batches=[1, 1],
                         training={"zero_stage": zero, "grad_reduce_dtype": "bf16"})
        trace = generate(plan)
        tl = FlowBackend().run(trace, build_topology(plan), {"engine": "python"})
        return float(tl.frame["end_ns"].max()), plan

    t3, plan = iteration(3)
    t1, _ = iteration(1)
    total = layer_params(big) * 8 + embedding_params(big) + head_params(big)
    # fwd + bwd gathers and the reduce-scatter (bf16), of the TP chunk, (n-1)/n with n = 2
    per_rank_recv = 3 * (total * 2 / 8) / 2
    nic_Bps = plan.device_types["H100"].nic_gbps * 1e9 / 8
    bound_ns = per_rank_recv / nic_Bps * 1e9
    assert t3 >= bound_ns
    assert t3 > t1


def test_memory_drops_as_the_zero_and_fsdp_papers_say() -> None:
    """Per device, P = the stage's parameters / tp, bf16 weights and gradients, Adam 12 bytes,
    N_d = 4 (Rajbhandari et al. 2020 Fig. 1): ZeRO-1 (2 + 2 + 12/N_d) P, ZeRO-2
    (2 + (2 + 12)/N_d) P, ZeRO-3 (2 + 2 + 12) P / N_d plus (prefetch + 1) gathered units (the
    largest: layer 0 with the embedding, layer 7 with the head; Zhao et al. 2023)."""
    from xsim_adapters.feasibility.memory import stage_memory

    p = TOTAL / 2  # tp 2
    def state(zero: int, **kw) -> float:
        sm = stage_memory(_plan(zero, **kw), 0, 0)
        return sm.weights + sm.gradients + sm.optimizer

    assert state(0) == pytest.approx(16 * p)
    assert state(1) == pytest.approx((4 + 12 / 4) * p)
    assert state(2) == pytest.approx((2 + 14 / 4) * p)
    lay, emb, head = layer_params(MODEL8), embedding_params(MODEL8), head_params(MODEL8)
    two = (lay + emb) + (lay + head)  # the two largest units (embedding == head here: vocab)
    assert state(3) == pytest.approx(16 * p / 4 + two / 2 * 2)
    assert state(3, prefetch=2) == pytest.approx(16 * p / 4 + (two + lay) / 2 * 2)
    assert state(3) < state(2) < state(1) < state(0)


def test_replicas_must_split_the_layers_alike() -> None:
    """Different stage splits (or, under PP, micro-batch counts) would order the gathers
    differently per replica (a deadlock in FSDP, a cycle in the trace): one-line errors."""
    from xsim_adapters.plan.parallel import check_fsdp

    split = make_plan([[("h100", 0, 2, 0, 4)], [("h100", 2, 3, 0, 2), ("h100", 3, 4, 2, 4)]],
                      training={"zero_stage": 3})
    with pytest.raises(PlanError, match=r"^replicas\[1\]: training.zero_stage 3 \(FSDP\) needs "
                       r"every replica to split the layers as replicas\[0\] does.*\[0, 2\) "
                       r"\[2, 4\) here, \[0, 4\) in replicas\[0\]\)$"):
        check_fsdp(split)
    with pytest.raises(PlanError, match=r"replicas\[1\]"):
        generate(split)
    check_fsdp(replace(split, training=replace(split.training, zero_stage=2)))  # ZeRO-2: fine
    mbs = _plan(3, pp=2, dp=2)
    mbs = replace(mbs, replicas=(mbs.replicas[0], replace(mbs.replicas[1], micro_batches=3)))
    with pytest.raises(PlanError, match=r"replicas\[1\]: .* same micro-batch count .* \(3 here, "
                       r"1 in replicas\[0\]\)"):
        check_fsdp(mbs)


@pytest.mark.parametrize("training", [{"recompute": "full"}, {"schedule": "zb_h1"},
                                      {"schedule": "interleaved", "virtual_stages": 2}])
def test_schedules_and_recompute_stay_acyclic_and_exact(training: dict) -> None:
    """Full recompute gathers the backward's units in recompute (layer) order; zero bubble and
    interleaving gather per model chunk: the DAG is acyclic and the estimate exact."""
    reps = [[("h100", 4 * r + 2 * s, 4 * r + 2 * s + 2, 4 * s, 4 * s + 4) for s in range(2)]
            for r in range(2)]
    plan = make_plan(reps, model=MODEL8, micro_batches=[4, 4],
                     training={"zero_stage": 3, **training})
    trace = generate(plan)
    order, _ = topo_order(trace)
    assert len(order) == trace.num_ops
    assert sum(estimate_by_kind(plan).values()) == trace.num_ops


def test_hsdp_splits_the_bytes_between_shard_and_replicate_groups() -> None:
    """HSDP over 4 replicas, shard groups of 2: reduce-scatter and gathers inside each group
    (every group moves the whole model), the shard's all-reduce across the 2 groups (S / 2 per
    ring, one ring per shard); each rank receives (2-1)/2 S per gather and 2 (2-1)/2 S/2 in the
    all-reduce; the optimizer and memory shard over 2, not 4; the estimate stays exact."""
    from xsim_adapters.feasibility.memory import stage_memory

    plan = _plan(3, dp=4, hsdp_shard=2)
    trace = generate(plan)
    dp = _dp(trace)
    by = dp.groupby("kind")["bytes"].sum()
    assert by["reduce_scatter"] == 2 * TOTAL * 2  # 2 groups, bf16 gradients
    assert by["all_gather"] == 2 * TOTAL * 2 * 2  # 2 groups, fwd + bwd
    assert by["all_reduce"] == TOTAL * 2  # one shard per ring, 2 rings (shards) per chunk
    ops = trace.ops
    # a 2-member ring: each member sends (2-1)/2 of a reduce-scatter's or gather's bytes and
    # 2 (2-1)/2 of an all-reduce's: summed over the 8 ranks, 1x and 2x the collectives' bytes
    for kind, share in (("reduce_scatter", 1), ("all_gather", 1), ("all_reduce", 2)):
        ids = set(dp.loc[dp["kind"] == kind, "collective"])
        got = ops[ops["collective"].isin(ids)].groupby("rank")["bytes"].sum()
        want = by[kind] * share / 8  # 8 symmetric ranks
        assert np.allclose(got.to_numpy(), want, rtol=1e-6), kind
    assert sum(estimate_by_kind(plan).values()) == trace.num_ops
    order, _ = topo_order(trace)
    assert len(order) == trace.num_ops
    full, hsdp = stage_memory(_plan(3, dp=4), 0, 0), stage_memory(plan, 0, 0)
    assert hsdp.optimizer == pytest.approx(2 * full.optimizer)
    assert hsdp.gradients == pytest.approx(2 * full.gradients)
    from xsim_adapters.plan.parallel import check_fsdp

    with pytest.raises(PlanError, match=r"^training.fsdp.hsdp_shard: must divide the 4 "
                       r"replicas \(got 3\)$"):
        check_fsdp(_plan(3, dp=4, hsdp_shard=3))
    with pytest.raises(PlanError, match=r"hsdp_shard: must be 0"):
        check_fsdp(_plan(3, dp=4, hsdp_shard=1))
