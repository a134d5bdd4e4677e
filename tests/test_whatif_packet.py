"""What-if runs on the packet backends: interval slowdowns and rerouting against closed forms,
queue telemetry on congested cases, and flow / ns-3 / htsim agreement on one plan with link
events, an interval slowdown and a reroute.

Tolerances (each measured on the loaded 2-core CI machine, then given headroom):

- A kernel stretched by a slowdown window is exact on both (ns-3: to the ns; htsim: to the ps).
- Rerouting mid-transfer, two 16 MB flows (closed form 2 B / R - t_f + latency for the later
  of the two, the flow backend's exact answer for both): htsim RoCE +1.6% (go-back-N resends
  what was in flight), EQDS +1.6%; ns-3 DCTCP within its stated 6% (slow start and header
  overhead, docs/ns3.md; DCTCP shares the live uplink unevenly, so one flow ends earlier).
  NDP never resends what a failed link swallowed: that run ends with the driver's stall
  message.
- The plan: flow vs htsim within 2%, ns-3 (UDP) vs htsim within 1%: the stated agreement of
  tests/test_htsim_ns3.py and docs/htsim.md on uncongested plans.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import REPO
from helpers import whatif as wh
from helpers.htsim import star

from xsim_adapters import api
from xsim_adapters.errors import BackendError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.testing import handmade

B = 16_000_000  # bytes per flow: 1.28 ms at 100 Gb/s
T_FAIL_NS = 400_000.0
PATH_LAT = 4 * wh.LAT_NS
REROUTED_NS = 2 * B / wh.RATE_B_PER_NS - T_FAIL_NS + PATH_LAT  # the closed form, both flows


def _ns3_or_skip() -> None:
    from xsim_adapters.backends.registry import get_backend

    ok, why = get_backend("ns3").available()
    if not ok:
        pytest.skip(f"ns-3 backend unavailable: {why}")


def _straddling_kernel(tb: handmade.TraceBuilder, rank: int) -> int:
    """A 100 us kernel at t = 0 on ``rank``; with the window below it ends at 150 us."""
    return tb.compute(rank, 100_000)


WINDOW = [{"ranks": [2], "factor": 2.0, "from_ns": 50_000.0, "until_ns": 10_000_000.0}]


def _reroute_case():
    """Two 16 MB flows on two spines, the first one's spine cable failing at 400 us, plus a
    kernel on rank 2 straddling a half-speed window's start (closed form 150 us)."""
    trace, topo, a, b = wh.two_flows_on_two_spines(B)
    tb = handmade.TraceBuilder(4)  # the same ops, plus the kernel at the end (its id: last)
    rows = trace.ops
    for r in rows.itertuples():
        if r.kind == 1:
            tb.flow(int(r.rank), int(r.dst), int(r.bytes))
        else:
            tb.compute(int(r.rank), int(r.duration_ns))
    k = _straddling_kernel(tb, 2)
    trace = tb.build()
    trace.manifest["compute_slowdowns"] = copy.deepcopy(WINDOW)
    wh.fail_cable(topo, "leaf0", f"spine{wh.spine_of(topo, topo.path(0, 2, a))}", T_FAIL_NS)
    return trace, topo, a, b, k


def _check_shared_end(end_a: float, end_b: float, tol: float) -> None:
    """From the failure on, both flows' remaining bytes cross one live uplink at R: the later
    one ends no earlier than the closed form (a transport may share unevenly, so the earlier
    one can end before it, but not before a flow alone would)."""
    assert REROUTED_NS <= max(end_a, end_b) <= tol * REROUTED_NS, (end_a, end_b)
    assert min(end_a, end_b) >= B / wh.RATE_B_PER_NS + PATH_LAT, (end_a, end_b)


# ------------------------------------------------------------------------------- htsim


@pytest.mark.htsim
@pytest.mark.parametrize(("protocol", "tol"), [("roce", 0.05), ("eqds", 0.05)])
def test_htsim_reroutes_mid_transfer_and_stretches_the_kernel(driver, protocol, tol):
    trace, topo, a, b, k = _reroute_case()
    tl = api.run(trace, "htsim", topo, {"driver": driver, "protocol": protocol})
    end = tl.frame.set_index("op_id")["end_ns"]
    assert end[k] == 150_000.0  # to the ps
    _check_shared_end(end[a], end[b], 1 + tol)
    assert tl.stats["reroutes"] == 1
    flow = api.run(trace, "flow", topo, {})
    assert flow.frame["end_ns"][a] == pytest.approx(REROUTED_NS, rel=1e-12)


