"""Commodity clusters: PCIe servers without GPU peer-to-peer (NCCL through host memory).

Closed forms on the flow backend; the numbers beside each assertion come from the PCIe spec
and the plan, not from the code under test.
"""

from __future__ import annotations

import pytest

from xsim_adapters.bench_collective import bench
from xsim_adapters.errors import PlanError
from xsim_adapters.plan import plan_from_dict
from xsim_adapters.topology import build_topology

GEN4_X16_GBps = 16.0 * 128 / 130 / 8 * 16  # 31.5077 GB/s: 16 GT/s, 128b/130b, 16 lanes
GIB = 1 << 30


def _plan(pcie: dict, device: str = "RTX-4090", gpus: int = 8) -> dict:
    return {
        "name": "commodity",
        "model": {"preset": "llama2-7b"},
        "training": {"global_batch": 1, "micro_batch": 1},
        "device_groups": {"g": {"type": device, "nodes": 1, "gpus_per_node": gpus,
                                "server": {"fabric": "pcie", "pcie": pcie}}},
        "network": {"scale_out": {"topology": "leaf_spine", "link_gbps": 100,
                                  "latency_us": 1.0}},
        "replicas": [{"stages": [{"group": "g", "devices": [0, gpus], "layers": [0, 32]}]}],
    }


def _busbw(pcie: dict, device: str = "RTX-4090") -> float:
    plan = plan_from_dict(_plan(pcie, device), feasibility=False)
    frame = bench(plan, sizes=[GIB], nccl_cost=False)
    return float(frame["busbw"].iloc[0])


def test_ring_all_reduce_on_8_gpus_is_bounded_by_host_memory() -> None:
    """8 RTX 4090s on root ports, DRAM 40 GB/s: every ring flow is written to host memory and
    read back (40 / 2 = 20 GB/s of staged bytes), shared by the 8 concurrent flows of a ring
    step: busbw = 20 / 8 = 2.5 GB/s, where peer to peer the x16 link (31.5) binds."""
    assert _busbw({"gpus_per_switch": 0, "host_memory_GBps": 40.0}) == pytest.approx(
        40.0 / 2 / 8, rel=1e-4)
    assert _busbw({"gpus_per_switch": 0, "p2p": True}) == pytest.approx(GEN4_X16_GBps, rel=1e-4)


def test_without_p2p_a_switch_uplink_carries_all_its_gpus_traffic() -> None:
    """8 GPUs under one PCIe Gen4 switch, x16 uplink: peer to peer the ring stays inside the
    switch (busbw = one x16 link); through host memory all 8 flows share the uplink (/ 8)."""
    assert _busbw({"gpus_per_switch": 8}) == pytest.approx(GEN4_X16_GBps / 8, rel=1e-4)
    assert _busbw({"gpus_per_switch": 8, "p2p": True}) == pytest.approx(GEN4_X16_GBps, rel=1e-4)


def test_p2p_default_comes_from_the_device_type() -> None:
    """RTX 4090 preset: no peer-to-peer (a host-memory node); RTX 3090 and a plan's override:
    peer to peer (no host-memory node); a device type may switch it off."""
    def kinds(pcie: dict, device: str = "RTX-4090", types: dict | None = None) -> set[str]:
        d = _plan(pcie, device)
        d["device_types"] = types or {}
        return set(build_topology(plan_from_dict(d, feasibility=False)).nodes["kind"])

    assert {"host_memory", "pcie_switch_down"} <= kinds({"gpus_per_switch": 4})
    assert "host_memory" not in kinds({"gpus_per_switch": 4, "p2p": True})
    assert "host_memory" not in kinds({"gpus_per_switch": 4}, "RTX-3090")
    assert "host_memory" in kinds({"gpus_per_switch": 4}, "RTX-3090",
                                  {"RTX-3090": {"pcie_p2p": False}})


def test_without_p2p_gpu_to_nic_goes_through_host_memory() -> None:
    """No GPUDirect RDMA without peer-to-peer: a GPU's route to its NIC on the same switch goes
    up to host memory and back down (6 links: GPU, uplink, hb -> hm -> hbx, downlink, NIC)."""
    d = _plan({"gpus_per_switch": 8})
    d["device_groups"]["g"]["nodes"] = 2
    d["device_groups"]["g"]["server"]["nics"] = "per_server"  # on the GPUs' one switch
    topo = build_topology(plan_from_dict(d, feasibility=False))
    names = topo.nodes["name"].to_numpy()
    dst = topo.links["dst"].to_numpy()
    hops = [str(names[dst[x]]) for x in topo.path(0, 8, 0)]  # GPU 0 -> GPU 0 of server 1
    assert hops[:5] == ["psw0", "hb0", "hm0", "hbx0", "pswd0"]
    assert hops[5].startswith("nic")


@pytest.mark.parametrize(("pcie", "message"), [
    ({"p2p": 1}, r"^device_groups\.g\.server\.pcie\.p2p: expected true or false \(got 1\)$"),
    ({"host_memory_GBps": -3},
     r"^device_groups\.g\.server\.pcie\.host_memory_GBps: "),
])
def test_plan_errors(pcie: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_from_dict(_plan(pcie), feasibility=False)


def test_device_type_pcie_p2p_must_be_a_boolean() -> None:
    d = _plan({})
    d["device_types"] = {"RTX-3090": {"pcie_p2p": "no"}}
    d["device_groups"]["g"]["type"] = "RTX-3090"
    with pytest.raises(PlanError, match=r"^device_types\.RTX-3090\.pcie_p2p: expected true or "
                                        r"false \(got 'no'\)$"):
        plan_from_dict(d, feasibility=False)
