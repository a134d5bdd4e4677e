"""Commodity clusters: PCIe servers without GPU peer-to-peer (NCCL through host memory), and
NCCL's socket transport between servers with a per-flow cap.

Closed forms on the flow backend; the numbers beside each assertion come from the PCIe spec
and the plan, not from the code under test.
"""

from __future__ import annotations

import pytest

from xsim_adapters.backend_api import refuse_connection_limit
from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.bench_collective import bench
from xsim_adapters.errors import BackendError, PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.topology import build_topology
from xsim_adapters.trace.builder import TraceBuilder

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
    ({"p2p": True, "host_memory_GBps": 40},
     r"^device_groups\.g\.server\.pcie\.host_memory_GBps: only without peer-to-peer "
     r"\(p2p: false\): with p2p: true no GPU transfer goes through host memory \(got 40\)$"),
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


# ------------------------------------------------------------------ NCCL's socket transport

NIC_GBPS = 25.0


def _two_servers(net: dict, gpus: int = 1) -> dict:
    return {
        "name": "sockets",
        "model": {"preset": "llama2-7b", "layers": 4},
        "training": {"global_batch": 2, "micro_batch": 1},
        "device_groups": {"g": {"type": "A100-80GB", "nodes": 2, "gpus_per_node": gpus,
                                "nic_gbps": NIC_GBPS}},
        "network": {"scale_out": {"topology": "leaf_spine", "link_gbps": 100,
                                  "latency_us": 1.0}, **net},
        "replicas": [{"stages": [{"group": "g", "devices": [0, gpus], "layers": [0, 2]},
                                 {"group": "g", "devices": [gpus, 2 * gpus],
                                  "layers": [2, 4]}]}],
    }


def _flow_ends(net: dict, flows: list[tuple[int, int, int, int]], gpus: int = 1) -> list[float]:
    """End times (ns) of ``flows`` = [(src, dst, bytes, channel)], all started at 0, on the
    flow backend's Python and native engines (asserted equal)."""
    topo = build_topology(plan_from_dict(_two_servers(net, gpus), feasibility=False))
    out = []
    for engine in ("python", "native"):
        tb = TraceBuilder(topo.num_ranks)
        ops = [tb.flow(s, d, b, channel=c) for s, d, b, c in flows]
        tl = FlowBackend().run(tb.build(), topo, {"engine": engine})
        out.append([float(tl.frame.iloc[op]["end_ns"]) for op in ops])
    assert out[0] == pytest.approx(out[1], rel=1e-12)
    return out[0]


def _latency_ns(net: dict, src: int, dst: int, gpus: int = 1) -> float:
    topo = build_topology(plan_from_dict(_two_servers(net, gpus), feasibility=False))
    return float(topo.links["latency_ns"].to_numpy()[topo.path(src, dst, 0)].sum())


MB100 = 100_000_000


def test_a_pp_send_over_one_socket_is_bounded_by_the_per_flow_cap() -> None:
    """One 100 MB send between servers: 25 Gb/s NIC, 5 Gb/s per flow, NCCL's default 1 thread x
    1 socket: 100e6 x 8 / 5 Gb/s = 160 ms (+ path latency); without the cap the NIC's 32 ms."""
    net = {"nccl_net": "socket", "per_flow_gbps": 5.0}
    lat = _latency_ns(net, 0, 1)
    assert _flow_ends(net, [(0, 1, MB100, -1)])[0] == pytest.approx(MB100 * 8 / 5.0 + lat)
    assert _flow_ends({}, [(0, 1, MB100, -1)])[0] == pytest.approx(MB100 * 8 / NIC_GBPS + lat)


