"""ns-3 backend on hand-built networks: closed-form times, heterogeneity, failures, availability.

Every replay costs ~10 s of ns-3 import in its worker process, so each test runs few replays
and replays are shared through module-scoped fixtures.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from helpers.ns3 import HAVE_NS3, TraceBuilder, star_topology

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.errors import BackendError, BackendUnavailable

MiB = 1 << 20
NIC_GBPS = 100.0
NIC_LAT_NS = 1000.0
ns3_only = [
    pytest.mark.ns3,
    pytest.mark.skipif(not HAVE_NS3, reason="the ns-3 wheel is not installed (pip install ns3)"),
]


def _mark(f):
    for m in ns3_only:
        f = m(f)
    return f


def serial_ns(nbytes: float, gbps: float) -> float:
    return nbytes * 8 / gbps


def single_then_ring(servers: int = 8, flow_bytes: int = 16 * MiB, ring_bytes: int = 64 * MiB):
    """Op 0: one flow rank 0 -> rank 1 (different servers); then a ring over all ranks."""
    tb = TraceBuilder(servers)
    first = tb.flow(0, 1, flow_bytes)
    gate = tb.barrier((first,))
    n = servers
    chunk = ring_bytes // n
    prev: dict[int, int] = {}
    for step in range(2 * (n - 1)):
        cur = {}
        for r in range(n):
            dep = (prev[(r - 1) % n],) if step else (gate,)
            cur[r] = tb.flow(r, (r + 1) % n, chunk, dep, collective=0, step=step, channel=0)
        prev = cur
    return tb.build()


def segment_times(tl, trace) -> tuple[float, float]:
    """(single flow duration, ring duration) in ns from a single_then_ring timeline."""
    f = tl.frame
    single = float(f["end_ns"].iat[0] - f["start_ns"].iat[0])
    ring = float(f["end_ns"].iloc[2:].max() - f["start_ns"].iloc[2:].min())
    return single, ring


@pytest.fixture(scope="module")
def ns3():
    from xsim_ns3 import Ns3Backend

    return Ns3Backend()


@pytest.fixture(scope="module")
def uniform():
    topo = star_topology(8, 1, NIC_GBPS, nic_latency_ns=NIC_LAT_NS)
    trace = single_then_ring()
    flow = FlowBackend().run(trace, topo, {})
    return topo, trace, flow


# ---------------------------------------------------------------- no ns-3 needed
def test_available_reason_when_ns_is_missing(monkeypatch):
    from xsim_ns3 import Ns3Backend

    monkeypatch.setitem(sys.modules, "ns", None)  # find_spec then reports the module missing
    ok, why = Ns3Backend.available()
    assert not ok
    assert "ModuleNotFoundError: No module named 'ns'" in why
    assert "pip install ns3" in why
    tb = TraceBuilder(2)
    tb.flow(0, 1, MiB)
    with pytest.raises(BackendUnavailable, match="pip install ns3"):
        Ns3Backend().run(tb.build(), star_topology(2, 1), {})


def test_unknown_and_bad_options_are_named():
    from xsim_ns3 import parse_options

    with pytest.raises(BackendError, match=r"unknown option 'trasnport' for backend ns3; did you"
                       r" mean 'transport'\? allowed: .*transport"):
        parse_options({"trasnport": "udp"})
    with pytest.raises(BackendError, match=r"transport: must be one of .* \(got 'roce'\)"):
        parse_options({"transport": "roce"})
    with pytest.raises(BackendError,
                       match=r"mtu: expected an integer >= 576 and <= 65535 \(got 70000\)"):
        parse_options({"mtu": 70000})


def test_prepare_routes_follow_topology_paths():
    """A packet pair's forward host routes are exactly the cables of its Topology.path."""
    from xsim_ns3 import parse_options
    from xsim_ns3._prepare import _cables, prepare

    topo = star_topology(4, 2)
    tb = TraceBuilder(8)
    tb.ring_all_reduce(list(range(8)), 8 * MiB)
    trace = tb.build()
    rin = prepare(trace, topo, parse_options({}))
    a = rin.arrays
    # Ring hops 0->1, 2->3, ... stay in a server (fluid); 1->2, 3->4, 5->6, 7->0 cross (packets).
    assert rin.meta["fluid_pairs"] == 4 and rin.meta["packet_pairs"] == 4
    cable_of, side_of, pairs = _cables(topo.links)
    # Every directed link is in exactly one cable, and a cable's two links are opposite.
    src, dst = topo.links["src"].to_numpy(), topo.links["dst"].to_numpy()
    assert (src[pairs[0]] == dst[pairs[1]]).all() and (dst[pairs[0]] == src[pairs[1]]).all()
    key = int(np.flatnonzero((trace.ops["rank"] == 1).to_numpy())[0])
    path = topo.path(1, 2, key)
    hops = np.flatnonzero(a["route_addr"] == a["conn_daddr"][0])
    # Cable indices in the arrays are renumbered to the used ones, in sorted order.
    used = sorted({int(cable_of[x]) for x in np.concatenate([topo.path(s, d, 0) for s, d in
                                                              ((1, 2), (2, 1))])})
    assert len(hops) == len(path)
    assert a["route_side"][hops].tolist() == side_of[path].tolist()
    assert set(a["cable_mtu"].tolist()) == {9000}
    assert len(used) == 2 and len(a["cable_a"]) == 8  # every GPU NIC cable, once


