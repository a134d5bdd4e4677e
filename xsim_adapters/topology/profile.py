"""What the workload generator asks of a server: per-pair bandwidth and link kind, NIC affinity.

:func:`server_profile` builds one server of a device group with the topology's own builder
(:func:`~xsim_adapters.topology.servers.add_server`) and routes over it with the topology's own
router, so the numbers the generator plans with are those of the links the backends replay on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan.model import DeviceGroup, Plan
from .graph import Graph
from .routing import Router
from .servers import GBPS_PER_GBYTE_PER_S, Gpu, add_domain

LINK_KINDS = ("nvlink", "pci", "net")  # the link types of NCCL's tuner (workload/comm/nccl.py)


@dataclass(frozen=True)
class ServerProfile:
    """One NVLink domain of a group (a server, or a rack of trays), by GPU index inside it.

    ``pair_GBps[i, j]``: the bottleneck of the route from GPU i to GPU j (GB/s, one direction);
    ``pair_kind[i][j]``: ``nvlink`` if that route is NVLink only, else ``pci``;
    ``nic[i]``: local index of GPU i's NIC; ``scaleout_GBps[i]``: GPU i's share of its NIC
    (NIC GB/s / GPUs on it), capped by the bottleneck of its route to the NIC.
    """

    pair_GBps: np.ndarray
    pair_kind: tuple[tuple[str, ...], ...]
    nic: np.ndarray
    scaleout_GBps: np.ndarray


def server_profile(plan: Plan, group: DeviceGroup) -> ServerProfile:
    """The :class:`ServerProfile` of one NVLink domain of ``group``: a server, or (with
    ``nvlink_domain_gpus``) a whole rack of trays, by GPU index inside the domain.

    A rack's trays are identical and its switch is one star over them, so a pair's route
    depends only on the two GPUs' places in their trays and whether the trays differ: the
    profile of a two-tray domain, tiled, is the rack's (576 GPUs: 0.2 s instead of 26 s)."""
    gpn = group.gpus_per_node
    trays = min(group.domain_nodes, 2)
    small = _domain_profile(plan, group, trays)
    if trays == group.domain_nodes:
        return small
    n = group.domain_gpus
    tray = np.arange(n) // gpn
    local = np.arange(n) % gpn
    # column of GPU j in the small profile, seen from GPU i: its own tray, or "the other" tray
    col = local[None, :] + gpn * (tray[None, :] != tray[:, None])
    row = np.broadcast_to(local[:, None], (n, n))
    pair = small.pair_GBps[row, col]
    kinds = np.asarray(small.pair_kind, dtype=object)[row, col]
    nics_per_tray = (int(small.nic.max()) + 1) // trays if len(small.nic) else 0
    nic = tray * nics_per_tray + small.nic[local]
    return ServerProfile(pair, tuple(tuple(str(k) for k in r) for r in kinds), nic,
                         small.scaleout_GBps[local].copy())


def _domain_profile(plan: Plan, group: DeviceGroup, trays: int) -> ServerProfile:
    """The profile of a domain of ``trays`` servers of ``group``, by routing every pair."""
    dev = plan.device_types[group.type]
    spec = plan.server_spec(group)
    gpn = group.gpus_per_node
    n = trays * gpn
    nic_gbps = group.nic_gbps if group.nic_gbps is not None else dev.nic_gbps
    g = Graph()
    g.server_domain = [0] * trays
    members = [
        Gpu(g.node("gpu", f"gpu{i}", rank=i, server=i // gpn), i // gpn, i % gpn, nic_gbps,
            dev.scaleup_GBps * GBPS_PER_GBYTE_PER_S)
        for i in range(n)
    ]
    nics = add_domain(g, spec, dev, [members[k:k + gpn] for k in range(0, n, gpn)], 0,
                      group.domain_nodes > 1, plan.network.scale_up.latency_us * 1e3, 0)
    leaf = g.node("leaf", "leaf0")
    for port in nics:
        g.cable(port.node, leaf, port.gbps, 0.0, "nic")
    nodes, links = g.frames()
    router = Router(nodes, links)
    gbps = links["gbps"].to_numpy(dtype=np.float64)
    tier = links["tier"].astype(str).to_numpy()
    pair = np.zeros((n, n), dtype=np.float64)
    kind: list[list[str]] = [["nvlink"] * n for _ in range(n)]
    for j in range(n):  # by destination: the router keeps the last target's distances
        for i in range(n):
            if i == j:
                pair[i, j] = np.inf
                continue
            path = router.path(i, j, 0)
            pair[i, j] = gbps[path].min() / GBPS_PER_GBYTE_PER_S
            kind[i][j] = "nvlink" if (tier[path] == "scale_up").all() else "pci"
    nic = np.asarray([gpu.nic for gpu in members], dtype=np.int64)
    sharers = np.bincount(nic, minlength=len(nics))
    out = np.zeros(n, dtype=np.float64)
    for i in range(n):
        path = router.path(i, leaf, 0)
        route = gbps[path].min()
        out[i] = min(route, nic_gbps / sharers[nic[i]]) / GBPS_PER_GBYTE_PER_S
    return ServerProfile(pair, tuple(tuple(r) for r in kind), nic, out)


def site_GBps(plan: Plan) -> np.ndarray | None:
    """GB/s between sites of ``network.measured`` (the widest path over measured links), or
    None without one."""
    ms = plan.network.measured
    if ms is None:
        return None
    k = len(ms.sites)
    w = np.zeros((k, k), dtype=np.float64)
    for i in range(k):
        for j in range(k):
            v = ms.gbps[i][j]
            w[i, j] = np.inf if i == j else (v / GBPS_PER_GBYTE_PER_S if v is not None else 0.0)
    for m in range(k):  # maximin closure (Floyd-Warshall on bottleneck bandwidth)
        w = np.maximum(w, np.minimum(w[:, m:m + 1], w[m:m + 1, :]))
    return w