@pytest.mark.htsim
def test_htsim_roce_resends_what_a_dead_queue_swallowed_after_its_last_packet(driver):
    """Two 1 MB flows from leaf 0 share one spine uplink (2 x 100G into 100G): by 80 us both
    sources have paced out every packet and about half of them wait in that uplink's queue.
    The cable fails at 85 us: those packets are lost, and no later packet comes to draw a NAK.
    The moved flows' retransmission timer (RoCE's 1 ms minimum RTO, checked once per timeout:
    it fires one to two timeouts after the last packet or ACK) resends from the last ACK over
    the other spine: both end after t_f + 1 ms and before t_f + 2 ms + the time to send both
    flows again."""
    trace, topo, a, b = wh.two_flows_on_two_spines(1_000_000, same=True)
    t_f = 85_000.0
    wh.fail_cable(topo, "leaf0", f"spine{wh.spine_of(topo, topo.path(0, 2, a))}", t_f)
    tl = api.run(trace, "htsim", topo, {"driver": driver})
    end = tl.frame["end_ns"]
    for op in (a, b):
        assert t_f + 1e6 <= end[op] <= t_f + 2e6 + 2 * 1_000_000 / wh.RATE_B_PER_NS + 10_000, (
            op, end[op])
    assert tl.stats["reroutes"] == 2


@pytest.mark.htsim
def test_htsim_ndp_cannot_recover_what_a_failed_link_swallowed(driver):
    trace, topo, *_ = _reroute_case()
    with pytest.raises(BackendError, match=r"no op ended for 60 s of simulated time after the "
                                           r"last link event .*\(NDP resends only trimmed"):
        api.run(trace, "htsim", topo, {"driver": driver, "protocol": "ndp"})


@pytest.mark.htsim
def test_htsim_flow_starting_on_its_detour_closed_form(driver):
    """The spine cable is down from 10 us; the flow starts at 50 us on its detour: 50 us +
    B / R + latency (+ store-and-forward of one 9000-byte packet per extra hop, < 1%)."""
    topo = wh.two_spines()
    tb = handmade.TraceBuilder(4)
    a = tb.flow(0, 2, B, deps=[tb.compute(0, 50_000)])
    trace = tb.build()
    wh.fail_cable(topo, "leaf0", f"spine{wh.spine_of(topo, topo.path(0, 2, a))}", 10_000.0)
    tl = api.run(trace, "htsim", topo, {"driver": driver})
    want = 50_000 + B / wh.RATE_B_PER_NS + PATH_LAT
    assert want <= tl.frame["end_ns"][a] <= 1.01 * want
    assert tl.stats["reroutes"] == 1


@pytest.mark.htsim
def test_htsim_interval_slowdown_closed_form_on_one_rank(driver):
    """The flow backend's closed forms of test_whatif_intervals.py, to the ps: 100 us from 0 at
    half speed from 50 us ends at 150 us; the next 20 us kernel takes 40 us."""
    tb = handmade.TraceBuilder(1)
    a = tb.compute(0, 100_000)
    tb.compute(0, 20_000, deps=[a])
    trace = tb.build()
    trace.manifest["compute_slowdowns"] = [
        {"ranks": [0], "factor": 2.0, "from_ns": 50_000.0, "until_ns": 1_000_000.0}]
    tl = api.run(trace, "htsim", star(1, 100.0), {"driver": driver})
    assert tl.frame["end_ns"].tolist() == [150_000.0, 190_000.0]


@pytest.mark.htsim
def test_htsim_queue_telemetry_on_the_shipped_incast(driver):
    """congested-incast-slow-nic: four 400G senders converge on one 100G port every
    micro-batch. The leaf's port into that A100 holds the deepest queue of the run; the flow
    backend has no queues (NaN)."""
    plan = api.load_plan(REPO / "workloads" / "congested-incast-slow-nic.yaml")
    trace = api.generate(plan)
    topo = api.build_topology(plan)
    tl = api.run(trace, "htsim", topo, {"driver": driver})
    links = api.link_metrics(trace, tl, topo)
    hot = links.sort_values("queue_peak_bytes", ascending=False).iloc[0]
    assert (hot["src"], hot["dst"]) == ("leaf0", "gpu4")
    assert hot["queue_peak_bytes"] > 10 * 9000 and hot["queue_mean_bytes"] > 0
    assert links["drops"].sum() == 0  # RoCE's deep queues stand in for a lossless fabric
    flow = api.link_metrics(trace, api.run(trace, "flow", topo), topo)
    assert flow["queue_peak_bytes"].isna().all()
    assert np.array_equal(flow["bytes"].to_numpy(), links["bytes"].to_numpy())


