"""NCCL's collective cost (latency, protocol choice) and how the lowering replays it."""

from __future__ import annotations

import pytest
from helpers.gen import make_plan

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.bench_collective import bench, bench_plan, lowered_trace
from xsim_adapters.testing.handmade import TraceBuilder, ring_collective
from xsim_adapters.topology import build_topology
from xsim_adapters.trace import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW
from xsim_adapters.trace.schema import PHASE_INDEX
from xsim_adapters.workload import generate
from xsim_adapters.workload.comm.nccl import (
    LL_MAX_BW_1NODE_GBPS,
    LL_MAX_BW_NET_GBPS,
    NVLINK_BW_EFFICIENCY,
    PER_CH_MAX_RING_LL128_GBPS,
    PROTOCOL_BW_FACTOR,
    PROTOCOLS,
    RING_BASE_LATENCY_US,
    RING_STEP_LATENCY_US,
    ring_cost,
)
from xsim_adapters.workload.comm.rings import RankInfo, ring_delay_ns


def test_small_all_reduce_on_one_server_uses_ll_with_the_tuner_latency() -> None:
    c = ring_cost("all_reduce", 8, 1024, 1, 300.0, "nvlink")
    assert c.protocol == "LL"
    # 6.6 us base + 14 steps x 0.6 us (tuning.cc Ring LL, NVLink)
    assert c.latency_ns == pytest.approx(15_000.0)
    nominal = 14 / 8 * 1024 / 300.0
    # LL: half of NCCL's 240 GB/s NVLink rate, capped at llMaxBw (Ampere, one node: 87.7)
    ll = min(0.8 * 0.5 * 300.0, LL_MAX_BW_1NODE_GBPS[80])
    assert ll == 87.7
    assert c.bandwidth_ns == pytest.approx(nominal * 300.0 / ll - nominal)


def test_large_all_reduce_uses_simple_at_nccl_nvlink_rate() -> None:
    s = 1 << 30
    c = ring_cost("all_reduce", 8, s, 1, 300.0, "nvlink")
    assert c.protocol == "Simple"
    nominal = 14 / 8 * s / 300.0
    # Simple reaches 20 of 25 GB/s per NVLink: 25% more time than the spec rate
    assert c.bandwidth_ns == pytest.approx(nominal * (1 / NVLINK_BW_EFFICIENCY - 1))
    assert c.latency_ns == pytest.approx((8.4 + 14 * 3.4) * 1e3)


@pytest.mark.parametrize("size", [1 << k for k in range(10, 34, 3)])
def test_the_chosen_protocol_is_the_fastest(size: int) -> None:
    c = ring_cost("all_reduce", 16, size, 2, 25.0, "net", channels=16)
    nominal = 30 / 16 * size / 25.0
    for p, name in enumerate(PROTOCOLS):
        # intra-server steps cost at least the network post overhead (1 us, x3 for Simple)
        intra = max(RING_STEP_LATENCY_US["nvlink"][p], 3.0 if name == "Simple" else 1.0)
        lat = (RING_BASE_LATENCY_US[p] + 28 * intra + 2 * RING_STEP_LATENCY_US["net"][p]) * 1e3
        if name == "Simple" and size / (16 * 16) >= 64:
            lat *= 1.4
        bw = 25.0 * PROTOCOL_BW_FACTOR[p]
        if name == "LL":
            bw = min(bw, LL_MAX_BW_NET_GBPS[0])
        if name == "LL128":  # one graph channel of 24 GB/s (search.cc): perChMaxRingLL128Bw 20
            bw = min(bw, PER_CH_MAX_RING_LL128_GBPS[80][1])
        other = lat + nominal * 25.0 / bw - nominal
        assert c.total_ns <= other + 1e-6


