"""build_topology: what is built from a plan (counts, speeds, wiring, names, events, errors)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.topo import make_plan

from xsim_adapters.errors import PlanError
from xsim_adapters.plan.model import ExplicitLink, LinkEvent, ScaleOut
from xsim_adapters.topology import build_topology


def tier_counts(topo) -> dict[str, int]:
    return topo.links["tier"].value_counts().to_dict()


def names_of(topo, ids) -> list[str]:
    return topo.nodes["name"].to_numpy()[np.asarray(ids)].tolist()


def test_frames_follow_the_contract():
    topo = build_topology(make_plan([("h", "H100", 2, 8), ("a", "A100", 1, 4)]))
    nodes, links = topo.nodes, topo.links
    assert list(nodes.columns) == ["node_id", "kind", "name", "rank", "server", "domain"]
    assert list(links.columns) == ["link_id", "src", "dst", "gbps", "latency_ns", "tier"]
    assert nodes["node_id"].tolist() == list(range(len(nodes)))
    assert links["link_id"].tolist() == list(range(len(links)))
    assert nodes["name"].is_unique
    assert str(links["src"].dtype) == "int32" and str(links["gbps"].dtype) == "float64"
    # GPU node id == global rank; servers numbered as in the plan
    assert topo.rank_node.tolist() == list(range(20))
    gpus = nodes[nodes["kind"] == "gpu"]
    assert gpus["name"].tolist() == [f"gpu{r}" for r in range(20)]
    assert gpus["server"].tolist() == [0] * 8 + [1] * 8 + [2] * 4
    assert nodes[nodes["kind"] == "nvswitch"]["name"].tolist() == ["nvs0", "nvs1", "nvs2"]


def test_two_tier_leaf_spine_with_oversubscription_two():
    so = ScaleOut(oversubscription=2.0, nodes_per_leaf=4, link_gbps=400.0)
    topo = build_topology(make_plan([("h", "H100", 8, 8)], so))
    # 64 GPUs: 64 scale-up cables, 64 NIC cables; 2 leaves of 32 x 400 Gb/s = 12.8 Tb/s down,
    # 6.4 Tb/s up = 16 uplinks of 400 Gb/s each, one to each of 16 derived spines
    assert tier_counts(topo) == {"scale_up": 128, "nic": 128, "fabric": 2 * 2 * 16}
    assert topo.meta["leaves"] == 2 and topo.meta["spines"] == 16
    kinds = topo.nodes["kind"].value_counts().to_dict()
    assert kinds == {"gpu": 64, "nvswitch": 8, "leaf": 2, "spine": 16}
    up = topo.links[(topo.links["tier"] == "fabric")]
    leaf_up = up[up["src"].isin(topo.nodes.index[topo.nodes["kind"] == "leaf"])]
    assert leaf_up.groupby("src")["gbps"].sum().tolist() == [6400.0, 6400.0]
    full = build_topology(make_plan([("h", "H100", 8, 8)], ScaleOut(nodes_per_leaf=4)))
    assert tier_counts(full)["fabric"] == 2 * 2 * 32  # oversubscription 1: twice the uplinks


def test_parallel_links_are_distinct_ids():
    so = ScaleOut(oversubscription=2.0, nodes_per_leaf=4, spines=4)
    topo = build_topology(make_plan([("h", "H100", 8, 8)], so))
    links = topo.links
    ids = topo.nodes.set_index("name")["node_id"]
    between = links[(links["src"] == ids["leaf0"]) & (links["dst"] == ids["spine0"])]
    assert len(between) == 4  # 16 uplinks round-robin over 4 spines
    assert between["link_id"].is_unique
    back = links[(links["src"] == ids["spine0"]) & (links["dst"] == ids["leaf0"])]
    assert len(back) == 4
    # ECMP uses all four parallel links
    used = set()
    for key in range(400):
        used.update(int(x) for x in topo.path(0, 63, key))
    assert set(between["link_id"].tolist()) <= used


def test_rail_optimized_wiring():
    so = ScaleOut(rail_optimized=True, nodes_per_leaf=1)  # nodes_per_leaf is ignored
    topo = build_topology(make_plan([("h", "H100", 4, 8)], so))
    nodes, links = topo.nodes, topo.links
    assert topo.meta["leaves"] == 8  # one rail leaf per local GPU index
    nic = links[(links["tier"] == "nic") & (links["src"] < 32)]
    leaf_of_gpu = dict(zip(nic["src"].tolist(), names_of(topo, nic["dst"]), strict=True))
    assert all(leaf_of_gpu[r] == f"leaf{r % 8}" for r in range(32))
    # each rail leaf: 4 x 400 Gb/s down, so 4 uplinks to 4 derived spines
    assert topo.meta["spines"] == 4
    assert tier_counts(topo) == {"scale_up": 64, "nic": 64, "fabric": 8 * 4 * 2}
    # same rail, other server: NIC, rail leaf, NIC; cross rail: through a spine
    assert names_of(topo, links["dst"].to_numpy()[topo.path(0, 8, 1)]) == ["leaf0", "gpu8"]
    cross = names_of(topo, links["dst"].to_numpy()[topo.path(0, 9, 1)])
    assert cross[0] == "leaf0" and cross[1].startswith("spine") and cross[2:] == ["leaf1", "gpu9"]
    assert kinds_is(nodes, "leaf") == 8


def kinds_is(nodes, kind) -> int:
    return int((nodes["kind"] == kind).sum())


def test_nic_and_nvlink_speeds_follow_the_device_type():
    topo = build_topology(make_plan([("h", "H100", 1, 8), ("a", "A100", 1, 8)]))
    links = topo.links
    for tier, h, a in (("nic", 400.0, 200.0), ("scale_up", 450.0 * 8, 300.0 * 8)):
        t = links[links["tier"] == tier]
        out = t[t["src"] < 16].set_index("src")["gbps"]
        assert out.loc[:7].tolist() == [h] * 8
        assert out.loc[8:15].tolist() == [a] * 8
    lat = links.groupby("tier")["latency_ns"].unique().to_dict()
    assert lat["scale_up"].tolist() == [500.0] and lat["nic"].tolist() == [1000.0]
    assert topo.meta["uplinks_per_leaf"] == [0]  # both servers on one leaf: no spines needed


def test_fat_tree_three_tiers():
    topo = build_topology(make_plan([("h", "H100", 2, 8)], ScaleOut(topology="fat_tree")))
    # 16 GPUs: k = 4 holds k^3/4 = 16; 4 pods of 2 edge + 2 aggregation, 4 cores
    assert topo.meta["fat_tree_k"] == 4
    kinds = topo.nodes["kind"].value_counts().to_dict()
    assert kinds == {"gpu": 16, "nvswitch": 2, "leaf": 8, "spine": 8, "core": 4}
    assert tier_counts(topo) == {"scale_up": 32, "nic": 32, "fabric": 2 * (4 * 2 * 2 * 2)}
    hops = names_of(topo, topo.links["dst"].to_numpy()[topo.path(0, 15, 7)])
    assert [h.rstrip("0123456789") for h in hops] == ["leaf", "spine", "core", "spine", "leaf",
                                                      "gpu"]
    assert hops[-1] == "gpu15"
    with pytest.raises(PlanError, match=r"network.scale_out.fat_tree_k: a 3-tier fat tree of "
                                        r"radix 2 holds 2 GPUs; the plan has 16"):
        build_topology(make_plan([("h", "H100", 2, 8)], ScaleOut(topology="fat_tree",
                                                                fat_tree_k=2)))


def test_explicit_links_and_events_resolve():
    links = (
        ExplicitLink("leaf0", "oxc0", gbps=800.0, latency_us=2.0),
        ExplicitLink("leaf0", "oxc0", gbps=800.0, latency_us=2.0),
    )
    events = (
        LinkEvent(at_us=30.0, kind="restore", src="gpu1", dst="leaf0"),
        LinkEvent(at_us=10.0, kind="fail", src="leaf0", dst="gpu1"),
        LinkEvent(at_us=20.0, kind="degrade", src="oxc0", dst="leaf0", factor=0.25),
    )
    topo = build_topology(make_plan([("h", "H100", 1, 4)], links=links, events=events))
    ex = topo.links[topo.links["tier"] == "explicit"]
    assert len(ex) == 4 and ex["link_id"].is_unique
    assert ex["gbps"].tolist() == [800.0] * 4 and ex["latency_ns"].tolist() == [2000.0] * 4
    oxc = topo.nodes[topo.nodes["name"] == "oxc0"]
    assert oxc["kind"].tolist() == ["oxc"]
    ev = topo.events
    assert ev["at_ns"].tolist() == [10_000.0] * 2 + [20_000.0] * 4 + [30_000.0] * 2
    assert ev["factor"].tolist() == [0.0] * 2 + [0.25] * 4 + [1.0] * 2
    gpu1_nic = topo.links[(topo.links["tier"] == "nic") & (
        (topo.links["src"] == 1) | (topo.links["dst"] == 1))]
    assert sorted(ev["link_id"].tolist()[:2]) == sorted(gpu1_nic["link_id"].tolist())
    assert sorted(ev["link_id"].tolist()[2:6]) == sorted(ex["link_id"].tolist())


def test_event_errors_name_the_plan_path():
    bad = (LinkEvent(at_us=1.0, kind="fail", src="gpu0", dst="leaf9"),)
    with pytest.raises(PlanError, match=r"^network.events\[0\].dst: unknown topology node; "
                                        r"expected one of gpu0..gpu3, nvs0, leaf0 "
                                        r"\(got 'leaf9'\)$"):
        build_topology(make_plan([("h", "H100", 1, 4)], events=bad))
    nolink = (LinkEvent(at_us=1.0, kind="fail", src="gpu0", dst="gpu1"),)
    with pytest.raises(PlanError, match=r"^network.events\[0\]: expected two nodes joined by a "
                                        r"link \(got 'gpu0' and 'gpu1', which have none"):
        build_topology(make_plan([("h", "H100", 1, 4)], events=nolink))
    same = (ExplicitLink("leaf0", "leaf0", gbps=1.0),)
    with pytest.raises(PlanError, match=r"^network.links\[0\]: src and dst must differ"):
        build_topology(make_plan([("h", "H100", 1, 4)], links=same))