# ------------------------------------------------------------------------------- ns-3


@pytest.mark.slow
@pytest.mark.ns3
def test_ns3_reroutes_mid_transfer_stretches_the_kernel_and_shows_the_queue():
    """One DCTCP replay of the reroute case: the host routes of the failed flow's pair move to
    the other spine at 400 us (its packets on the dead cable are lost and TCP resends them),
    both flows then share leaf0's one live uplink (a 2-to-1 incast: a queue, ECN marks), and
    the kernel ends at 150 us to the ns."""
    _ns3_or_skip()
    trace, topo, a, b, k = _reroute_case()
    tl = api.run(trace, "ns3", topo, {})
    end = tl.frame.set_index("op_id")["end_ns"]
    assert end[k] == 150_000.0
    _check_shared_end(end[a], end[b], 1.06)
    assert tl.stats["reroutes_applied"] >= 1
    links = api.link_metrics(trace, tl, topo)
    live = links[(links["src"] == "leaf0") & links["dst"].str.startswith("spine")
                 & (links["bytes"] > 0)]
    assert len(live) >= 1
    up = links.loc[live.index[live["queue_peak_bytes"].argmax()]]
    assert up["queue_peak_bytes"] > 10 * 9000 and up["ecn_marks"] > 0
    assert links["queue_peak_bytes"].notna().sum() > 0


# --------------------------------------------------------------- one plan, three backends

AGREE_PLAN = {
    "name": "whatif-agree", "model": "tiny-gpt",
    "training": {"global_batch": 4, "micro_batch": 1},
    "device_groups": {"h100": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 1}},
    # 200G spine links: each leaf has two uplinks, to two spines (two equal-cost paths)
    "network": {"scale_out": {"link_gbps": 200, "nodes_per_leaf": 1}},
    "replicas": {"uniform": {"group": "h100", "tp": 1, "dp": 2}},
}


def agree_plan():
    """AGREE_PLAN with: the spine cable that rank 0's first DP flow (and so ns-3's pair
    0 -> 1) would use failing at 0 and never coming back (every flow over it starts on the
    other spine, on every backend), the other spine's cable into leaf 1 at half rate from 6 to
    8 ms (during the DP sync), and rank 1 at 1/1.5 speed from 1 to 2 ms (during backward)."""
    base = plan_from_dict(copy.deepcopy(AGREE_PLAN))
    trace = api.generate(base)
    topo = api.build_topology(base)
    o = trace.ops
    first = int(o.index[(o["kind"] == 1) & (o["rank"] == 0) & (o["dst"] == 1)][0])
    sp = wh.spine_of(topo, topo.path(0, 1, first))
    d = copy.deepcopy(AGREE_PLAN)
    d["network"]["events"] = [
        {"at_us": 0, "kind": "fail", "src": "leaf0", "dst": f"spine{sp}"},
        {"at_us": 6000, "kind": "degrade", "src": "leaf1", "dst": f"spine{1 - sp}",
         "factor": 0.5},
        {"at_us": 8000, "kind": "restore", "src": "leaf1", "dst": f"spine{1 - sp}"},
    ]
    d["perturb"] = {"slow": [{"rank": 1, "factor": 1.5, "from_us": 1000, "until_us": 2000}]}
    return plan_from_dict(d), base


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.htsim
def test_link_events_slowdown_and_reroute_agree_on_flow_ns3_and_htsim(driver):
    _ns3_or_skip()
    plan, base = agree_plan()
    trace = api.generate(plan)
    assert trace.ops.equals(api.generate(base).ops)  # the what-ifs are not in the ops
    topo = api.build_topology(plan)
    flow = api.run(trace, "flow", topo)
    ht = api.run(trace, "htsim", topo, {"driver": driver})
    ns = api.run(trace, "ns3", topo, {"transport": "udp"})
    alone = api.run(api.generate(base), "flow", api.build_topology(base)).makespan_ns
    assert flow.makespan_ns > alone * 1.05  # the what-ifs cost something
    assert flow.stats["reroutes"] > 0 and ht.stats["reroutes"] > 0
    assert ns.stats["reroutes_applied"] > 0
    assert abs(ht.makespan_ns - flow.makespan_ns) <= 0.02 * flow.makespan_ns, (
        ht.makespan_ns, flow.makespan_ns)
    assert abs(ns.makespan_ns - ht.makespan_ns) <= 0.01 * ht.makespan_ns, (
        ns.makespan_ns, ht.makespan_ns)
