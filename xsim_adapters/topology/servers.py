"""The inside of each server: GPUs, their scale-up fabric, the PCIe tree and the NICs.

Per server, from its :class:`~xsim_adapters.plan.model.ServerSpec` (docs/topology.md):

- ``nvswitch``: one NVSwitch ``nvs<server>``, a cable from each GPU at the type's
  ``scaleup_GBps``; with ``pair_GBps`` the switch is split into one port ``nvp<rank>`` per GPU
  (GPU <-> port at the aggregate, port <-> port at the pair ceiling), so a pair never exceeds
  its ceiling and a GPU never exceeds its aggregate;
- ``nvlink_mesh``: a cable per ``[a, b, links]`` at ``links x nvlink_GBps`` (default: the
  type's ``scaleup_GBps`` / the most NVLinks any GPU has);
- ``pcie`` (or any server with a ``pcie`` block): PCIe switches ``psw<k>`` of
  ``gpus_per_switch`` consecutive GPUs under one host bridge ``hb<server>`` (with
  ``host_bridge_GBps``, a second node ``hbx<server>`` and one link ``hb -> hbx`` at that rate
  carry everything that crosses the root complex); NVLink bridges of a pcie server are cables
  between the two GPUs; without GPU peer-to-peer (``pcie.p2p`` false, or the device type's
  ``pcie_p2p`` false: GeForce RTX 40) every switch is split into an up half ``psw<k>`` and a
  down half ``pswd<k>`` and the root complex into ``hb -> hm<server> -> hbx`` through host
  memory, so GPU-to-GPU and GPU-to-NIC transfers all cross the switch uplinks to host memory
  and back, as NCCL's SHM transport (and the absence of GPUDirect RDMA) moves them;
- NICs: with one NIC per GPU and no PCIe tree the GPU itself holds the NIC cable to its leaf (as
  before); otherwise a node ``nic<k>`` per NIC, on the PCIe switch of its GPUs (the host bridge
  if they sit under several), or, without a PCIe tree, cabled to each of its GPUs at the NIC's
  rate.

Tiers: NVLink/NVSwitch links are ``scale_up``; PCIe links ``pcie``; NIC <-> leaf ``nic``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan.model import DeviceGroup, DeviceType, PcieSpec, Plan, ServerSpec
from ..plan.server import nic_of_local
from .graph import Graph

GBPS_PER_GBYTE_PER_S = 8.0
# PCIe per-lane rate, one direction, GB/s, after line encoding: Gen1-2 8b/10b at 2.5 / 5 GT/s,
# Gen3-5 128b/130b at 8 / 16 / 32 GT/s (PCI Express Base Specification 3.0-5.0, Physical
# Layer); Gen6 64 GT/s PAM4 in FLIT mode, 242 of 256 FLIT bytes carry TLPs (PCIe 6.0 spec,
# as in the PCI-SIG PCIe 6.0 FAQ: 121 GB/s per direction at x16). TLP header overhead is left to
# the collective cost model, as NVLink's link efficiency is (workload/comm/nccl.py).
PCIE_LANE_GBps = {
    1: 2.5 * 8 / 10 / 8,
    2: 5.0 * 8 / 10 / 8,
    3: 8.0 * 128 / 130 / 8,
    4: 16.0 * 128 / 130 / 8,
    5: 32.0 * 128 / 130 / 8,
    6: 64.0 * 242 / 256 / 8,
}
# A NIC's PCIe link: ConnectX-5/6/7 adapters are x16 cards (NVIDIA ConnectX-7 datasheet: "PCIe
# Gen5 x16 host interface"), at the server's PCIe generation.
NIC_PCIE_LANES = 16
# PcieSpec.latency_us default (0.105 us per PCIe link, one switch traversal): Broadcom PEX88000
# cut-through latency between two x16 ports, 105 ns (Linley Newsletter, 2019-09-24, "Broadcom
# Ships PCIe Gen4 Switches"). The one home of that number is PcieSpec in plan/model.py.


def pcie_gbps(gen: int, lanes: int) -> float:
    """A PCIe link's rate in Gb/s, one direction, from its generation and lane count."""
    return PCIE_LANE_GBps[gen] * lanes * GBPS_PER_GBYTE_PER_S


@dataclass
class Gpu:
    node: int
    server: int
    local: int
    nic_gbps: float
    scaleup_gbps: float
    nic: int = -1  # global NIC index


