"""htsim backend with protocol=eqds (htsim's EqdsSrc/EqdsSink: receiver-driven pulls, trimming
switch queues, one EqdsNIC per sending link, one pull pacer per receiving link).

Needs HTSIM_DIR (or XSIM_HTSIM_DRIVER). Tolerances, and why:
- a single flow: within 2% + 1 us of S*8/B + path latency (measured +0.8%: 64-byte EQDS headers
  on 9000-byte packets, whole-packet store-and-forward, the first pull round trip).
- two senders into one 100 Gb/s NIC (incast): each within 2% of the fair-share closed form
  2S*8/B (measured -0.5% and +0.8%: pulls alternate between the senders packet by packet).
- an 8-GPU ring all-reduce over NICs: within 3% of the flow backend (measured +1.9%).
Run with scale_up=packet or NIC-tier links, so these exercise EQDS, not the fluid model.
"""

from __future__ import annotations

import pytest
from helpers.htsim import TraceBuilder, ring_allreduce, star
from xsim_htsim import HtsimBackend

from xsim_adapters.backends.flow import FlowBackend

pytestmark = pytest.mark.htsim


def run(trace, topo, driver: str, **opts):
    return HtsimBackend().run(trace, topo, {"driver": driver, "protocol": "eqds", **opts})


def test_eqds_single_flow_closed_form(driver: str) -> None:
    tb = TraceBuilder(2)
    tb.flow(0, 1, 8 << 20)
    tl = run(tb.build(), star(2, 200.0, latency_ns=700.0), driver, scale_up="packet")
    ideal = (8 << 20) * 8 / 200.0 + 2 * 700.0
    assert ideal <= tl.makespan_ns <= ideal * 1.02 + 1000.0
    assert (tl.stats["protocol"], tl.stats["flows"], tl.stats["fluid_flows"]) == ("eqds", 1, 0)


def test_eqds_incast_shares_the_receiver_fairly(driver: str) -> None:
    s, gbps = 8 << 20, 100.0
    tb = TraceBuilder(3)
    a = tb.flow(0, 2, s)
    b = tb.flow(1, 2, s)
    tl = run(tb.build(), star(3, gbps, tier="nic"), driver)
    fair = 2 * s * 8 / gbps + 1000.0
    ends = tl.frame["end_ns"]
    assert abs(ends[a] - fair) <= 0.02 * fair and abs(ends[b] - fair) <= 0.02 * fair
    # neither sender was served first: the pulls alternate
    assert min(ends[a], ends[b]) >= 0.95 * fair


def test_eqds_ring_all_reduce_near_flow_backend(driver: str) -> None:
    n = 8
    tb = TraceBuilder(n)
    ring_allreduce(tb, list(range(n)), 64 << 20)
    trace = tb.build()
    topo = star(n, 400.0, tier="nic")
    tl = run(trace, topo, driver)
    flow = FlowBackend().run(trace, topo, {})
    bound = 2 * (n - 1) / n * (64 << 20) * 8 / 400.0
    assert tl.makespan_ns >= bound
    assert abs(tl.makespan_ns - flow.makespan_ns) <= 0.03 * flow.makespan_ns
