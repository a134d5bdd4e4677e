"""Rack-scale NVLink domains (GB200 / GB300 NVL72 and NVL36) and the Blackwell presets.

A group with ``nvlink_domain_gpus`` makes consecutive servers (compute trays) one NVLink domain:
one NVSwitch star ``nvl<d>`` over every GPU of the rack at the type's NVLink rate, each tray's
NICs beside it; routes inside a rack stay on NVLink, routes between racks leave by the NICs,
and the generator (RankInfo, NCCL's tuner inputs) treats the rack as one node, as NCCL's
multi-node NVLink does. See docs/topology.md "NVLink domains across servers".
"""

from __future__ import annotations

import numpy as np
import pytest

import xsim_adapters as xs
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan import device_presets
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.trace.schema import KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload.comm.rings import RankInfo
from xsim_adapters.workload.comm.selection import fabric

NVL72_TRAYS = 18  # compute trays of 4 GPUs per GB200 / GB300 NVL72 rack (9 NVLink switch trays)
GB200_NVLINK_GBPS = 900 * 8  # NVLink 5: 900 GB/s per GPU per direction, in Gb/s


def _plan(nodes: int = 36, domain: int | None = 72, tp: int = 8, dp: int | None = None,
          fabric_: str | None = None, tp_across: bool = True, type_: str = "GB200",
          extra_group: dict | None = None, moe: bool = False) -> dict:
    group: dict = {"type": type_, "nodes": nodes, "gpus_per_node": 4}
    if domain is not None:
        group["nvlink_domain_gpus"] = domain
    if fabric_ is not None:
        group["server"] = {"fabric": fabric_}
    group.update(extra_group or {})
    n = nodes * 4
    model = ({"preset": "mixtral-8x7b", "layers": 2, "seq_len": 1024} if moe
             else {"preset": "llama3-8b", "layers": 2, "seq_len": 1024})
    uniform = {"group": "g", "tp": tp, "pp": 1, "dp": dp or n // tp}
    if moe:
        uniform["ep"] = 8  # 8 ranks of TP 1: two trays of one rack
    return {
        "name": "rack",
        "model": model,
        "training": {"global_batch": uniform["dp"], "micro_batch": 1},
        "device_groups": {"g": group},
        "network": {"scale_up": {"tp_across_nodes": tp_across},
                    "scale_out": {"topology": "leaf_spine", "rail_optimized": True}},
        "replicas": {"uniform": uniform},
    }


@pytest.fixture(scope="module")
def two_racks():
    plan = plan_from_dict(_plan())
    return plan, xs.build_topology(plan)


# ---------------------------------------------------------------- topology


def test_one_star_per_rack_across_eighteen_trays(two_racks):
    plan, topo = two_racks
    nodes, links = topo.nodes, topo.links
    stars = nodes[nodes["kind"] == "nvswitch"]
    assert stars["name"].tolist() == ["nvl0", "nvl1"]  # no per-tray nvs<server>
    assert stars["server"].tolist() == [-1, -1] and stars["domain"].tolist() == [0, 1]
    gpus = nodes[nodes["kind"] == "gpu"]
    assert gpus["server"].tolist() == [r // 4 for r in range(144)]
    assert gpus["domain"].tolist() == [r // 72 for r in range(144)]
    for d, star in enumerate(stars["node_id"].tolist()):
        up = links[(links["dst"] == star) & (links["tier"] == "scale_up")]
        members = sorted(up["src"].tolist())
        assert members == list(range(72 * d, 72 * d + 72))
        assert len(set(gpus.loc[gpus["node_id"].isin(members), "server"])) == NVL72_TRAYS
        assert (up["gbps"] == GB200_NVLINK_GBPS).all()
    # every GPU: one NVLink cable (to its rack's star) and one 400 Gb/s NIC cable beside it
    for r in (0, 5, 71, 72, 143):
        out = links[links["src"] == r]
        assert sorted(out["tier"].tolist()) == ["nic", "scale_up"]
        assert float(out.loc[out["tier"] == "nic", "gbps"].iloc[0]) == 400.0
    assert topo.meta["num_servers"] == 36 and topo.meta["num_nics"] == 144


def test_routes_stay_in_the_rack_and_leave_it_by_the_nics(two_racks):
    _, topo = two_racks
    tier = topo.links["tier"].to_numpy()
    dst = topo.links["dst"].to_numpy()
    nvl0 = int(topo.nodes.loc[topo.nodes["name"] == "nvl0", "node_id"].iloc[0])
    for a, b in ((0, 1), (0, 4), (3, 71), (70, 5)):  # same tray, next tray, first to last
        path = topo.path(a, b, 7)
        assert tier[path].tolist() == ["scale_up", "scale_up"]
        assert int(dst[path[0]]) == nvl0
    for a, b in ((0, 72), (71, 72), (4, 140)):  # rack 0 -> rack 1
        path = topo.path(a, b, 7)
        assert "scale_up" not in tier[path].tolist()
        assert tier[path][0] == "nic" and tier[path][-1] == "nic"


def test_partial_last_rack_and_nvl36():
    plan = plan_from_dict(_plan(nodes=20, tp=4))  # one full rack and 2 trays of the next
    assert plan.domain_of_node() == [0] * 18 + [1] * 2
    topo = xs.build_topology(plan)
    links = topo.links
    star1 = int(topo.nodes.loc[topo.nodes["name"] == "nvl1", "node_id"].iloc[0])
    assert sorted(links.loc[links["dst"] == star1, "src"].tolist()) == list(range(72, 80))
    plan36 = plan_from_dict(_plan(nodes=18, domain=36, tp=4))  # NVL36: 9 trays per domain
    assert plan36.domain_of_node() == [0] * 9 + [1] * 9
    nodes = xs.build_topology(plan36).nodes
    assert nodes.loc[nodes["kind"] == "nvswitch", "name"].tolist() == ["nvl0", "nvl1"]


def test_without_the_key_every_tray_is_its_own_domain():
    plan = plan_from_dict(_plan(nodes=2, domain=None, tp=4))
    topo = xs.build_topology(plan)
    nodes = topo.nodes
    assert nodes.loc[nodes["kind"] == "nvswitch", "name"].tolist() == ["nvs0", "nvs1"]
    assert (nodes["domain"] == nodes["server"]).all()
    assert "scale_up" not in topo.links["tier"].to_numpy()[topo.path(0, 4, 0)].tolist()


# ---------------------------------------------------------------- what the generator sees


@pytest.mark.parametrize("server", [None, {"fabric": "nvswitch", "pair_GBps": 300.0,
                                           "pcie": {"gen": 5}, "nics": "per_pair"}])
def test_the_tiled_rack_profile_equals_routing_every_pair(server):
    """server_profile tiles a two-tray profile over the rack; routing all 72 x 72 pairs of the
    built rack gives the same bandwidths, link kinds, NICs and NIC shares."""
    from xsim_adapters.topology.profile import _domain_profile, server_profile

    extra = {} if server is None else {"server": server}
    plan = plan_from_dict(_plan(nodes=NVL72_TRAYS, tp=4, extra_group=extra))
    g = plan.device_groups[0]
    tiled, routed = server_profile(plan, g), _domain_profile(plan, g, NVL72_TRAYS)
    assert np.array_equal(tiled.pair_GBps, routed.pair_GBps)
    assert tiled.pair_kind == routed.pair_kind
    assert np.array_equal(tiled.nic, routed.nic)
    assert np.array_equal(tiled.scaleout_GBps, routed.scaleout_GBps)
    assert tiled.pair_GBps[0, 71] == (300.0 if server else 900.0)


def test_rank_info_treats_the_rack_as_one_nccl_node(two_racks):
    plan, _ = two_racks
    info = RankInfo(plan)
    assert info.server.tolist() == [r // 72 for r in range(144)]  # NCCL's node: the rack
    assert info.tray.tolist() == [r // 4 for r in range(144)]
    assert info.local.tolist() == [r % 72 for r in range(144)]
    assert info.nic.tolist() == list(range(144))  # the topology's NIC numbering
    assert info.nic_local.tolist() == [r % 4 for r in range(144)]  # the rail inside a tray
    assert info.link_GBps(0, 71) == 900.0 and info.link_kind(0, 71) == "nvlink"
    assert info.link_GBps(0, 72) == 50.0 and info.link_kind(0, 72) == "net"
    tp72 = fabric(plan, info, list(range(72)))
    assert (tp72.servers, tp72.ppn, tp72.intra_link, tp72.nvls) == (1, 72, "nvlink", True)
    assert tp72.intra_GBps == 900.0 and tp72.cc == 100
    cross = fabric(plan, info, [0, 72])
    assert (cross.servers, cross.ppn, cross.nic_GBps) == (2, 1, 50.0)


@pytest.mark.parametrize(("spec", "phase"), [
    (_plan(nodes=4, tp=8), "tp"),  # TP 8 over two trays
    (_plan(nodes=4, tp=1, moe=True), "ep"),  # EP 8 over two trays
])
def test_tp_and_ep_flows_stay_on_nvlink_inside_the_rack(spec, phase):
    plan = plan_from_dict(spec)
    trace = xs.generate(plan)
    topo = xs.build_topology(plan)
    ops = trace.ops
    sel = ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX[phase])]
    src, dst = sel["rank"].to_numpy(), sel["dst"].to_numpy()
    assert len(sel) > 0 and (src // 4 != dst // 4).any()  # flows between trays
    tier = topo.links["tier"].to_numpy()
    for a, b in set(zip(src.tolist(), dst.tolist(), strict=True)):
        assert set(tier[topo.path(a, b, 0)].tolist()) == {"scale_up"}


# ---------------------------------------------------------------- plan errors


@pytest.mark.parametrize(("kw", "where", "msg"), [
    ({"domain": 70}, "device_groups.g.nvlink_domain_gpus",
     "must be a multiple of the group's 4 GPUs per node (a domain is whole servers) (got 70)"),
    ({"domain": 0}, "device_groups.g.nvlink_domain_gpus", "expected a positive integer (got 0)"),
    ({"domain": 580}, "device_groups.g.nvlink_domain_gpus",
     "expected at most 576 GPUs (the largest NVLink domain announced, NVL576) (got 580)"),
    ({"fabric_": "pcie"}, "device_groups.g.nvlink_domain_gpus",
     "a domain of several servers needs the nvswitch server fabric (NVLink switch trays); "
     "the group's is pcie"),
])
def test_domain_errors_are_one_line(kw, where, msg):
    with pytest.raises(PlanError) as e:
        plan_from_dict(_plan(nodes=36, **kw))
    text = str(e.value)
    assert "\n" not in text
    assert text == f"{where}: {msg}"


def test_tp_may_leave_a_tray_but_not_a_rack_without_tp_across_nodes():
    plan_from_dict(_plan(nodes=18, domain=72, tp=8, tp_across=False))  # two trays: allowed
    with pytest.raises(PlanError) as e:  # NVL36 racks: the third TP 16 group straddles two
        plan_from_dict(_plan(nodes=18, domain=36, tp=16, tp_across=False))
    assert str(e.value) == (
        "replicas.uniform: TP group spans NVLink domains 0..1 of group g (36 GPUs per NVLink "
        "domain) but network.scale_up.tp_across_nodes is false (got [32, 48])")


def test_the_key_round_trips():
    plan = plan_from_dict(_plan(nodes=20, tp=4))
    data = plan_to_dict(plan)
    assert data["device_groups"]["g"]["nvlink_domain_gpus"] == 72
    assert plan_from_dict(data) == plan
    assert "nvlink_domain_gpus" not in plan_to_dict(
        plan_from_dict(_plan(nodes=2, domain=None, tp=4)))["device_groups"]["g"]


# ---------------------------------------------------------------- presets against their sources

# Per GPU, dense (ml-engineering@744d01e compute/accelerator/README.md: TFLOPS table, memory
# table, MAMF tables; DGX B200 / B300 datasheets and the GB200 / GB300 NVL72 pages it cites),
# NVLink 5 900 GB/s per direction (ml-engineering network/README.md), NICs of the reference
# systems (DGX B200 ConnectX-7 400G; DGX B300 ConnectX-8 800G; GB200 compute tray 4 x ConnectX-7
# 400G, DGX GB200 user guide; GB300 compute tray 4 x ConnectX-8, NVIDIA NVL72 AI-factory RA),
# compute capability from developer.nvidia.com/cuda-gpus (10.0 B200/GB200, 10.3 B300/GB300).
# Columns: bf16, tf32, fp8, fp4, fp32 TFLOP/s, HBM GB, HBM GB/s, NVLink GB/s, NIC Gb/s, cc x 10,
# bf16 MAMF, fp8 MAMF (TFLOP/s; GB300 has none: GB200's).
SOURCED = {
    "B200": (2250, 1125, 4500, 9000, 80, 180, 8000, 900, 400, 100, 1745.0, 3432.5),
    "B300": (2250, 1125, 4500, 12600, 80, 288, 8000, 900, 800, 103, 1769.0, 3353.3),
    "GB200": (2500, 1250, 5000, 10000, 80, 186, 8000, 900, 400, 100, 1822.0, 3615.6),
    "GB300": (2500, 1250, 5000, 15000, 80, 288, 8000, 900, 800, 103, 1822.0, 3615.6),
}


@pytest.mark.parametrize("name", sorted(SOURCED))
def test_blackwell_presets_match_their_sources(name):
    d = device_presets()[name]
    bf16, tf32, fp8, fp4, fp32, hbm, hbm_bw, nvl, nic, cc, mamf, mamf8 = SOURCED[name]
    assert (d.peak_tflops, d.tf32_tflops, d.fp8_tflops, d.fp4_tflops, d.fp32_tflops) == (
        bf16, tf32, fp8, fp4, fp32)
    assert (d.hbm_GB, d.hbm_GBps, d.scaleup_GBps, d.nic_gbps) == (hbm, hbm_bw, nvl, nic)
    assert d.compute_capability == cc and d.nvls and d.sm_count == 148
    assert d.efficiency == round(mamf / bf16, 3)
    assert d.fp8_efficiency == round(mamf8 / fp8, 3)
    assert d.source  # every number's source is in the entry
    # no sustained-clock measurement for Blackwell: no derating
    assert d.sustained_clock_fraction == 1.0
    assert np.isclose(d.sustained_tflops, bf16 * d.efficiency)


# ---------------------------------------------------------------- a collective across the rack


def test_ring_all_reduce_over_a_whole_rack_at_nvlink5():
    """72 GPUs on 18 trays, 1 GiB ring all-reduce (flow backend): no faster than 2(n-1)/n S at
    NCCL's NVLink 5 rate (40.1 of 50 GB/s per link, topo.h) and no slower than that plus NCCL's
    ring latency (8.4 us + 3.4 us per step, Simple) and two 0.5 us NVLink hops per step."""
    from xsim_adapters.bench_collective import bench

    plan = plan_from_dict(_plan(nodes=NVL72_TRAYS, tp=4))
    n, size = 72, 1 << 30
    row = bench(plan, "all_reduce", [size], algorithm="ring").iloc[0]
    assert row["algorithm"] == "ring:Simple"
    steps = 2 * (n - 1)
    wire_us = steps / n * size / (900e9 * 40.1 / 50) * 1e6
    latency_us = 8.4 + steps * 3.4 + steps * 2 * 0.5
    assert wire_us <= row["time_us"] <= 1.01 * (wire_us + latency_us)


def test_search_places_tp_across_trays_inside_a_rack_not_across_racks():
    from xsim_adapters.search import spec_from_dict
    from xsim_adapters.search.space import pure_shapes

    raw = {
        "name": "s", "model": "llama2-7b", "training": {"global_batch": 16},
        "device_groups": {"gb": {"type": "GB200", "nodes": 4, "gpus_per_node": 4,
                                 "nvlink_domain_gpus": 8}},
        "space": {"tp": [4, 8, 16], "pp_min": 1, "pp_max": 1, "micro_batch": [1]},
    }
    spec = spec_from_dict(raw)
    # TP 8 spans the two trays of a domain; TP 16 would span two domains
    assert [tp for tp, _ in pure_shapes(spec, spec.device_groups[0])] == [8, 4]
    raw["space"]["tp"] = [16]
    with pytest.raises(PlanError) as e:
        spec_from_dict(raw)
    assert str(e.value) == ("space.tp: expected a TP degree dividing the 8 GPUs of one GB200 "
                            "NVLink domain (got [16])")