# ---------------------------------------------------------------- ns-3 runs
@_mark
def test_single_flow_and_ring_closed_form_udp(ns3, uniform):
    """Paced UDP, 8 servers through one leaf at 100 Gb/s.

    Closed form, single flow: S*8/B + 2 hops of latency + one packet's store-and-forward at the
    leaf. Ring: 2(n-1) steps of S/n each. Tolerance 1%: UDP/IPv4/PPP headers add 30 bytes per
    8970-byte datagram (0.33%) and each step pays one packet's store-and-forward (0.7 µs of 671).
    """
    topo, trace, flow = uniform
    tl = ns3.run(trace, topo, {"transport": "udp"})
    single, ring = segment_times(tl, trace)
    closed_single = serial_ns(16 * MiB, NIC_GBPS) + 2 * NIC_LAT_NS
    closed_ring = 14 * (serial_ns(8 * MiB, NIC_GBPS) + 2 * NIC_LAT_NS)
    assert single == pytest.approx(closed_single, rel=0.01)
    assert ring == pytest.approx(closed_ring, rel=0.01)
    assert single > closed_single and ring > closed_ring  # never faster than the wire allows
    fs, fr = segment_times(flow, trace)
    assert single == pytest.approx(fs, rel=0.01) and ring == pytest.approx(fr, rel=0.01)
    assert tl.stats["transport"] == "udp" and tl.stats["events"] > 100_000
    assert tl.stats["sim_time_ns"] == pytest.approx(tl.makespan_ns, abs=1)


@_mark
def test_single_flow_and_ring_dctcp(ns3, uniform):
    """DCTCP (default transport) within 6% of the closed form and of the flow backend.

    6%: TCP headers (0.6%), slow start on each connection's first flow, and ACKs queued behind
    data on the shared NIC links (measured 3.7% on this ring).
    """
    topo, trace, flow = uniform
    tl = ns3.run(trace, topo, {})
    single, ring = segment_times(tl, trace)
    fs, fr = segment_times(flow, trace)
    assert tl.stats["transport"] == "dctcp"
    assert fs <= single <= fs * 1.06
    assert fr <= ring <= fr * 1.06


@_mark
def test_one_slow_nic_slows_the_ring_by_the_bandwidth_ratio(ns3):
    """Rank 3's NIC at 40 Gb/s (the rest 100): every ring step waits on it, so the ring takes
    100/40 = 2.5x the uniform ring's serialization time (plus the same latency). 1%: as above."""
    nic = [NIC_GBPS] * 8
    nic[3] = 40.0
    topo = star_topology(8, 1, nic, nic_latency_ns=NIC_LAT_NS)
    trace = single_then_ring()
    tl = ns3.run(trace, topo, {"transport": "udp"})
    _, ring = segment_times(tl, trace)
    closed = 14 * (serial_ns(8 * MiB, 40.0) + 2 * NIC_LAT_NS)
    assert ring == pytest.approx(closed, rel=0.01)
    uniform_ring = 14 * (serial_ns(8 * MiB, NIC_GBPS) + 2 * NIC_LAT_NS)
    assert ring / uniform_ring == pytest.approx(
        (serial_ns(8 * MiB, 40.0) + 2000) / (serial_ns(8 * MiB, 100.0) + 2000), rel=0.01
    )


@_mark
def test_fluid_scale_up_matches_flow_backend_and_fair_share(ns3):
    """Inside one server (NVSwitch star, 2400 Gb/s) flows are timed by the engine's fluid model:
    two flows into one GPU share its downlink (each gets half), computes and barriers chain.
    Exact to 1 ns per op against the flow backend (ns-3 time is integer ns)."""
    topo = star_topology(1, 4, nvlink_gbps=2400.0, nvlink_latency_ns=250.0)
    tb = TraceBuilder(4)
    c = tb.compute(0, 5000)
    a = tb.flow(1, 0, 64 * MiB, (c,))
    b = tb.flow(2, 0, 64 * MiB, (c,))
    d = tb.flow(3, 1, 32 * MiB, (c,))
    j = tb.barrier((a, b, d))
    tb.compute(2, 1000, (j,))
    trace = tb.build()
    tl = ns3.run(trace, topo, {})
    flow = FlowBackend().run(trace, topo, {})
    assert tl.stats["packet_flows"] == 0 and tl.stats["fluid_flows"] == 3
    np.testing.assert_allclose(tl.frame["end_ns"], flow.frame["end_ns"], atol=2.0)
    shared = serial_ns(64 * MiB, 1200.0) + 500.0  # half of 2400 Gb/s, two 250 ns hops
    assert tl.frame["end_ns"].iat[1] - 5000 == pytest.approx(shared, abs=2)