def test_sockets_per_connection_multiply_the_cap_up_to_the_nic() -> None:
    """2 threads x 2 sockets: 4 x 5 = 20 Gb/s (< the 25 Gb/s NIC); 2 x 8 = 16 sockets: the NIC
    binds (80 > 25); IB: one queue pair per connection, 5 Gb/s whatever the socket keys say."""
    lat = _latency_ns({}, 0, 1)
    four = {"nccl_net": "socket", "per_flow_gbps": 5.0, "socket_nthreads": 2,
            "nsocks_per_thread": 2}
    assert _flow_ends(four, [(0, 1, MB100, -1)])[0] == pytest.approx(MB100 * 8 / 20.0 + lat)
    sixteen = {**four, "nsocks_per_thread": 8}
    assert _flow_ends(sixteen, [(0, 1, MB100, -1)])[0] == pytest.approx(
        MB100 * 8 / NIC_GBPS + lat)
    ib = {**four, "nccl_net": "ib"}
    assert _flow_ends(ib, [(0, 1, MB100, -1)])[0] == pytest.approx(MB100 * 8 / 5.0 + lat)


def test_a_small_message_uses_one_socket_per_64_KiB() -> None:
    """NCCL splits a message into tasks of at least 64 KiB: 100 KiB over 8 sockets uses 2,
    so 2 x 5 = 10 Gb/s."""
    net = {"nccl_net": "socket", "per_flow_gbps": 5.0, "nsocks_per_thread": 8}
    nbytes = 100 * 1024
    lat = _latency_ns(net, 0, 1)
    assert _flow_ends(net, [(0, 1, nbytes, -1)])[0] == pytest.approx(nbytes * 8 / 10.0 + lat)


def test_each_ring_channel_is_its_own_connection() -> None:
    """Two channels between the same pair: two connections, 5 Gb/s each (10 of the NIC's 25);
    two sends on one connection share its 5 Gb/s (each 2.5)."""
    net = {"nccl_net": "socket", "per_flow_gbps": 5.0}
    lat = _latency_ns(net, 0, 1)
    two = _flow_ends(net, [(0, 1, MB100, 0), (0, 1, MB100, 1)])
    assert two == pytest.approx([MB100 * 8 / 5.0 + lat] * 2)
    same = _flow_ends(net, [(0, 1, MB100, 0), (0, 1, MB100, 0)])
    assert same == pytest.approx([MB100 * 8 / 2.5 + lat] * 2)


def test_flows_inside_a_server_are_not_capped() -> None:
    """GPU 0 -> GPU 1 of one server (NVSwitch): no NIC crossed, no per-flow cap."""
    net = {"nccl_net": "socket", "per_flow_gbps": 0.001}
    capped = _flow_ends(net, [(0, 1, MB100, -1)], gpus=2)[0]
    free = _flow_ends({}, [(0, 1, MB100, -1)], gpus=2)[0]
    assert capped == free


@pytest.mark.parametrize(("net", "message"), [
    ({"nccl_net": "tcp"}, r"^network\.nccl_net: "),
    ({"socket_nthreads": 17}, r"^network\.socket_nthreads: "),
    ({"socket_nthreads": 8, "nsocks_per_thread": 16},
     r"^network\.nsocks_per_thread: socket_nthreads x nsocks_per_thread must be at most 64 "
     r"sockets per connection \(NCCL's MAX_SOCKETS\) \(got 8 x 16 = 128\)$"),
    ({"per_flow_gbps": 0}, r"^network\.per_flow_gbps: "),
])
def test_network_errors(net: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        plan_from_dict(_two_servers(net), feasibility=False)


def test_packet_backends_refuse_a_per_flow_cap() -> None:
    topo = build_topology(plan_from_dict(_two_servers({"per_flow_gbps": 5.0}),
                                         feasibility=False))
    with pytest.raises(BackendError, match=r"^ns3: network\.per_flow_gbps \(5 Gb/s per flow\) "
                                           r"is applied by the flow backend only"):
        refuse_connection_limit("ns3", topo.connection_limit)
    refuse_connection_limit("ns3", build_topology(
        plan_from_dict(_two_servers({}), feasibility=False)).connection_limit)  # no cap: fine
