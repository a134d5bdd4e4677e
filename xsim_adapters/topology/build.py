"""Build the :class:`Topology` of a plan: servers, NICs, the scale-out fabric, measured sites.

What is built (node names in brackets; see ``docs/topology.md``):

- one GPU node per global rank [``gpu<rank>``] and each server's inside, by its server fabric
  (:mod:`.servers`: NVSwitch [``nvs<server>``], NVLink mesh, PCIe tree, NICs); with the
  defaults (NVSwitch, one NIC per GPU) each GPU has a cable to its NVSwitch at its type's
  ``scaleup_GBps`` x 8 Gb/s with ``scale_up.latency_us`` and a NIC cable to its leaf at its
  group's ``nic_gbps`` (default: its type's) with ``scale_out.latency_us``;
- ``leaf_spine``: ``nodes_per_leaf`` consecutive servers per leaf [``leaf<i>``]; or, with
  ``rail_optimized``, one pod of all servers where NIC ``i`` of every server is on rail leaf
  ``i``. A leaf's uplink capacity is its attached NIC capacity / ``oversubscription``, realized
  as ``ceil(that / link_gbps)`` links spread round-robin over the spines [``spine<j>``]
  (more uplinks than spines gives parallel links). ``spines == 0`` derives the spine count as
  the largest uplink count of any leaf, so each leaf has at most one link to each spine;
- ``fat_tree``: a 3-tier k-ary fat tree whose hosts are the NICs, in rank order: edge
  switches [``leaf<i>``, kind ``leaf``] of k/2 hosts, aggregation [``spine<i>``, kind
  ``spine``] and core [``core<i>``] switches; only the pods that hold GPUs are built;
- ``network.measured``: one such fabric per site, a gateway [``gw<i>``] on each site's top
  tier, and a directed link per measured pair of sites (tier ``measured``);
- ``network.links``: extra cables between named nodes (new names become new nodes whose kind is
  the name without trailing digits); ``network.events``: resolved to every directed link
  between the two named nodes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..errors import PlanError
from ..plan._fields import got
from ..plan.model import NIC_EVENT_KINDS, Plan
from .connections import ConnectionLimit
from .graph import Graph
from .model import Topology
from .routing import Router
from .servers import Gpu, Nic, add_servers

_EVENT_FACTOR = {"fail": 0.0, "restore": 1.0}


def build_topology(plan: Plan) -> Topology:
    """The network of ``plan``: nodes, directed links (Gb/s, ns), ECMP router, resolved events."""
    g = Graph()
    gpus, nics = add_servers(plan, g)
    so = plan.network.scale_out
    site_of_server = _site_of_server(plan)
    num_sites = max(site_of_server, default=0) + 1
    meta: dict = {}
    tops: list[tuple[list[int], float]] = []  # per site: top-tier switches, site NIC Gb/s
    for site in range(num_sites):
        mine = [n for n in nics if site_of_server[n.server] == site]
        if so.topology == "fat_tree":
            part, top = _add_fat_tree(plan, g, mine)
        else:
            part, top = _add_leaf_spine(plan, g, mine)
        tops.append((top, sum(n.gbps for n in mine)))
        for key, v in part.items():
            if isinstance(v, bool | str):
                meta[key] = v
            elif isinstance(v, list):
                meta[key] = meta.get(key, []) + v
            else:
                meta[key] = meta.get(key, 0) + v
    if plan.network.measured is not None:
        meta["sites"] = num_sites
        _add_measured(plan, g, tops)
    _add_explicit_links(plan, g)
    nodes, links = g.frames()
    events = _resolve_events(plan, g, gpus)
    rank_node = np.asarray([gpu.node for gpu in gpus], dtype=np.int32)
    meta.update(
        {
            "num_gpus": len(gpus),
            "num_servers": plan.num_nodes,
            "num_nics": len(nics),
            "num_nodes": len(nodes),
            "num_links": len(links),
        }
    )
    return Topology(
        nodes=nodes,
        links=links,
        rank_node=rank_node,
        events=events,
        meta=meta,
        _router=Router(nodes, links),
        ecmp=plan.network.ecmp,
        connection_limit=ConnectionLimit(
            nccl_net=plan.network.nccl_net,
            sockets=plan.network.socket_nthreads * plan.network.nsocks_per_thread,
            per_flow_gbps=plan.network.per_flow_gbps),
        rank_device_types=tuple(g.type for g in plan.device_groups
                                for _ in range(g.num_devices)),
        transport=plan.network.transport,
    )


def _site_of_server(plan: Plan) -> list[int]:
    """Site index of every server (all 0 without ``network.measured``)."""
    ms = plan.network.measured
    site_of_group = {}
    if ms is not None:
        site_of_group = {name: i for i, site in enumerate(ms.sites) for name in site}
    out: list[int] = []
    for grp in plan.device_groups:
        out += [site_of_group.get(grp.name, 0)] * grp.nodes
    return out


def _uplinks(down_gbps: float, oversubscription: float, link_gbps: float) -> int:
    """Links of ``link_gbps`` needed for ``down_gbps / oversubscription`` of uplink capacity."""
    need = down_gbps / oversubscription / link_gbps
    return max(1, math.ceil(need - 1e-9))  # tolerance: 12800/2/400 must be 16, not 17


def _add_leaf_spine(plan: Plan, g: Graph, nics: list[Nic]) -> tuple[dict, list[int]]:
    """One leaf-spine over ``nics`` (one site); returns (meta, its top-tier switch nodes)."""
    so = plan.network.scale_out
    out_ns = so.latency_us * 1e3
    if so.rail_optimized:
        leaf_of = [nic.local for nic in nics]
    else:
        if so.nodes_per_leaf < 1:
            raise PlanError(
                "network.scale_out.nodes_per_leaf", f"must be at least 1 (got {so.nodes_per_leaf})"
            )
        order = {s: i for i, s in enumerate(sorted({nic.server for nic in nics}))}
        leaf_of = [order[nic.server] // so.nodes_per_leaf for nic in nics]
    num_leaves = max(leaf_of) + 1 if leaf_of else 0
    leaves = [g.node("leaf", f"leaf{g.count('leaf')}") for _ in range(num_leaves)]
    down = [0.0] * num_leaves
    for nic, leaf in zip(nics, leaf_of, strict=True):
        g.cable(nic.node, leaves[leaf], nic.gbps, out_ns, "nic")
        down[leaf] += nic.gbps
    uplinks = [_uplinks(d, so.oversubscription, so.link_gbps) for d in down]
    if so.spines > 0:
        num_spines = so.spines
    else:
        num_spines = max(uplinks) if num_leaves > 1 else 0
    spines = [g.node("spine", f"spine{g.count('spine')}") for _ in range(num_spines)]
    if num_spines:
        for leaf, n_up in zip(leaves, uplinks, strict=True):
            for j in range(n_up):  # round-robin: the (S+1)-th uplink is a parallel link
                g.cable(leaf, spines[j % num_spines], so.link_gbps, out_ns, "fabric")
    meta = {
        "scale_out": "leaf_spine",
        "rail_optimized": so.rail_optimized,
        "leaves": num_leaves,
        "spines": num_spines,
        "uplinks_per_leaf": uplinks if num_spines else [0] * num_leaves,
    }
    return meta, spines or leaves


def _fat_tree_k(plan: Plan, hosts: int) -> int:
    """The fat tree's radix: given (checked against ``hosts`` NICs), or the smallest that fits."""
    k = plan.network.scale_out.fat_tree_k
    if k:
        if k < 2 or k % 2:
            raise PlanError(
                "network.scale_out.fat_tree_k", f"must be an even number >= 2 (got {k})"
            )
        if k**3 // 4 < hosts:
            raise PlanError(
                "network.scale_out.fat_tree_k",
                f"a 3-tier fat tree of radix {k} holds {k**3 // 4} GPUs; the plan has {hosts}",
            )
        return k
    k = 2
    while k**3 // 4 < hosts:
        k += 2
    return k


