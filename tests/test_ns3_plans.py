"""Every shipped plan of <= 16 GPUs runs to completion on ns-3, close to the flow backend.

Options: paced UDP (the lossless stand-in) with the scale-up tier fluid (the default), and
PLAN_MTU on NIC/fabric links. At MTU 9000 these plans push ~3 M packets each and take 80-100 s
of ns-3 time apiece on 2 cores; PLAN_MTU keeps the whole file well inside the CI budget while the
closed-form tests in test_ns3_backend.py cover MTU 9000 (numbers in docs/ns3.md).

Tolerance 2%: with uncongested rings the two backends differ only by packet headers (0.05% at
MTU 65000, 0.33% at 9000), one packet's store-and-forward per hop and per-step rounding to ns;
measured 0.04% (homogeneous-h100, MTU 9000). A 2% gap would mean a modelling error, not noise.
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
from helpers import REPO
from helpers.ns3 import HAVE_NS3

PLAN_MTU = 65000
TOLERANCE = 0.02


def shipped_plans() -> list[str]:
    return sorted(glob.glob(str(REPO / "workloads" / "*.yaml")))


def _small_plans() -> list[str]:
    from xsim_adapters.feasibility import load_plan

    out = []
    for p in shipped_plans():
        if Path(p).stem.startswith("congested-"):
            continue  # built to differ from the flow model: compared in docs/congestion.md
        plan = load_plan(p)
        if plan.network.measured is not None:
            # a wide-area hop (0.5 ms RTT): DCTCP's data-centre marking threshold underfills
            # it, +7.5% on two-site-measured; compared in docs/congestion.md, not held to 2%
            continue
        if sum(g.nodes for g in plan.device_groups) < 2:
            continue  # one server: no flow crosses the network, nothing is packets
        gpus = sum(g.nodes * g.gpus_per_node for g in plan.device_groups)
        if gpus <= 16:
            out.append(p)
    return out


@pytest.mark.ns3
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_NS3, reason="the ns-3 wheel is not installed (pip install ns3)")
@pytest.mark.parametrize("plan_path", _small_plans(), ids=lambda p: Path(p).stem)
def test_shipped_plan_matches_flow_backend(plan_path):
    from xsim_ns3 import Ns3Backend

    from xsim_adapters.backends.flow import FlowBackend
    from xsim_adapters.feasibility import load_plan
    from xsim_adapters.topology import build_topology
    from xsim_adapters.workload import generate

    plan = load_plan(plan_path)
    trace = generate(plan)
    assert trace.num_ranks <= 16
    topo = build_topology(plan)
    flow = FlowBackend().run(trace, topo, {})
    tl = Ns3Backend().run(trace, topo, {"transport": "udp", "mtu": PLAN_MTU})
    tl.check_complete(trace)
    assert tl.stats["packet_flows"] > 0 and tl.stats["fluid_flows"] > 0
    ratio = tl.makespan_ns / flow.makespan_ns
    assert abs(ratio - 1.0) <= TOLERANCE, f"ns3/flow iteration time ratio {ratio:.4f}"