def test_start_latency_shifts_a_ring_by_exactly_its_length() -> None:
    topo = build_topology(bench_plan("H100-80GB", 1, 8))
    ends = []
    for delay in (0, 12_345):
        tb = TraceBuilder(8)
        last = ring_collective(tb, list(range(8)), 64 << 20, collective=0, delay_ns=delay)
        assert not any(r["kind"] == KIND_BARRIER for r in tb.rows)
        timed = [r for r in tb.rows if r["kind"] == KIND_FLOW and r["duration_ns"] > 0]
        assert len(timed) == (8 if delay else 0)  # one per rank: its step-0 send
        assert all(r["step"] == 0 for r in timed)
        end = tb.barrier(deps=last)
        ends.append(float(FlowBackend().run(tb.build(), topo, {}).frame["end_ns"].iloc[end]))
    assert ends[1] - ends[0] == pytest.approx(12_345.0, abs=1e-6)


def test_generator_puts_one_delay_per_member_on_its_first_flows_and_none_when_off() -> None:
    # trace schema 2: NCCL's delay is a start latency on each member's gate flows (one per
    # channel), not a timed barrier (workload/comm/latency.py)
    plan = make_plan([[("h100", 0, 4, 0, 4)], [("h100", 8, 12, 0, 4)]])
    trace = generate(plan)
    ops = trace.ops
    assert not ((ops["kind"] == KIND_BARRIER) & (ops["duration_ns"] > 0)).any()
    timed = ops[(ops["kind"] == KIND_FLOW) & (ops["duration_ns"] > 0)]
    colls = trace.collectives.set_index("collective")
    for cid, g in timed.groupby("collective"):
        members = colls.at[cid, "ranks"].split(",")
        assert g["rank"].nunique() == len(members)
        # one gate flow per member and channel, each the first flow it sends
        assert (g.groupby("rank").size() == int(colls.at[cid, "channels"])).all()
        first = ops[ops["collective"] == cid].groupby(["rank", "channel"])["op_id"].min()
        assert set(g["op_id"]) == set(first.to_numpy().tolist())
    dp = timed[timed["phase"] == PHASE_INDEX["dp"]]
    assert len(dp) > 0 and len(timed[timed["phase"] == PHASE_INDEX["tp"]]) > 0
    # the DP delay is the NCCL cost of that ring (2 members on 2 servers)
    info = RankInfo(plan)
    row = colls.loc[dp["collective"].iloc[0]]
    members = [int(x) for x in row["ranks"].split(",")]
    want = ring_delay_ns(info, row["kind"], [members], [int(row["bytes"])])
    assert set(dp.loc[dp["collective"] == dp["collective"].iloc[0], "duration_ns"]) == {want}
    off = make_plan([[("h100", 0, 4, 0, 4)], [("h100", 8, 12, 0, 4)]],
                    collectives={"nccl_cost": False})
    o = generate(off).ops
    assert not (o["duration_ns"].to_numpy()[o["kind"].to_numpy() != KIND_COMPUTE] > 0).any()
    assert len(o) == len(ops)  # the delay costs no op


def test_two_dgx_a100_all_reduce_reaches_the_measured_192_GBps() -> None:
    # nccl #812: two DGX A100 with 8 x HDR 200G NICs measure ~192 GB/s all-reduce busbw
    plan = bench_plan("A100-80GB", 2, 8)
    frame = bench(plan, "all_reduce", [1 << 30])
    assert frame["busbw"].iloc[0] == pytest.approx(192.0, rel=0.10)
    one = bench(plan, "all_reduce", [1 << 30], channels=1)  # one ring: one NIC pair
    assert one["busbw"].iloc[0] < 0.15 * frame["busbw"].iloc[0]


def test_bench_trace_moves_exactly_the_ring_bytes() -> None:
    plan = bench_plan("A100-80GB", 2, 8)
    s = (1 << 20) + 3
    trace, _, algo = lowered_trace(plan, "all_reduce", s)
    assert algo.startswith("ring:")
    flows = trace.ops[trace.ops["kind"] == 1]
    # every channel's bytes c_k are cut into 16 segments; each rank sends 2 x 15 of them
    assert flows["bytes"].sum() == 2 * 15 * s