@dataclass
class Nic:
    node: int  # the node whose cable goes to the leaf (a GPU, or a nic<k> node)
    server: int
    local: int  # NIC index inside its server (the rail of a rail-optimized fabric)
    gbps: float


def add_servers(plan: Plan, g: Graph) -> tuple[list[Gpu], list[Nic]]:
    """GPU nodes (node id == rank), every server's inside, and its NICs; in rank order."""
    gpus: list[Gpu] = []
    servers: list[tuple[DeviceGroup, DeviceType, int, int]] = []  # group, type, rank0, server
    server = 0
    for grp in plan.device_groups:
        dev = plan.device_types[grp.type]
        nic_gbps = grp.nic_gbps if grp.nic_gbps is not None else dev.nic_gbps
        for d in range(grp.num_devices):
            rank = len(gpus)
            s = server + d // grp.gpus_per_node
            nid = g.node("gpu", f"gpu{rank}", rank=rank, server=s)
            gpus.append(Gpu(nid, s, d % grp.gpus_per_node, nic_gbps,
                            dev.scaleup_GBps * GBPS_PER_GBYTE_PER_S))
        first = len(gpus) - grp.num_devices
        servers += [(grp, dev, first + k * grp.gpus_per_node, server + k)
                    for k in range(grp.nodes)]
        server += grp.nodes
    nics: list[Nic] = []
    up_ns = plan.network.scale_up.latency_us * 1e3
    g.server_domain = plan.domain_of_node()
    k = 0
    while k < len(servers):  # one NVLink domain at a time: a server, or a rack's trays
        grp, dev = servers[k][0], servers[k][1]
        d = g.server_domain[servers[k][3]]
        trays = [[gpus[r0 + i] for i in range(grp.gpus_per_node)]
                 for x, _, r0, s in servers[k:k + grp.domain_nodes]
                 if x is grp and g.server_domain[s] == d]
        nics += add_domain(g, plan.server_spec(grp), dev, trays, d, grp.domain_nodes > 1,
                           up_ns, len(nics))
        k += len(trays)
    return gpus, nics


def add_domain(
    g: Graph, spec: ServerSpec, dev: DeviceType, trays: list[list[Gpu]], domain: int,
    rack: bool, up_ns: float, nic_base: int,
) -> list[Nic]:
    """One NVLink domain: a server (``rack`` false: one tray), or the compute trays of an NVL
    rack, each built as a server without its own NVSwitch, and one NVSwitch star ``nvl<domain>``
    over all their GPUs at the type's NVLink rate: the rack's NVLink switch trays (NVL72: 9
    trays of 2 NVSwitch chips, every GPU one NVLink to each chip, non-blocking). Returns the
    NICs, tray by tray."""
    nics: list[Nic] = []
    for members in trays:
        nics += add_server(g, spec, dev, members, members[0].server, up_ns, nic_base + len(nics),
                           switch=not rack)
    if rack and spec.fabric == "nvswitch":
        _nvswitch(g, spec, [gpu for tray in trays for gpu in tray], -1, up_ns,
                  name=f"nvl{domain}", domain=domain)
    return nics


def add_server(
    g: Graph, spec: ServerSpec, dev: DeviceType, members: list[Gpu], s: int, up_ns: float,
    nic_base: int, switch: bool = True,
) -> list[Nic]:
    """One server's inside (``members``: its GPUs, in local order); returns its NICs.
    ``switch`` false: no NVSwitch of its own (a compute tray of a rack, :func:`add_domain`)."""
    if spec.fabric == "nvswitch" and switch:
        _nvswitch(g, spec, members, s, up_ns)
    elif spec.fabric == "nvlink_mesh":
        per_link = _mesh_link_GBps(spec, dev, len(members))
        for a, b, n in spec.nvlink:
            g.cable(members[a].node, members[b].node, n * per_link * GBPS_PER_GBYTE_PER_S,
                    up_ns, "scale_up")
    tree = (_pcie_tree(g, spec.pcie, members, s, pcie_p2p(spec, dev))
            if spec.pcie is not None else None)
    if spec.fabric == "pcie" and spec.nvlink_GBps is not None:
        for a, b, n in spec.nvlink:  # NVLink bridges
            g.cable(members[a].node, members[b].node,
                    n * spec.nvlink_GBps * GBPS_PER_GBYTE_PER_S, up_ns, "scale_up")
    nics = _nics(g, spec, members, s, tree, nic_base)
    if tree is not None:
        tree.hb.finish()
    return nics


