"""The emitter's one lowering path (workload/comm/emit.py), the DP setup record and the plan's
per-micro-batch sizes (plan/sizes.py): exact op ids, durations, edges and byte counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import xsim_adapters as xs
from xsim_adapters.plan.sizes import activation_bytes, tokens_per_microbatch
from xsim_adapters.trace.schema import KIND_BARRIER, KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload.builder import BulkBuilder
from xsim_adapters.workload.comm.collectives import RingFlows, num_steps
from xsim_adapters.workload.comm.emit import emit_gated, emit_lowered

ROOT = Path(__file__).resolve().parent.parent
DP = PHASE_INDEX["dp"]


def _chain() -> RingFlows:
    """Three members in a chain 0 -> 1 -> 2 -> 0: members 1 and 2 send first only after
    receiving (their gate flows have a predecessor inside the collective, as a tree's inner
    members), member 0's gate flow waits on nothing."""
    i64 = np.int64
    return RingFlows(
        src=np.array([10, 11, 12], i64), dst=np.array([11, 12, 10], i64),
        nbytes=np.array([100, 100, 100], i64), step=np.array([0, 1, 2], i64),
        channel=np.zeros(3, i64), instance=np.zeros(3, i64),
        pred=np.array([0, 1], i64), succ=np.array([1, 2], i64),
        start=np.array([[[0, 1, 2]]], i64),
        tails=np.array([[[[2, 0], [0, 1], [1, 2]]]], i64))


def test_lowered_collective_folds_free_gates_and_keeps_barriers_for_inner_members():
    tb = BulkBuilder()
    tb.add_ops(5, kind=KIND_BARRIER, rank=0, phase=DP)  # ops 0..4 before the collective
    coll = dict(n=1, kind="all_reduce", phase=DP, bytes=300, ranks="10,11,12",
                algorithm="chain", channels=1)
    tails, starts = emit_lowered(tb, _chain(), np.array([[10, 11, 12]]), np.array([500]), coll,
                                 lambda rk, inst: dict(phase=DP, layer_start=3, layer_stop=4))
    ops, deps, colls = tb.frames()
    new = ops.iloc[5:]
    # flows first (ids 5, 6, 7), then the two inner members' timed barriers (8, 9)
    assert new["kind"].tolist() == [KIND_FLOW] * 3 + [KIND_BARRIER] * 2
    assert new["rank"].tolist() == [10, 11, 12, 11, 12]
    assert new["duration_ns"].tolist() == [500, 0, 0, 500, 500]
    assert new["collective"].tolist() == [0] * 5 and len(colls) == 1
    assert set(new["layer_start"]) == {3}
    assert starts.tolist() == [[[5, 8, 9]]]
    assert tails.tolist() == [[[[7, 5], [5, 6], [6, 7]]]]
    assert sorted(zip(deps["pred"], deps["succ"], strict=True)) == [(5, 6), (6, 7), (8, 6),
                                                                      (9, 7)]


def test_lowered_collective_without_cost_adds_no_barrier_and_no_latency():
    tb = BulkBuilder()
    coll = dict(n=1, kind="all_reduce", phase=DP, bytes=300, ranks="10,11,12",
                algorithm="chain", channels=1)
    _, starts = emit_lowered(tb, _chain(), np.array([[10, 11, 12]]), None, coll,
                             lambda rk, inst: dict(phase=DP))
    ops, _, _ = tb.frames()
    assert len(ops) == 3 and ops["duration_ns"].tolist() == [0, 0, 0]
    assert starts.tolist() == [[[0, 1, 2]]]


def test_gated_emission_orders_rows_flows_then_barriers_and_reuses_rows():
    tb = BulkBuilder()
    cids, fids, gids = emit_gated(
        tb, dict(n=2, kind="cp_ring", phase=DP, bytes=8, ranks="0,1", algorithm="p2p"),
        dict(n=4, rank=[0, 1, 0, 1], dst=[1, 0, 1, 0], bytes=4, collective=[0, 0, 1, 1],
             phase=DP),
        dict(n=2, rank=[0, 0], duration_ns=[7, 9], collective=[0, 1], phase=DP))
    assert cids.tolist() == [0, 1] and fids.tolist() == [0, 1, 2, 3]
    assert gids is not None and gids.tolist() == [4, 5]
    # a later step of the same collectives: flows only, no new rows
    c2, f2, g2 = emit_gated(tb, cids, dict(n=2, rank=[1, 0], dst=[0, 1], bytes=4,
                                           collective=[1, 0], phase=DP))
    ops, _, colls = tb.frames()
    assert c2 is cids and f2.tolist() == [6, 7] and g2 is None and len(colls) == 2
    assert ops["collective"].tolist() == [0, 0, 1, 1, 0, 1, 1, 0]
    assert ops["duration_ns"].tolist()[4:6] == [7, 9]


def test_dp_setup_is_a_frozen_record_with_the_published_gradient_bytes():
    from xsim_adapters.workload.dp import dp_setup
    from xsim_adapters.workload.generate import _Generator

    plan = xs.load_plan(ROOT / "workloads" / "homogeneous-h100.yaml")
    gen = _Generator(plan)
    gen.add_stages()
    dp = dp_setup(gen.em)
    assert dp is not None
    # Llama 2 7B, 6,738,415,616 parameters (HF checkpoint): fp32 gradients, bf16 parameters
    assert int(dp.grad_bytes.sum()) == 4 * 6_738_415_616
    assert int(dp.param_bytes.sum()) == 2 * 6_738_415_616
    assert dp.members.shape[1] == 2 and dp.perm.shape[:2] == (len(dp.members), 1)
    assert (dp.grad_channel_bytes.sum(axis=1) == dp.grad_bytes).all()
    with pytest.raises(dataclasses.FrozenInstanceError):
        dp.members = dp.members  # type: ignore[misc]


def test_plan_sizes_per_micro_batch():
    plan = xs.load_plan(ROOT / "workloads" / "long-context-128k-cp4.yaml")
    m = plan.model
    assert tokens_per_microbatch(m, 2) == 2 * m.seq_len
    assert tokens_per_microbatch(m, 2, 4) == 2 * m.seq_len // 4
    assert activation_bytes(m, 1, 4) == m.seq_len // 4 * m.hidden * m.dtype_bytes


def test_ring_steps_have_one_home():
    from xsim_adapters.search import comm
    from xsim_adapters.workload.comm import nccl

    assert comm.ring_steps is nccl.ring_steps
    assert [nccl.ring_steps("all_reduce", n) for n in (1, 2, 8)] == [0, 2, 14]
    assert [num_steps("all_gather", n, "step", 4) for n in (1, 2, 8)] == [0, 1, 7]
    assert num_steps("all_reduce", 8, "chunked", 4) == 4
