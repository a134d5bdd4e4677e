"""htsim scale_up=fluid: intra-server flows as a max-min fair share, timed in the driver.

The writer's per-flow scale-up flag runs without htsim; the rest needs HTSIM_DIR (or
XSIM_HTSIM_DRIVER). Tolerances, and why:
- closed forms and the flow backend on hand-built stars: 1 ps per op per rate change. The
  driver keeps remaining bytes in floating point and rounds each completion up to htsim's
  picosecond clock; the flow backend works in float nanoseconds.
- a topology mixing scale-up and NIC links: the packet flows carry htsim's usual 0.3-1% (whole
  MTU packets, ACK pacing), so 3% of the flow backend, as for shipped plans.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.htsim import TraceBuilder, golden_case, ring_allreduce, star
from xsim_htsim import HtsimBackend, write_input
from xsim_htsim._input import read_input

from xsim_adapters.backends.flow import FlowBackend

PS = 1e-3  # one picosecond in ns


def test_writer_flags_flows_whose_whole_path_is_scale_up(tmp_path: Path) -> None:
    trace, topo = golden_case()  # ranks 0, 1 on scale-up links; ranks 2, 3 on NICs
    info = write_input(trace, topo, tmp_path / "in.bin")
    d = read_input(tmp_path / "in.bin")
    flagged = []
    for op in trace.flows().itertuples():
        assert d["scale_up"][op.op_id] in (0, 1)
        if d["scale_up"][op.op_id]:
            flagged.append((op.rank, op.dst))
    assert not d["scale_up"][trace.ops["kind"].to_numpy() != 1].any()
    # only the ring's 0 -> 1 hop (6 steps) is intra scale-up; 1 -> 1 is local, 2 -> 3 is NIC
    assert flagged == [(0, 1)] * 6
    assert info.scale_up_flows == 6


def test_writer_flag_needs_every_forward_link(tmp_path: Path) -> None:
    # GPU 0 is on a scale-up cable, GPU 1 on a NIC: 0 -> 1 crosses one NIC link, so packets.
    tb = TraceBuilder(2)
    tb.flow(0, 1, 1000)
    tb.flow(1, 0, 1000)
    write_input(tb.build(), star(2, 100.0, tier=["scale_up", "nic"]), tmp_path / "in.bin")
    assert read_input(tmp_path / "in.bin")["scale_up"].tolist() == [0, 0]


# ---- with the real driver --------------------------------------------------------------------

def run(trace, topo, driver: str, **opts):
    return HtsimBackend().run(trace, topo, {"driver": driver, **opts})


@pytest.mark.htsim
def test_one_fluid_flow_is_the_closed_form(driver: str) -> None:
    tb = TraceBuilder(2)
    tb.flow(0, 1, 8 << 20)
    trace = tb.build()
    tl = run(trace, star(2, 200.0, latency_ns=700.0), driver)
    assert tl.frame.loc[0, "end_ns"] == pytest.approx((8 << 20) * 8 / 200.0 + 2 * 700.0, abs=PS)
    assert (tl.stats["scale_up"], tl.stats["flows"], tl.stats["fluid_flows"]) == ("fluid", 0, 1)
    # the default is fluid; packet mode sends the same flow as htsim packets
    pk = run(trace, star(2, 200.0, latency_ns=700.0), driver, scale_up="packet")
    assert (pk.stats["flows"], pk.stats["fluid_flows"]) == (1, 0)
    assert pk.makespan_ns > tl.makespan_ns


@pytest.mark.htsim
def test_two_flows_sharing_an_uplink_get_half_each(driver: str) -> None:
    nbytes, gbps, lat = 4 << 20, 400.0, 500.0
    tb = TraceBuilder(3)
    tb.flow(0, 1, nbytes)
    tb.flow(0, 2, nbytes)
    trace = tb.build()
    topo = star(3, gbps, latency_ns=lat)
    tl = run(trace, topo, driver)
    both = 2 * nbytes * 8 / gbps + 2 * lat
    assert tl.frame["end_ns"].tolist() == pytest.approx([both, both], abs=PS)
    flow = FlowBackend().run(trace, topo, {})
    assert np.allclose(tl.frame["end_ns"], flow.frame["end_ns"], rtol=0, atol=PS)


@pytest.mark.htsim
def test_rates_are_recomputed_when_a_flow_ends(driver: str) -> None:
    # A (S bytes) and B (2S) share GPU 0's uplink: half each until A ends at 2S/C, then B alone
    # at full rate sends its last S bytes: 3S/C. Each ends one path latency after its last byte.
    s, gbps, lat = 1 << 20, 100.0, 250.0
    tb = TraceBuilder(3)
    a = tb.flow(0, 1, s)
    b = tb.flow(0, 2, 2 * s)
    trace = tb.build()
    topo = star(3, gbps, latency_ns=lat)
    tl = run(trace, topo, driver)
    assert tl.frame.loc[a, "end_ns"] == pytest.approx(2 * s * 8 / gbps + 2 * lat, abs=PS)
    assert tl.frame.loc[b, "end_ns"] == pytest.approx(3 * s * 8 / gbps + 2 * lat, abs=2 * PS)
    assert tl.stats["fluid_recomputes"] >= 3  # two arrivals and a departure


@pytest.mark.htsim
def test_max_min_on_heterogeneous_links_matches_flow_backend(driver: str) -> None:
    # GPU 0 (400 Gb/s) sends to GPU 1 (100) and GPU 2 (400): max-min gives 100 and 300, and
    # when the flow to GPU 1 ends the other takes the whole uplink; a late flow 3 -> 2 then
    # shares GPU 2's downlink.
    tb = TraceBuilder(4)
    f1 = tb.flow(0, 1, 2 << 20)
    f2 = tb.flow(0, 2, 12 << 20)
    c = tb.compute(3, 100_000)
    f3 = tb.flow(3, 2, 4 << 20)
    tb.dep(c, f3)
    trace = tb.build()
    topo = star(4, [400.0, 100.0, 400.0, 400.0], latency_ns=300.0)
    tl = run(trace, topo, driver)
    flow = FlowBackend().run(trace, topo, {})
    assert np.allclose(tl.frame["start_ns"], flow.frame["start_ns"], rtol=0, atol=PS)
    assert np.allclose(tl.frame["end_ns"], flow.frame["end_ns"], rtol=0, atol=5 * PS)
    assert tl.frame.loc[f1, "end_ns"] == pytest.approx((2 << 20) * 8 / 100.0 + 600.0, abs=PS)
    assert tl.frame.loc[f3, "start_ns"] == 100_000.0
    assert tl.frame.loc[f2, "end_ns"] > tl.frame.loc[f3, "start_ns"]  # they did overlap


@pytest.mark.htsim
@pytest.mark.parametrize("protocol", ["roce", "ndp"])
def test_fluid_ring_all_reduce_equals_flow_backend(driver: str, protocol: str) -> None:
    n, size = 8, 64 << 20
    tb = TraceBuilder(n)
    ring_allreduce(tb, list(range(n)), size)
    trace = tb.build()
    topo = star(n, 400.0, latency_ns=500.0)
    tl = run(trace, topo, driver, protocol=protocol)
    flow = FlowBackend().run(trace, topo, {})
    # 14 dependent steps, at most a picosecond of rounding each
    assert np.allclose(tl.frame["end_ns"], flow.frame["end_ns"], rtol=0, atol=14 * PS)
    assert tl.stats["events"] < 10 * tl.stats["fluid_flows"]  # no packets were simulated


@pytest.mark.htsim
@pytest.mark.parametrize("protocol", ["roce", "ndp"])
def test_fluid_flow_hands_over_to_a_packet_flow(driver: str, protocol: str) -> None:
    # 0 -> 1 is all scale-up (fluid, exact); 1 -> 2 ends on rank 2's 200 Gb/s NIC (packets,
    # htsim's usual whole-packet overhead: within 2% + 1 us of the closed form).
    s, lat = 4 << 20, 500.0
    tb = TraceBuilder(3)
    f1 = tb.flow(0, 1, s)
    f2 = tb.flow(1, 2, s)
    tb.dep(f1, f2)
    topo = star(3, [400.0, 400.0, 200.0], latency_ns=lat, tier=["scale_up", "scale_up", "nic"])
    tl = run(tb.build(), topo, driver, protocol=protocol)
    assert (tl.stats["fluid_flows"], tl.stats["flows"]) == (1, 1)
    t1 = s * 8 / 400.0 + 2 * lat
    assert tl.frame.loc[f1, "end_ns"] == pytest.approx(t1, abs=PS)
    assert tl.frame.loc[f2, "start_ns"] == tl.frame.loc[f1, "end_ns"]
    ideal = s * 8 / 200.0 + 2 * lat
    took = tl.frame.loc[f2, "end_ns"] - tl.frame.loc[f2, "start_ns"]
    assert ideal <= took <= ideal * 1.02 + 1000.0


@pytest.mark.htsim
def test_zero_latency_successor_joins_the_same_server(driver: str) -> None:
    # With zero latency a flow's end starts its successor inside the completion event; the
    # successor joins the same server's fluid group while a third flow is still running.
    s = 1 << 20
    tb = TraceBuilder(3)
    f1 = tb.flow(0, 1, s)
    tb.flow(2, 1, 2 * s)  # a third flow, still running when f1 ends
    f2 = tb.flow(0, 2, s)
    tb.dep(f1, f2)
    trace = tb.build()
    topo = star(3, 100.0, latency_ns=0.0)
    tl = run(trace, topo, driver)
    flow = FlowBackend().run(trace, topo, {})
    assert np.allclose(tl.frame["end_ns"], flow.frame["end_ns"], rtol=0, atol=3 * PS)
    # f1 and f3 share GPU 1's downlink (50 each) until f1 ends at 2S/B; f3 then runs alone
    # (its remaining S bytes at 100) while f2 uses other links: both end at 3S/B.
    t = s * 8 / 100.0
    assert tl.frame["end_ns"].tolist() == pytest.approx([2 * t, 3 * t, 3 * t], abs=3 * PS)