def pcie_p2p(spec: ServerSpec, dev: DeviceType) -> bool:
    """Whether GPUs of a server with ``spec`` reach each other (and their NICs) peer to peer
    over PCIe: the server's ``pcie.p2p`` if given, else the device type's ``pcie_p2p``."""
    if spec.pcie is not None and spec.pcie.p2p is not None:
        return spec.pcie.p2p
    return dev.pcie_p2p


def _nvswitch(g: Graph, spec: ServerSpec, members: list[Gpu], s: int, up_ns: float,
              name: str = "", domain: int = -1) -> None:
    """An NVSwitch star over ``members`` (``nvs<s>``, or ``name`` for a rack's switch trays,
    outside any server: ``s`` -1 and its ``domain``); with ``pair_GBps``, a port per GPU."""
    if spec.pair_GBps is None:
        nvs = g.node("nvswitch", name or f"nvs{s}", server=s, domain=domain)
        for gpu in members:
            g.cable(gpu.node, nvs, gpu.scaleup_gbps, up_ns, "scale_up")
        return
    # Ports: GPU -> port -> port -> GPU carries the same total latency as GPU -> switch -> GPU.
    ports = [g.node("nvlink_port", f"nvp{g.rank[gpu.node]}", server=s, domain=domain)
             for gpu in members]
    for gpu, port in zip(members, ports, strict=True):
        g.cable(gpu.node, port, gpu.scaleup_gbps, up_ns / 2, "scale_up")
    pair = spec.pair_GBps * GBPS_PER_GBYTE_PER_S
    for i in range(len(ports)):
        for j in range(i + 1, len(ports)):
            g.cable(ports[i], ports[j], pair, up_ns, "scale_up")


def _mesh_link_GBps(spec: ServerSpec, dev: DeviceType, n: int) -> float:
    """GB/s of one NVLink of a mesh: given, or the type's per-GPU NVLink GB/s over the most
    NVLinks any GPU of the mesh has (V100: 150 / 6 = 25)."""
    if spec.nvlink_GBps is not None:
        return spec.nvlink_GBps
    count = np.zeros(max(n, 1), dtype=np.int64)
    for a, b, k in spec.nvlink:
        count[a] += k
        count[b] += k
    return dev.scaleup_GBps / max(int(count.max()), 1)


class _HostBridge:
    """The root complex: one node, or an in/out pair joined by its peer-to-peer limit; without
    peer-to-peer (``p2p`` false) always an in/out pair ``hb -> hm -> hbx`` through host memory
    ``hm<s>``, so every transfer that reaches the root complex is staged in host DRAM."""

    def __init__(self, g: Graph, pcie: PcieSpec, s: int, p2p: bool) -> None:
        self.g = g
        self.lat = pcie.latency_us * 1e3
        self.up = g.node("host_bridge", f"hb{s}", server=s)
        self.down = self.up
        self._dram: list[int] = []  # link ids whose rate is the staged-bytes sum (finish())
        if not p2p:
            hm = g.node("host_memory", f"hm{s}", server=s)
            self.down = g.node("host_bridge", f"hbx{s}", server=s)
            # Each staged byte is written to DRAM once and read once: the path carries half
            # the DRAM bandwidth given (NCCL SHM transport, docs/topology.md).
            dram = (pcie.host_memory_GBps * GBPS_PER_GBYTE_PER_S / 2
                    if pcie.host_memory_GBps is not None else 0.0)
            if dram == 0.0:
                self._dram.append(len(g.src))
            g.link(self.up, hm, dram, 0.0, "pcie")
            bridge = pcie.host_bridge_GBps
            g.link(hm, self.down, bridge * GBPS_PER_GBYTE_PER_S if bridge is not None else dram,
                   0.0, "pcie")
            if bridge is None and dram == 0.0:
                self._dram.append(len(g.src) - 1)
        elif pcie.host_bridge_GBps is not None:
            self.down = g.node("host_bridge", f"hbx{s}", server=s)
            g.link(self.up, self.down, pcie.host_bridge_GBps * GBPS_PER_GBYTE_PER_S, 0.0, "pcie")
        self._attached = 0.0

    def attach(self, child: int, gbps: float, down: int = -1) -> None:
        """``child`` on a root port: a link up into the bridge and one down to ``child`` (to
        ``down`` instead, the down half of a split switch, when given)."""
        self.g.link(child, self.up, gbps, self.lat, "pcie")
        self.g.link(self.down, child if down < 0 else down, gbps, self.lat, "pcie")
        self._attached += gbps

    def finish(self) -> None:
        """Host-memory links without a DRAM rate get the sum of the links into the root
        complex: DRAM then never binds, only the PCIe links do."""
        for link in self._dram:
            self.g.gbps[link] = self._attached


