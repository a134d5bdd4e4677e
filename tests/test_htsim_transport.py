"""htsim with the plan's network.transport (docs/transport.md): PFC, ECN, DCQCN, HPCC.

Small hand-built fabrics, 100 Gb/s host links (tier nic, so every flow is packets). Each test
states what would make it fail:
- incast into one port through a shared buffer too small for it: drop-tail drops packets at
  that port, PFC drops none (and pauses the senders instead);
- a victim flow that shares only the upstream switch-to-switch link with an incast ends at line
  rate without PFC and at least 20% later with PFC (congestion spreading by PAUSE);
- DCQCN, a flow joining a running one on a 100 Gb/s bottleneck: both end within 10% of each
  other (fair share after convergence) and of the fair closed form, with the bottleneck's
  time-mean queue between Kmin and Kmax and no PAUSE frame (ECN, not PFC, held the queue);
- DCQCN, one flow through a bottleneck at half its NIC rate: at least 90% of the bottleneck's
  line rate over the whole transfer although it is marked and cut;
- HPCC against DCQCN on the same two-flow incast: HPCC's peak and mean bottleneck queue are
  lower.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from helpers.htsim import TraceBuilder, star
from xsim_htsim import HtsimBackend

from xsim_adapters.plan.transport import DcqcnSpec, EcnSpec, PfcSpec, TransportSpec
from xsim_adapters.topology import Router, Topology

pytestmark = pytest.mark.htsim

GBPS = 100.0
LAT_NS = 500.0




def run(trace, topo: Topology, driver: str, spec: TransportSpec | None):
    topo = dataclasses.replace(topo, transport=spec)
    return HtsimBackend().run(trace, topo, {"driver": driver})


def two_switches(n_left: int, n_right: int, core_gbps: float) -> Topology:
    """Hosts 0..n_left-1 on switch L, hosts n_left.. on switch R, one L<->R link pair."""
    n = n_left + n_right
    sw_l, sw_r = n, n + 1
    nodes = pd.DataFrame({
        "node_id": np.arange(n + 2, dtype=np.int32),
        "kind": ["gpu"] * n + ["leaf", "leaf"],
        "name": [f"gpu{i}" for i in range(n)] + ["leafL", "leafR"],
        "rank": np.array(list(range(n)) + [-1, -1], dtype=np.int32),
        "server": np.arange(n + 2, dtype=np.int32),
    })
    src, dst, bw, tier = [], [], [], []
    for i in range(n):
        sw = sw_l if i < n_left else sw_r
        src += [i, sw]
        dst += [sw, i]
        bw += [GBPS, GBPS]
        tier += ["nic", "nic"]
    src += [sw_l, sw_r]
    dst += [sw_r, sw_l]
    bw += [core_gbps, core_gbps]
    tier += ["spine", "spine"]
    links = pd.DataFrame({
        "link_id": np.arange(len(src), dtype=np.int32),
        "src": np.array(src, dtype=np.int32), "dst": np.array(dst, dtype=np.int32),
        "gbps": np.array(bw), "latency_ns": np.full(len(src), LAT_NS), "tier": tier,
    })
    topo = Topology(nodes=nodes, links=links, rank_node=np.arange(n, dtype=np.int32))
    topo._router = Router(nodes, links)
    return topo


def link_id(topo: Topology, src: str, dst: str) -> int:
    names = topo.nodes["name"].to_numpy()
    lk = topo.links
    hit = np.flatnonzero((names[lk["src"]] == src) & (names[lk["dst"]] == dst))
    return int(hit[0])


def test_pfc_loses_nothing_where_drop_tail_drops(driver: str) -> None:
    s = 2 << 20
    tb = TraceBuilder(5)
    for i in range(4):
        tb.flow(i, 4, s)
    trace = tb.build()
    topo = star(5, GBPS, tier="nic")
    sink = link_id(topo, "nvs0", "gpu4")
    buf = PfcSpec(buffer_bytes=400_000)
    lossy = run(trace, topo, driver, TransportSpec(lossless="none", pfc=buf))
    pfc = run(trace, topo, driver, TransportSpec(lossless="pfc", pfc=buf))
    assert lossy.link_stats.loc[sink, "drops"] > 0
    assert lossy.link_stats["pause_sent"].sum() == 0
    assert pfc.link_stats["drops"].sum() == 0 and pfc.link_stats["drop_bytes"].sum() == 0
    assert pfc.link_stats["pause_sent"].sum() > 0
    # the switch never held more than its buffer: the port to gpu4 stayed below it
    assert pfc.link_stats.loc[sink, "queue_peak_bytes"] <= buf.buffer_bytes
    # lossless: the four flows end when the receiver's link has carried their bytes
    ideal = 4 * s * (9064 / 9000) * 8 / GBPS
    assert ideal <= pfc.makespan_ns <= 1.03 * ideal + 5000
    assert lossy.makespan_ns > pfc.makespan_ns  # recovering from losses costs time


def test_pfc_pauses_a_victim_that_shares_only_the_upstream_link(driver: str) -> None:
    # gpu0, gpu1 -> gpu3 (incast into gpu3's 100G port); victim gpu2 -> gpu4; all cross L->R
    # (400G: never a bottleneck itself). The victim's own path is uncongested.
    s_incast, s_victim = 8 << 20, 2 << 20
    tb = TraceBuilder(5)
    tb.flow(0, 3, s_incast)
    tb.flow(1, 3, s_incast)
    victim = tb.flow(2, 4, s_victim)
    trace = tb.build()
    topo = two_switches(3, 2, core_gbps=400.0)
    pfc_small = PfcSpec(buffer_bytes=4 << 20, alpha=None, xoff_bytes=200_000,
                        xon_bytes=150_000)
    without = run(trace, topo, driver, TransportSpec(lossless="none",
                                                     pfc=PfcSpec(buffer_bytes=1 << 30)))
    with_pfc = run(trace, topo, driver, TransportSpec(lossless="pfc", pfc=pfc_small))
    line = s_victim * (9064 / 9000) * 8 / GBPS + 3 * LAT_NS
    v0 = without.frame["end_ns"][victim]
    v1 = with_pfc.frame["end_ns"][victim]
    assert v0 <= 1.02 * line + 1000
    assert v1 >= 1.2 * v0
    core = link_id(topo, "leafL", "leafR")
    assert with_pfc.link_stats.loc[core, "pause_received"] > 0
    assert with_pfc.link_stats.loc[core, "paused_ns"] > 0
    assert with_pfc.link_stats["drops"].sum() == 0
    assert without.link_stats.loc[core, "pause_received"] == 0


DCQCN = TransportSpec(lossless="pfc", cc="dcqcn", ecn=EcnSpec(), dcqcn=DcqcnSpec())


def test_dcqcn_two_flows_converge_to_fair_share(driver: str) -> None:
    s, join_ns = 16 << 20, 200_000
    head = int(GBPS * join_ns / 8)  # what the first flow sends alone before the second joins
    tb = TraceBuilder(3)
    a = tb.flow(0, 2, s + head)
    wait = tb.compute(1, join_ns)
    b = tb.flow(1, 2, s)
    tb.dep(wait, b)
    trace = tb.build()
    topo = star(3, GBPS, tier="nic")
    tl = run(trace, topo, driver, DCQCN)
    ea, eb = tl.frame["end_ns"][a], tl.frame["end_ns"][b]
    fair = join_ns + 2 * s * (9064 / 9000) * 8 / GBPS
    assert abs(ea - eb) <= 0.10 * (fair - join_ns)
    assert abs(max(ea, eb) - fair) <= 0.10 * (fair - join_ns)
    sink = link_id(topo, "nvs0", "gpu2")
    kmin, kmax = DCQCN.ecn.thresholds_at(GBPS)  # type: ignore[union-attr]
    ls = tl.link_stats
    assert ls.loc[sink, "ecn_marks"] > 0 and ls["cnps"].sum() > 0
    assert kmin <= ls.loc[sink, "queue_mean_bytes"] <= kmax
    assert ls["pause_sent"].sum() == 0


def test_dcqcn_single_flow_keeps_90_percent_of_its_bottleneck(driver: str) -> None:
    s = 32 << 20
    tb = TraceBuilder(2)
    f = tb.flow(0, 1, s)
    topo = star(2, [GBPS, GBPS / 2], tier="nic")  # gpu1's port runs at half gpu0's NIC
    tl = run(tb.build(), topo, driver, DCQCN)
    line = s * (9064 / 9000) * 8 / (GBPS / 2)
    assert tl.link_stats["ecn_marks"].sum() > 0  # it was marked and cut, and recovered
    assert tl.frame["end_ns"][f] <= line / 0.90


def test_hpcc_keeps_the_queue_below_dcqcn(driver: str) -> None:
    s = 8 << 20
    tb = TraceBuilder(3)
    tb.flow(0, 2, s)
    tb.flow(1, 2, s)
    trace = tb.build()
    topo = star(3, GBPS, tier="nic")
    sink = link_id(topo, "nvs0", "gpu2")
    dq = run(trace, topo, driver, DCQCN)
    hp = run(trace, topo, driver, TransportSpec(lossless="pfc", cc="hpcc"))
    d, h = dq.link_stats.loc[sink], hp.link_stats.loc[sink]
    assert h["queue_peak_bytes"] < d["queue_peak_bytes"]
    assert h["queue_mean_bytes"] < d["queue_mean_bytes"]
    ideal = 2 * s * (9064 / 9000) * 8 / GBPS
    assert hp.makespan_ns <= 1.15 * ideal  # and it still fills the link


def test_no_transport_section_is_todays_driver(driver: str) -> None:
    s = 4 << 20
    tb = TraceBuilder(3)
    tb.flow(0, 2, s)
    tb.flow(1, 2, s)
    trace = tb.build()
    topo = star(3, GBPS, tier="nic")
    a = run(trace, topo, driver, None)
    assert "pause_sent" not in a.link_stats.columns and "transport" not in a.stats
    b = run(trace, topo, driver, TransportSpec(lossless="pfc"))
    assert b.stats["transport"] == "pfc+none" and "pause_sent" in b.link_stats.columns