@_mark
def test_lost_udp_packets_end_in_a_stall_error_listing_ops(ns3):
    """Two paced senders into one receiver with 2-packet queues: the leaf drops, UDP never
    retransmits, the event queue runs dry; the error names the ops that never completed."""
    topo = star_topology(3, 1)
    tb = TraceBuilder(3)
    tb.flow(1, 0, 4 * MiB)
    tb.flow(2, 0, 4 * MiB)
    tb.compute(0, 100, (0, 1))
    with pytest.raises(BackendError) as ei:
        ns3.run(tb.build(), topo, {"transport": "udp", "queue_packets": 2, "ecn_k_packets": 1,
                                   "device_queue_packets": 1})
    msg = str(ei.value)
    assert "ns3: replay stalled at t=" in msg
    assert "ops never completed" in msg and "event queue ran dry" in msg
    assert "flow rank 1->0, 4194304 B, phase dp" in msg or "flow rank 2->0" in msg
    assert "op 2 (compute rank 0, 100 ns, phase fwd)" in msg


@_mark
def test_wall_limit_ends_in_backend_error(ns3):
    tb = TraceBuilder(2)
    tb.flow(0, 1, MiB)
    with pytest.raises(BackendError, match=r"exceeded wall_limit_s=0.5 s.*no partial timeline"):
        ns3.run(tb.build(), star_topology(2, 1), {"wall_limit_s": 0.5})


@_mark
def test_link_events_degrade_packet_and_fluid_links(ns3):
    """At t = 400 µs, rank 2's NIC downlink and server 0's NVLink into rank 0 drop to half.

    Flow A (rank 0 -> rank 2, different servers, packets, 16 MiB at 100 Gb/s) and flow B
    (rank 1 -> rank 0, same server, fluid, 256 MiB at 2400 Gb/s) both straddle the change, so
    each takes 400 µs at full rate and the rest at half. Closed form and flow backend within
    1% for the packet flow (UDP headers, store-and-forward), 2 ns for the fluid one.
    """
    import pandas as pd

    topo = star_topology(2, 2, nic_latency_ns=NIC_LAT_NS)
    links = topo.links
    leaf = int(topo.nodes.index[topo.nodes["kind"] == "leaf"][0])
    nvs0 = int(topo.nodes.index[topo.nodes["name"] == "nvs0"][0])
    down_nic = int(links.index[(links["src"] == leaf) & (links["dst"] == 2)][0])
    down_nvl = int(links.index[(links["src"] == nvs0) & (links["dst"] == 0)][0])
    topo.events = pd.DataFrame({
        "at_ns": np.array([400_000.0, 400_000.0]),
        "link_id": np.array([down_nic, down_nvl], np.int32),
        "factor": np.array([0.5, 0.5]),
    })
    tb = TraceBuilder(4)
    tb.flow(0, 2, 16 * MiB)
    tb.flow(1, 0, 256 * MiB)
    trace = tb.build()
    tl = ns3.run(trace, topo, {"transport": "udp"})
    flow = FlowBackend().run(trace, topo, {})
    assert tl.stats["packet_flows"] == 1 and tl.stats["fluid_flows"] == 1

    def closed(nbytes: float, gbps: float, lat: float) -> float:
        done_bits = 400_000.0 * gbps
        return 400_000.0 + (nbytes * 8 - done_bits) / (gbps / 2) + lat

    ends = tl.frame["end_ns"].to_numpy()
    assert ends[0] == pytest.approx(closed(16 * MiB, 100.0, 2 * NIC_LAT_NS), rel=0.01)
    assert ends[0] == pytest.approx(flow.frame["end_ns"].iat[0], rel=0.01)
    assert ends[1] == pytest.approx(closed(256 * MiB, 2400.0, 500.0), abs=2)
    assert ends[1] == pytest.approx(flow.frame["end_ns"].iat[1], abs=2)


@_mark
def test_scale_up_packet_mode_uses_nvswitch_packets(ns3):
    """scale_up=packet: an intra-server flow becomes packets through the NVSwitch node, with
    MTU scale_up_mtu on the NVLink cables; closed form S*8/B + 2 hops + one 65000-byte
    store-and-forward at the switch (0.2 µs). 1%: UDP headers are 30 B per 64970 B datagram."""
    topo = star_topology(1, 2, nvlink_gbps=2400.0, nvlink_latency_ns=250.0)
    tb = TraceBuilder(2)
    tb.flow(0, 1, 64 * MiB)
    tl = ns3.run(tb.build(), topo, {"transport": "udp", "scale_up": "packet"})
    assert tl.stats["packet_flows"] == 1 and tl.stats["fluid_flows"] == 0
    assert tl.stats["cables"] == 2  # gpu0-nvs0 and nvs0-gpu1
    closed = serial_ns(64 * MiB, 2400.0) + 500.0
    assert tl.makespan_ns == pytest.approx(closed, rel=0.01)
    assert tl.makespan_ns > closed
    assert tl.stats["packets_received"] == -(-64 * MiB // (65000 - 28))
