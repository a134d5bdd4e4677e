"""Server fabrics (pcie, nvlink_mesh, per-pair ceiling), NICs per server, the measured matrix.

Closed forms on the flow backend with hand-built traces; the numbers beside each assertion come
from the PCIe spec and the plan, not from the code under test.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.testing.handmade import TraceBuilder
from xsim_adapters.topology import build_topology
from xsim_adapters.workload.comm.rings import RankInfo

GEN4_X16_GBps = 16.0 * 128 / 130 / 8 * 16  # 31.5077 GB/s: 16 GT/s, 128b/130b, 16 lanes


def _plan(groups: dict, network: dict | None = None, replicas: list | None = None) -> dict:
    first = next(iter(groups))
    n = groups[first]["gpus_per_node"]
    return {
        "name": "fabrics",
        "model": {"preset": "llama2-7b", "layers": 4},
        "training": {"global_batch": 2, "micro_batch": 1},
        "device_groups": groups,
        "network": network or {},
        "replicas": replicas or [{"stages": [{"group": first, "devices": [0, n],
                                              "layers": [0, 4]}]}],
    }


def _run_flows(topo, n: int, flows: list[tuple[int, int, int]]) -> list[float]:
    """End times (ns) of ``flows`` = [(src, dst, bytes)], all started at 0."""
    tb = TraceBuilder(n)
    ops = [tb.flow(s, d, b) for s, d, b in flows]
    tl = FlowBackend().run(tb.build(), topo, {})
    return [float(tl.frame.iloc[op]["end_ns"]) for op in ops]


def _path_latency(topo, src: int, dst: int, key: int) -> float:
    return float(topo.links["latency_ns"].to_numpy()[topo.path(src, dst, key)].sum())


# ------------------------------------------------------------------ pcie


def _pcie_group(**pcie) -> dict:
    """RTX 4090s on a PCIe tree with peer-to-peer on (the RTX 4090 preset has it off:
    tests/test_commodity.py), so these tests see the P2P tree."""
    return {"type": "RTX-4090", "nodes": 1, "gpus_per_node": 8,
            "server": {"fabric": "pcie", "pcie": {"gen": 4, "p2p": True, **pcie}}}


def test_pcie_link_rates_come_from_the_pcie_spec() -> None:
    plan = plan_from_dict(_plan({"g": _pcie_group(gpus_per_switch=4, uplink_lanes=8)}))
    topo = build_topology(plan)
    links, nodes = topo.links, topo.nodes
    kind = nodes["kind"].to_numpy()
    gpu_up = links[(kind[links["src"]] == "gpu")]
    assert set(gpu_up["tier"]) == {"pcie"}
    assert gpu_up["gbps"].to_numpy() == pytest.approx(GEN4_X16_GBps * 8)
    sw_up = links[(kind[links["src"]] == "pcie_switch") & (kind[links["dst"]] == "host_bridge")]
    assert len(sw_up) == 2 and sw_up["gbps"].to_numpy() == pytest.approx(GEN4_X16_GBps * 4)
    info = RankInfo(plan)
    assert info.link_GBps(0, 1) == pytest.approx(GEN4_X16_GBps)  # same switch
    assert info.link_GBps(0, 5) == pytest.approx(GEN4_X16_GBps / 2)  # x8 uplinks
    assert (info.link_kind(0, 1), info.link_kind(0, 5)) == ("pci", "pci")
    assert len(topo.path(0, 1, 7)) == 2 and len(topo.path(0, 5, 7)) == 4


def test_all_gpus_crossing_one_host_bridge_share_it() -> None:
    """8 GPUs on root ports, a ring of 8 concurrent flows: every flow crosses the host bridge,
    whose peer-to-peer limit H is shared: each flow gets H/8 (< the x16 link)."""
    hb_GBps = 40.0
    plan = plan_from_dict(_plan({"g": _pcie_group(gpus_per_switch=0, host_bridge_GBps=hb_GBps)}))
    topo = build_topology(plan)
    size = 5_000_000
    ends = _run_flows(topo, 8, [(i, (i + 1) % 8, size) for i in range(8)])
    lat = _path_latency(topo, 0, 1, 0)
    assert lat == pytest.approx(2 * 105.0)  # two PCIe links of 105 ns (the bridge link is 0)
    for e in ends:
        assert e == pytest.approx(lat + size / (hb_GBps / 8), rel=1e-9)
    # Without the limit each flow runs at its x16 link
    free = build_topology(plan_from_dict(_plan({"g": _pcie_group(gpus_per_switch=0)})))
    ends = _run_flows(free, 8, [(i, (i + 1) % 8, size) for i in range(8)])
    assert ends[0] == pytest.approx(lat + size / GEN4_X16_GBps, rel=1e-9)


def test_nvlink_bridges_on_a_pcie_server_are_used_for_their_pair_only() -> None:
    g = _pcie_group(gpus_per_switch=2)
    g["server"].update(nvlink=[[0, 1, 4]], nvlink_GBps=14.0625)  # 4 bridges, NVLink3-class
    plan = plan_from_dict(_plan({"g": g}))
    topo = build_topology(plan)
    p01, p02 = topo.path(0, 1, 0), topo.path(0, 2, 0)
    tiers = topo.links["tier"].to_numpy()
    assert len(p01) == 1 and tiers[p01[0]] == "scale_up"
    assert set(tiers[p02]) == {"pcie"}
    info = RankInfo(plan)
    assert info.link_GBps(0, 1) == pytest.approx(4 * 14.0625)
    assert (info.link_kind(0, 1), info.link_kind(0, 2)) == ("nvlink", "pci")


# ------------------------------------------------------------------ nvlink_mesh


def test_hybrid_cube_mesh_pair_without_a_direct_link_routes_over_two_hops() -> None:
    plan = plan_from_dict(_plan({"v": {"type": "V100-32GB", "nodes": 1, "gpus_per_node": 8,
                                       "server": "dgx1_v100"}}))
    topo = build_topology(plan)
    links = topo.links
    tiers = links["tier"].to_numpy()
    direct = topo.path(0, 3, 0)  # NV2 pair
    assert len(direct) == 1 and links["gbps"].iat[int(direct[0])] == 2 * 25 * 8
    seen = set()
    for key in range(64):  # 0 and 5 share no NVLink: relay through GPU 1 or GPU 4
        path = topo.path(0, 5, key)
        assert len(path) == 2 and set(tiers[path]) == {"scale_up"}
        seen.add(int(links["dst"].iat[int(path[0])]))
    assert seen == {1, 4}
    info = RankInfo(plan)
    assert info.link_GBps(0, 5) == 25.0  # NV1 then NV2 (or NV2 then NV1): one NVLink
    assert info.link_GBps(0, 3) == 50.0 and info.link_kind(0, 5) == "nvlink"
    # each GPU has 6 NVLinks of 25 GB/s = the V100's 150 GB/s
    out = links[(tiers == "scale_up") & (links["src"] == 0)]["gbps"].sum() / 8
    assert out == 150.0


def test_per_pair_ceiling_below_the_aggregate() -> None:
    g = {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 4,
         "server": {"fabric": "nvswitch", "pair_GBps": 100.0}}
    topo = build_topology(plan_from_dict(_plan({"g": g})))
    size = 10_000_000
    # one pair alone: the pair ceiling (100 GB/s); GPU 0 to all three: 3 x 100 <= 450 aggregate
    lat = _path_latency(topo, 0, 1, 0)
    assert lat == pytest.approx(1000.0)  # same as GPU -> NVSwitch -> GPU (2 x 0.5 us)
    assert _run_flows(topo, 4, [(0, 1, size)])[0] == pytest.approx(lat + size / 100.0)
    ends = _run_flows(topo, 4, [(0, 1, size), (0, 2, size), (0, 3, size)])
    assert ends == pytest.approx([lat + size / 100.0] * 3)
    low = copy.deepcopy(g)
    low["server"]["pair_GBps"] = 200.0  # 3 x 200 > 450: the aggregate binds, 150 each
    topo = build_topology(plan_from_dict(_plan({"g": low})))
    ends = _run_flows(topo, 4, [(0, 1, size), (0, 2, size), (0, 3, size)])
    assert ends == pytest.approx([lat + size / 150.0] * 3)


# ------------------------------------------------------------------ NICs


def _two_servers(nics: str) -> dict:
    return {"g": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 2, "nic_gbps": 400,
                  "server": {"nics": nics}}}


@pytest.mark.parametrize("nics, share", [("per_gpu", 1.0), ("per_pair", 0.5)])
def test_nic_per_pair_halves_per_gpu_scale_out_bandwidth_in_a_dp_all_reduce(nics, share):
    """TP 2 per server, DP 2 across the two servers: two 2-member DP rings (one per TP rank)
    run at once, 0<->2 and 1<->3. A 2-rank ring all-reduce of S bytes moves S/2 per step in
    2 steps: time = S / B + 2 x path latency. One NIC per pair: both rings leave each server
    through one 400 Gb/s NIC, B = 25 GB/s instead of 50."""
    plan = plan_from_dict(_plan(_two_servers(nics)))  # one leaf: no ECMP collisions
    topo = build_topology(plan)
    info = RankInfo(plan)
    assert info.scaleout_GBps.tolist() == [50.0 * share] * 4
    assert info.nic.tolist() == ([0, 1, 2, 3] if nics == "per_gpu" else [0, 0, 1, 1])
    size = 8_000_000
    tb = TraceBuilder(4)
    ends = []
    for a, b in ((0, 2), (1, 3)):
        s1 = [tb.flow(a, b, size // 2), tb.flow(b, a, size // 2)]
        s2 = [tb.flow(a, b, size // 2, deps=[s1[1]]), tb.flow(b, a, size // 2, deps=[s1[0]])]
        ends += s2
    tl = FlowBackend().run(tb.build(), topo, {})
    lat = _path_latency(topo, 0, 2, 0)
    expect = size / (50.0 * share) + 2 * lat
    for op in ends:
        assert float(tl.frame.iloc[op]["end_ns"]) == pytest.approx(expect, rel=1e-9)


def test_explicit_nic_map_and_rails() -> None:
    groups = {"g": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 4,
                    "server": {"nics": [0, 0, 0, 1]}}}
    plan = plan_from_dict(_plan(groups, {"scale_out": {"rail_optimized": True}}))
    topo = build_topology(plan)
    nodes = topo.nodes
    assert (nodes["kind"] == "nic").sum() == 4 and topo.meta["leaves"] == 2  # rail per NIC
    info = RankInfo(plan)
    assert info.nic.tolist() == [0, 0, 0, 1, 2, 2, 2, 3]
    assert info.scaleout_GBps.tolist() == pytest.approx([50 / 3] * 3 + [50.0] + [50 / 3] * 3
                                                        + [50.0])
    assert plan_from_dict(plan_to_dict(plan)) == plan


# ------------------------------------------------------------------ measured matrix


def _sites(measured: dict) -> dict:
    return _plan(
        {"a": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 2},
         "b": {"type": "A100-80GB", "nodes": 1, "gpus_per_node": 2}},
        {"measured": measured},
        [{"stages": [{"group": "a", "devices": [0, 2], "layers": [0, 4]}]},
         {"stages": [{"group": "b", "devices": [0, 2], "layers": [0, 4]}]}],
    )


def test_measured_matrix_lowers_to_the_given_rates_and_latencies() -> None:
    m = {"groups": ["a", "b"], "gbps": [[None, 100], [40, 0]],
         "latency_us": [[None, 2000], [1500, None]]}
    plan = plan_from_dict(_sites(m))
    topo = build_topology(plan)
    links, names = topo.links, topo.nodes["name"].to_numpy()
    wan = links[links["tier"] == "measured"]
    got = {(names[s], names[d]): (g, lat) for s, d, g, lat in
           zip(wan["src"], wan["dst"], wan["gbps"], wan["latency_ns"], strict=True)}
    assert got == {("gw0", "gw1"): (100.0, 2_000_000.0), ("gw1", "gw0"): (40.0, 1_500_000.0)}
    size = 10_000_000
    for src, dst, gbps in ((0, 2, 100.0), (2, 0, 40.0)):
        path = topo.path(src, dst, 0)
        assert "measured" in set(links["tier"].to_numpy()[path])
        end = _run_flows(topo, 4, [(src, dst, size)])[0]
        assert end == pytest.approx(_path_latency(topo, src, dst, 0) + size / (gbps / 8))
    info = RankInfo(plan)
    assert (info.link_GBps(0, 2), info.link_GBps(2, 0)) == (12.5, 5.0)
    assert info.link_GBps(0, 1) == 450.0  # inside a site: unchanged
    assert plan_from_dict(plan_to_dict(plan)) == plan


def test_measured_matrix_from_csv(tmp_path) -> None:
    (tmp_path / "m.csv").write_text("src,dst,gbps,latency_us\na,b,100,20\nb,a,100,20\n")
    d = _sites("m.csv")
    plan = plan_from_dict(d, base_dir=str(tmp_path))
    assert plan.network.measured.sites == (("a",), ("b",))
    assert plan.network.measured.gbps == ((None, 100.0), (100.0, None))
    assert plan.network.measured.latency_us == ((None, 20.0), (20.0, None))
    (tmp_path / "bad.csv").write_text("src,dst,gbps,latency_us\na,b,fast,20\n")
    with pytest.raises(PlanError, match=r"^network\.measured \(.*bad\.csv, line 2\): expected "
                                        r"numbers in columns gbps and latency_us$"):
        plan_from_dict(_sites("bad.csv"), base_dir=str(tmp_path))
    (tmp_path / "cols.csv").write_text("from,to,gbps\na,b,1\n")
    with pytest.raises(PlanError, match=r"^network\.measured: expected CSV columns src, dst, "
                                        r"gbps, latency_us in the header line of .*; missing "
                                        r"src, dst$"):
        plan_from_dict(_sites("cols.csv"), base_dir=str(tmp_path))


@pytest.mark.parametrize("measured, message", [
    ({"groups": ["a", "b"], "gbps": [[None, 100]]},
     r"^network\.measured\.gbps: expected 2 rows, one per site \(got 1\)$"),
    ({"groups": ["a", "b"], "gbps": [[None, 100], [100]]},
     r"^network\.measured\.gbps\[1\]: expected 2 columns, one per site \(got 1\)$"),
    ({"groups": ["a", "b"], "gbps": [[5, 100], [100, None]]},
     r"^network\.measured\.gbps\[0\]\[0\]: expected null or 0 on the diagonal"),
    ({"groups": ["a", "b"], "gbps": [[None, -1], [100, None]]},
     r"^network\.measured\.gbps\[0\]\[1\]: expected a number in \["),
    ({"groups": ["a", "c"], "gbps": [[None, 1], [1, None]]},
     r"^network\.measured\.groups\[1\]: unknown device group; expected one of a, b \(got 'c'\)$"),
    ({"groups": ["a", ["a"]], "gbps": [[None, 1], [1, None]]},
     r"^network\.measured\.groups\[1\]: device group a is already in site 0$"),
    ({"groups": ["a", "b"], "gbps": [[None, 1], [1, None]],
      "latency_us": [[None, 1], [None, None]]},
     r"^network\.measured\.latency_us\[1\]\[0\]: expected a number exactly where gbps\[1\]\[0\]"),
    ("missing.csv", r"^network\.measured: measured CSV not found at "),
])
def test_measured_errors_name_the_yaml_path(measured, message) -> None:
    with pytest.raises(PlanError, match=message):
        plan_from_dict(_sites(measured))


def test_measured_must_list_every_group() -> None:
    d = _sites({"groups": ["a", "b"], "gbps": [[None, 1], [1, None]]})
    d["device_groups"]["c"] = {"type": "A100-80GB", "nodes": 1, "gpus_per_node": 2}
    with pytest.raises(PlanError, match=r"^network\.measured\.groups: every device group must "
                                        r"be in one site; missing c$"):
        plan_from_dict(d)


@pytest.mark.parametrize("server, message", [
    ("dgx2", r"^device_groups\.g\.server: unknown server preset; expected one of dgx1_v100"),
    ({"fabric": "nvlink_mesh"}, r"^device_groups\.g\.server\.nvlink: required with fabric "
                                r"nvlink_mesh"),
    ({"fabric": "nvlink_mesh", "nvlink": [[0, 9, 1]]},
     r"^device_groups\.g\.server\.nvlink\[0\]: GPU index out of range for group g of 8 GPUs "),
    ({"fabric": "nvlink_mesh", "nvlink": [[0, 1, 1], [2, 3, 1]]},
     r"^device_groups\.g\.server\.nvlink: the mesh must connect all 8 GPUs of group g; GPU 2 "),
    ({"fabric": "nvlink_mesh", "nvlink": [[0, 0, 1]]},
     r"^device_groups\.g\.server\.nvlink\[0\]: expected \[a, b, links\]"),
    ({"fabric": "pcie", "pcie": {"lanes": 12}},
     r"^device_groups\.g\.server\.pcie\.lanes: expected a PCIe link width, one of 1, 2, 4, 8, "
     r"16, 32 \(got 12\)$"),
    ({"fabric": "pcie", "pcie": {"gen": 7}},
     r"^device_groups\.g\.server\.pcie\.gen: expected an integer in 1\.\.6 \(got 7\)$"),
    ({"fabric": "pcie", "nvlink": [[0, 1, 1]]},
     r"^device_groups\.g\.server\.nvlink_GBps: required with NVLink bridges"),
    ({"fabric": "pcie", "pair_GBps": 10},
     r"^device_groups\.g\.server\.pair_GBps: only for fabric nvswitch"),
    ({"nics": [0, 1]},
     r"^device_groups\.g\.server\.nics: expected one NIC index per GPU of group g \(8\) "
     r"\(got 2\)$"),
    ({"nics": [0, 2, 2, 2, 2, 2, 2, 2]},
     r"^device_groups\.g\.server\.nics: expected NIC indices 0\.\.1 each used at least once"),
    ({"nics": "per_rack"}, r"^device_groups\.g\.server\.nics: expected one of per_gpu, per_pair"),
    ({"fabrik": "pcie"}, r"^device_groups\.g\.server\.fabrik: unknown key"),
])
def test_server_errors_name_the_yaml_path(server, message) -> None:
    g = {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8, "server": server}
    with pytest.raises(PlanError, match=message):
        plan_from_dict(_plan({"g": g}))


def test_server_on_the_device_type_applies_to_its_groups_and_round_trips() -> None:
    d = _plan({"g": {"type": "T4x", "nodes": 1, "gpus_per_node": 4}})
    d["device_types"] = {"T4x": {"peak_tflops": 65, "hbm_GB": 16, "hbm_GBps": 320,
                                 "scaleup_GBps": 15.75, "nic_gbps": 25, "bf16": False,
                                 "server": {"fabric": "pcie", "pcie": {"gen": 3}}}}
    d["training"]["precision"] = "fp16"
    plan = plan_from_dict(d, feasibility=False)
    assert plan.server_spec(plan.device_groups[0]).fabric == "pcie"
    info = RankInfo(plan)
    assert info.link_GBps(0, 1) == pytest.approx(8.0 * 128 / 130 / 8 * 16)  # Gen3 x16
    assert plan_from_dict(plan_to_dict(plan), feasibility=False) == plan
    bad = copy.deepcopy(d)
    bad["device_types"]["T4x"]["server"] = {"fabric": "nvlink_mesh", "nvlink": [[0, 5, 1]]}
    with pytest.raises(PlanError, match=r"^device_types\.T4x\.server\.nvlink\[0\]: GPU index "):
        plan_from_dict(bad, feasibility=False)


def test_shipped_plans_keep_the_nvswitch_default() -> None:
    groups = {"g": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 8}}
    topo = build_topology(plan_from_dict(_plan(groups)))
    assert set(topo.nodes["kind"]) == {"gpu", "nvswitch", "leaf"}
    assert np.array_equal(topo.nodes["node_id"].to_numpy()[:16], np.arange(16))


def test_packet_backends_time_all_pcie_server_flows_fluid(tmp_path) -> None:
    """An intra-server flow over PCIe only is fluid-timed under scale_up=fluid (as NVLink
    flows are); a flow through the NIC is a packet flow over its whole path, PCIe included."""
    xsim_htsim_input = pytest.importorskip("xsim_htsim._input")
    g = _pcie_group(gpus_per_switch=4)
    g["nodes"] = 2
    g["server"]["nics"] = "per_server"
    topo = build_topology(plan_from_dict(_plan({"g": g})))
    tiers = topo.links["tier"].to_numpy()
    server = topo.server_links()
    assert not topo.scale_up_links()[tiers == "pcie"].any()  # a PCIe hop is not scale_up
    intra, inter = topo.path(0, 5, 1), topo.path(0, 9, 2)
    assert set(tiers[intra]) == {"pcie"} and server[intra].all()
    assert {"pcie", "nic"} <= set(tiers[inter]) and not server[inter].all()
    tb = TraceBuilder(16)
    tb.flow(0, 5, 1000)
    tb.flow(0, 9, 1000)
    info = xsim_htsim_input.write_input(tb.build(), topo, tmp_path / "in.bin")
    assert (info.flows, info.scale_up_flows) == (2, 1)
