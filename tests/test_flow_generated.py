"""The flow backend on traces from the real generator: its ring lowering and shipped plans."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import WORKLOADS
from helpers.topo import TraceBuilder, make_plan

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.feasibility import load_plan
from xsim_adapters.plan.model import ScaleOut
from xsim_adapters.testing.handmade import ring_all_reduce
from xsim_adapters.topology import build_topology
from xsim_adapters.trace.schema import KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload import generate


def generated_ring(ranks: list[int], size: int, num_ranks: int) -> tuple[TraceBuilder, int]:
    """One all-reduce lowered by the generator's ``ring_flows`` (through the shared
    ``handmade.ring_all_reduce``), ending in a barrier."""
    tb = TraceBuilder(num_ranks)
    end = tb.barrier(deps=ring_all_reduce(tb, ranks, size, collective=0))
    return tb, end


@pytest.mark.parametrize("n", [4, 8])
def test_generator_ring_allreduce_inside_one_server(n):
    topo = build_topology(make_plan([("h", "H100", 1, 8)]))
    size = 64 << 20
    tb, end = generated_ring(list(range(n)), size, 8)
    tl = FlowBackend().run(tb.build(), topo, {})
    t = float(tl.frame["end_ns"].iloc[end])
    bw = 450.0  # NVLink bytes/ns; every ring hop is GPU -> NVSwitch -> GPU at 0.5 us per link
    assert t >= 2 * (n - 1) / n * size / bw
    assert t == pytest.approx(2 * (n - 1) * (size / n / bw + 1000.0), rel=1e-12)


def test_generator_ring_across_servers_follows_the_slow_nic():
    # 4 single-GPU servers, one A100 (200 Gb/s NIC) among H100s (400 Gb/s)
    plan = make_plan([("h", "H100", 3, 1), ("a", "A100", 1, 1)], ScaleOut(nodes_per_leaf=2))
    topo = build_topology(plan)
    size, n = 32 << 20, 4
    tb, end = generated_ring(list(range(n)), size, n)
    t = float(FlowBackend().run(tb.build(), topo, {}).frame["end_ns"].iloc[end])
    slow = 200 / 8
    assert t >= 2 * (n - 1) / n * size / slow
    # the slow NIC paces every step; latency at most 4 hops of 1 us per step
    assert t <= 2 * (n - 1) * (size / n / slow + 4000.0) * (1 + 1e-12)


@pytest.mark.parametrize(
    "name", ["homogeneous-h100", "hetero-pipeline-reshard", "uneven-layers"]
)
def test_shipped_plans_run_to_completion(name):
    plan = load_plan(WORKLOADS / f"{name}.yaml")
    trace = generate(plan)
    topo = build_topology(plan)
    tl = FlowBackend().run(trace, topo, {})
    tl.check_complete(trace)
    ops = trace.ops
    start = tl.frame["start_ns"].to_numpy()
    end = tl.frame["end_ns"].to_numpy()
    # every edge respected: a successor starts no earlier than its predecessor ends
    pred = trace.deps["pred"].to_numpy()
    succ = trace.deps["succ"].to_numpy()
    assert (start[succ] >= end[pred] - 1e-6).all()
    # compute ops take exactly their duration
    comp = (ops["kind"] == 0).to_numpy()
    np.testing.assert_allclose(end[comp] - start[comp], ops["duration_ns"].to_numpy()[comp])
    # no flow beats its own path: latency + bytes / bottleneck
    flows = np.flatnonzero((ops["kind"] == KIND_FLOW).to_numpy())
    off, links = topo.paths_for(ops["rank"].to_numpy()[flows], ops["dst"].to_numpy()[flows],
                                flows)
    gbps = topo.links["gbps"].to_numpy()[links]
    lat = topo.links["latency_ns"].to_numpy()[links]
    nonempty = np.diff(off) > 0
    starts = off[:-1][nonempty]
    bottleneck = np.minimum.reduceat(gbps, starts) / 8
    latency = np.add.reduceat(lat, starts)
    nbytes = ops["bytes"].to_numpy()[flows][nonempty]
    took = (end - start)[flows][nonempty]
    assert (took >= (latency + nbytes / bottleneck) * (1 - 1e-9)).all()
    # and the same run twice gives the same timeline
    again = FlowBackend().run(trace, topo, {})
    assert np.array_equal(again.frame["end_ns"].to_numpy(), end)
    assert tl.makespan_ns > 0
    assert ops["phase"].isin([PHASE_INDEX["fwd"], PHASE_INDEX["tp"]]).any()