def _add_fat_tree(plan: Plan, g: Graph, nics: list[Nic]) -> tuple[dict, list[int]]:
    """One 3-tier fat tree over ``nics`` (one site); returns (meta, its core switch nodes)."""
    so = plan.network.scale_out
    out_ns = so.latency_us * 1e3
    k = _fat_tree_k(plan, len(nics))
    half = k // 2
    num_edges = -(-len(nics) // half)
    pods = -(-num_edges // half)
    edges = [g.node("leaf", f"leaf{g.count('leaf')}") for _ in range(pods * half)]
    aggs = [g.node("spine", f"spine{g.count('spine')}") for _ in range(pods * half)]
    cores = [g.node("core", f"core{g.count('core')}") for _ in range(half * half)]
    for r, nic in enumerate(nics):
        g.cable(nic.node, edges[r // half], nic.gbps, out_ns, "nic")
    for p in range(pods):
        for e in range(half):
            for a in range(half):
                g.cable(edges[p * half + e], aggs[p * half + a], so.link_gbps, out_ns, "fabric")
        for a in range(half):
            for c in range(half):  # aggregation switch a of every pod reaches core group a
                g.cable(aggs[p * half + a], cores[a * half + c], so.link_gbps, out_ns, "fabric")
    meta = {
        "scale_out": "fat_tree",
        "fat_tree_k": k,
        "pods": pods,
        "leaves": len(edges),
        "spines": len(aggs),
        "cores": len(cores),
    }
    return meta, cores


def _add_measured(plan: Plan, g: Graph, tops: list[tuple[list[int], float]]) -> None:
    """A gateway ``gw<i>`` per site on its top-tier switches, and one directed link per
    measured pair of sites at the measured Gb/s and latency (tier ``measured``).

    Each switch-gateway cable carries the site's whole NIC capacity, so the measured link is
    the only new limit; its latency adds to the sites' own NIC and fabric hops.
    """
    ms = plan.network.measured
    assert ms is not None
    out_ns = plan.network.scale_out.latency_us * 1e3
    gws = []
    for i, (top, nic_gbps) in enumerate(tops):
        gw = g.node("gateway", f"gw{i}")
        gws.append(gw)
        for sw in top:
            g.cable(sw, gw, nic_gbps, out_ns, "fabric")
    for i, row in enumerate(ms.gbps):
        for j, gbps in enumerate(row):
            lat = ms.latency_us[i][j]
            if gbps is not None and lat is not None:
                g.link(gws[i], gws[j], gbps, lat * 1e3, "measured")


def _kind_of_name(name: str) -> str:
    kind = name.rstrip("0123456789")
    return kind or "explicit"


def _add_explicit_links(plan: Plan, g: Graph) -> None:
    for i, link in enumerate(plan.network.links):
        where = f"network.links[{i}]"
        if link.src == link.dst:
            raise PlanError(where, f"src and dst must differ (both '{link.src}')")
        if link.gbps <= 0:
            raise PlanError(f"{where}.gbps", f"must be positive (got {link.gbps})")
        ends = []
        for name in (link.src, link.dst):
            nid = g.by_name.get(name)
            if nid is None:
                nid = g.node(_kind_of_name(name), name)
            ends.append(nid)
        g.cable(ends[0], ends[1], link.gbps, link.latency_us * 1e3, "explicit")


def _nic_cable(g: Graph, gpus: list[Gpu], rank: int, where: str,
               nic_links: dict[int, list[int]]) -> list[int]:
    """Link ids of global ``rank``'s NIC cable to the fabric (tier ``nic``, both ways): the
    GPU's own when it holds its NIC, else that of the ``nic<k>`` node serving it.
    ``nic_links``: node -> ids of the ``nic``-tier links it is an end of (built once)."""
    if not 0 <= rank < len(gpus):
        raise PlanError(f"{where}.rank", f"expected a global rank in 0..{len(gpus) - 1} "
                                         f"(got {rank})")
    gpu = gpus[rank]
    node = gpu.node
    if node not in nic_links and gpu.nic >= 0 and f"nic{gpu.nic}" in g.by_name:
        node = g.by_name[f"nic{gpu.nic}"]
    lids = nic_links.get(node, [])
    if not lids:
        raise PlanError(where, f"rank {rank} has no NIC cable to the fabric (a one-server "
                               f"plan has no scale-out network)")
    return lids


def _node_names(g: Graph, most: int = 12) -> str:
    """The topology's node names in short (``gpu0..gpu15, nvs0..nvs1, leaf0``), bounded."""
    by_prefix: dict[str, list[int]] = {}
    for name in g.name:
        prefix = name.rstrip("0123456789")
        digits = name[len(prefix):][:18]  # an explicit link's node may be named anything
        prefix = prefix[:24]
        by_prefix.setdefault(prefix, []).append(int(digits) if digits else -1)
    parts = []
    for prefix, ids in list(by_prefix.items())[:most]:
        lo, hi = min(ids), max(ids)
        parts.append(prefix if hi < 0 else f"{prefix}{lo}" if lo == hi
                     else f"{prefix}{lo}..{prefix}{hi}")
    return ", ".join(parts) + (", ..." if len(by_prefix) > most else "")


def _resolve_events(plan: Plan, g: Graph, gpus: list[Gpu]) -> pd.DataFrame:
    """Timed link events as rows (at_ns, link_id, factor), sorted by time, stable."""
    at: list[float] = []
    ids: list[int] = []
    factors: list[float] = []
    pair_links: dict[tuple[int, int], list[int]] = {}
    nic_links: dict[int, list[int]] = {}  # one pass, not one per NIC event
    for lid, (s, d, tier) in enumerate(zip(g.src, g.dst, g.tier, strict=True)):
        pair_links.setdefault((min(s, d), max(s, d)), []).append(lid)
        if tier == "nic":
            for end in (s, d):
                nic_links.setdefault(end, []).append(lid)
    for i, ev in enumerate(plan.network.events):
        where = f"network.events[{i}]"
        if ev.kind in NIC_EVENT_KINDS:  # the NIC's cable to its leaf fails / comes back
            for lid in _nic_cable(g, gpus, ev.rank, where, nic_links):
                at.append(ev.at_us * 1e3)
                ids.append(lid)
                factors.append(float(ev.factor))
            continue
        ends = []
        for field_name, name in (("src", ev.src), ("dst", ev.dst)):
            nid = g.by_name.get(name)
            if nid is None:
                raise PlanError(
                    f"{where}.{field_name}",
                    f"unknown topology node; expected one of {_node_names(g)} (got {got(name)})",
                )
            ends.append(nid)
        lids = pair_links.get((min(ends), max(ends)), [])
        if not lids:
            raise PlanError(where, f"expected two nodes joined by a link (got {got(ev.src)} "
                                   f"and {got(ev.dst)}, which have none between them)")
        factor = _EVENT_FACTOR.get(ev.kind, ev.factor)
        if factor < 0:
            raise PlanError(f"{where}.factor", f"must be >= 0 (got {factor})")
        for lid in lids:
            at.append(ev.at_us * 1e3)
            ids.append(lid)
            factors.append(float(factor))
    frame = pd.DataFrame(
        {
            "at_ns": np.asarray(at, dtype=np.float64),
            "link_id": np.asarray(ids, dtype=np.int32),
            "factor": np.asarray(factors, dtype=np.float64),
        }
    )
    return frame.sort_values("at_ns", kind="stable").reset_index(drop=True)