@dataclass
class _Tree:
    """A server's PCIe tree: its host bridge and each local GPU's switch (None: a root port)."""

    pcie: PcieSpec
    hb: _HostBridge
    switch: dict[int, int | None]
    down: dict[int, int]  # p2p off: each switch's down half (pswd<k>)
    p2p: bool

    def port(self, g: Graph, child: int, sw: int, gbps: float) -> None:
        """``child`` on a port of switch ``sw``: a cable, or without peer-to-peer a link up
        into ``sw`` and one down from its down half."""
        lat = self.pcie.latency_us * 1e3
        if self.p2p:
            g.cable(child, sw, gbps, lat, "pcie")
        else:
            g.link(child, sw, gbps, lat, "pcie")
            g.link(self.down[sw], child, gbps, lat, "pcie")


def _pcie_tree(g: Graph, pcie: PcieSpec, members: list[Gpu], s: int, p2p: bool) -> _Tree:
    """PCIe switches ``psw<k>`` (numbered over the whole topology) and the host bridge. Without
    peer-to-peer each switch is split: ``psw<k>`` takes its ports' traffic up to the host
    bridge only and ``pswd<k>`` brings it down, so no transfer turns inside a switch."""
    tree = _Tree(pcie, _HostBridge(g, pcie, s, p2p), {}, {}, p2p)
    gpu_gbps = pcie_gbps(pcie.gen, pcie.lanes)
    k = pcie.gpus_per_switch
    switch_of: dict[int, int] = {}
    for gpu in members:
        if k == 0:  # GPUs on root ports of the host bridge
            tree.hb.attach(gpu.node, gpu_gbps)
            tree.switch[gpu.local] = None
            continue
        idx = gpu.local // k
        if idx not in switch_of:
            n = g.count("pcie_switch")
            sw = g.node("pcie_switch", f"psw{n}", server=s)
            switch_of[idx] = sw
            up = pcie_gbps(pcie.gen, pcie.uplink_lanes)
            if p2p:
                tree.hb.attach(sw, up)
            else:
                tree.down[sw] = g.node("pcie_switch_down", f"pswd{n}", server=s)
                tree.hb.attach(sw, up, down=tree.down[sw])
        tree.port(g, gpu.node, switch_of[idx], gpu_gbps)
        tree.switch[gpu.local] = switch_of[idx]
    return tree


def _nics(
    g: Graph, spec: ServerSpec, members: list[Gpu], s: int, tree: _Tree | None, nic_base: int
) -> list[Nic]:
    nic_local = nic_of_local(spec, len(members))
    count = max(nic_local) + 1 if nic_local else 0
    for gpu, j in zip(members, nic_local, strict=True):
        gpu.nic = nic_base + j
    if tree is None and spec.nics == "per_gpu":
        return [Nic(gpu.node, s, gpu.local, gpu.nic_gbps) for gpu in members]
    out: list[Nic] = []
    for j in range(count):
        mine = [gpu for gpu, x in zip(members, nic_local, strict=True) if x == j]
        gbps = mine[0].nic_gbps
        nic = g.node("nic", f"nic{nic_base + j}", server=s)
        out.append(Nic(nic, s, j, gbps))
        if tree is None:
            lat = PcieSpec().latency_us * 1e3
            for gpu in mine:  # the NIC's PCIe side is not modelled: at the NIC's own rate
                g.cable(gpu.node, nic, gbps, lat, "pcie")
            continue
        rate = pcie_gbps(tree.pcie.gen, NIC_PCIE_LANES)
        places = {tree.switch[gpu.local] for gpu in mine}
        place = places.pop() if len(places) == 1 else None
        if place is None:  # GPUs under several switches (or on root ports): on the bridge
            tree.hb.attach(nic, rate)
        else:
            tree.port(g, nic, place, rate)
    return out
