"""htsim against ns-3 on shipped plans, like for like: both with scale-up (intra-server) flows as
a fluid max-min share and NIC/fabric flows as packets (htsim RoCE, ns-3 UDP with deep queues:
both lossless stand-ins without congestion control), MTU 9000.

Needs HTSIM_DIR (or XSIM_HTSIM_DRIVER) and the ns-3 backend; each ns-3 run takes 10-50 s, so
these are marked slow and run only the two fastest plans of <= 16 GPUs. Tolerance: iteration
times within 1% of each other (measured: 0.04% on hetero-pipeline-reshard, 0.12% on
homogeneous-h100; both backends are within 0.2% of the flow backend there).
"""

from __future__ import annotations

import pytest
from helpers import REPO

pytestmark = [pytest.mark.htsim, pytest.mark.slow]

FASTEST = ["hetero-pipeline-reshard.yaml", "homogeneous-h100.yaml"]


@pytest.mark.parametrize("name", FASTEST)
def test_htsim_agrees_with_ns3(driver: str, name: str) -> None:
    import xsim_adapters as xs
    from xsim_adapters.backends.registry import get_backend

    ok, why = get_backend("ns3").available()
    if not ok:
        pytest.skip(f"ns-3 backend unavailable: {why}")
    plan = xs.load_plan(REPO / "workloads" / name)
    trace = xs.generate(plan)
    topo = xs.build_topology(plan)
    ht = xs.run(trace, "htsim", topology=topo, options={"driver": driver})
    ns = xs.run(trace, "ns3", topology=topo, options={"transport": "udp"})
    assert ht.stats["scale_up"] == "fluid" and ht.stats["fluid_flows"] > 0
    assert abs(ht.makespan_ns - ns.makespan_ns) <= 0.01 * ns.makespan_ns, (
        name, ht.makespan_ns, ns.makespan_ns)
