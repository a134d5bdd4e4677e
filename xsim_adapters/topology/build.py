"""Build the :class:`Topology` of a plan: scale-up stars, NICs, and the scale-out fabric.

What is built (node names in brackets; see ``docs/topology.md``):

- one GPU node per global rank [``gpu<rank>``] and one NVSwitch per server [``nvs<server>``];
  each GPU has a cable (two directed links) to its NVSwitch at its type's ``scaleup_GBps`` x 8
  Gb/s with ``scale_up.latency_us``, and a NIC cable to its leaf at its group's ``nic_gbps``
  (default: its type's)
  with ``scale_out.latency_us``;
- ``leaf_spine``: ``nodes_per_leaf`` consecutive servers per leaf [``leaf<i>``]; or, with
  ``rail_optimized``, one pod of all servers where GPU ``i`` of every server is on rail leaf
  ``i``. A leaf's uplink capacity is its attached NIC capacity / ``oversubscription``, realized
  as ``ceil(that / link_gbps)`` links spread round-robin over the spines [``spine<j>``]
  (more uplinks than spines gives parallel links). ``spines == 0`` derives the spine count as
  the largest uplink count of any leaf, so each leaf has at most one link to each spine;
- ``fat_tree``: a 3-tier k-ary fat tree whose hosts are the GPU NICs, in rank order: edge
  switches [``leaf<i>``, kind ``leaf``] of k/2 hosts, aggregation [``spine<i>``, kind
  ``spine``] and core [``core<i>``] switches; only the pods that hold GPUs are built;
- ``network.links``: extra cables between named nodes (new names become new nodes whose kind is
  the name without trailing digits); ``network.events``: resolved to every directed link
  between the two named nodes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..errors import PlanError
from ..plan.model import Plan
from .model import Topology
from .routing import Router

_GBPS_PER_GBYTE_PER_S = 8.0
_EVENT_FACTOR = {"fail": 0.0, "restore": 1.0}


class _Graph:
    """Accumulates nodes and directed links; ids are dense in insertion order."""

    def __init__(self) -> None:
        self.kind: list[str] = []
        self.name: list[str] = []
        self.rank: list[int] = []
        self.server: list[int] = []
        self.by_name: dict[str, int] = {}
        self.src: list[int] = []
        self.dst: list[int] = []
        self.gbps: list[float] = []
        self.latency_ns: list[float] = []
        self.tier: list[str] = []

    def node(self, kind: str, name: str, rank: int = -1, server: int = -1) -> int:
        nid = len(self.name)
        self.kind.append(kind)
        self.name.append(name)
        self.rank.append(rank)
        self.server.append(server)
        self.by_name[name] = nid
        return nid

    def cable(self, a: int, b: int, gbps: float, latency_ns: float, tier: str) -> None:
        """Two directed links a->b and b->a (ids consecutive)."""
        for s, d in ((a, b), (b, a)):
            self.src.append(s)
            self.dst.append(d)
            self.gbps.append(float(gbps))
            self.latency_ns.append(float(latency_ns))
            self.tier.append(tier)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        nodes = pd.DataFrame(
            {
                "node_id": np.arange(len(self.name), dtype=np.int32),
                "kind": pd.Series(self.kind, dtype=object),
                "name": pd.Series(self.name, dtype=object),
                "rank": np.asarray(self.rank, dtype=np.int32),
                "server": np.asarray(self.server, dtype=np.int32),
            }
        )
        links = pd.DataFrame(
            {
                "link_id": np.arange(len(self.src), dtype=np.int32),
                "src": np.asarray(self.src, dtype=np.int32),
                "dst": np.asarray(self.dst, dtype=np.int32),
                "gbps": np.asarray(self.gbps, dtype=np.float64),
                "latency_ns": np.asarray(self.latency_ns, dtype=np.float64),
                "tier": pd.Series(self.tier, dtype=object),
            }
        )
        return nodes, links


def build_topology(plan: Plan) -> Topology:
    """The network of ``plan``: nodes, directed links (Gb/s, ns), ECMP router, resolved events."""
    g = _Graph()
    gpus = _add_servers(plan, g)
    so = plan.network.scale_out
    if so.topology == "fat_tree":
        meta = _add_fat_tree(plan, g, gpus)
    else:
        meta = _add_leaf_spine(plan, g, gpus)
    _add_explicit_links(plan, g)
    nodes, links = g.frames()
    events = _resolve_events(plan, g)
    rank_node = np.asarray([gpu["node"] for gpu in gpus], dtype=np.int32)
    meta.update(
        {
            "num_gpus": len(gpus),
            "num_servers": plan.num_nodes,
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
    )


def _add_servers(plan: Plan, g: _Graph) -> list[dict]:
    """GPU and NVSwitch nodes and scale-up cables; returns per-rank facts in rank order.

    GPU nodes come first, so a GPU's node id equals its global rank.
    """
    up_ns = plan.network.scale_up.latency_us * 1e3
    gpus: list[dict] = []
    server = 0
    for grp in plan.device_groups:
        dev = plan.device_types[grp.type]
        for d in range(grp.num_devices):
            rank = len(gpus)
            nid = g.node("gpu", f"gpu{rank}", rank=rank, server=server + d // grp.gpus_per_node)
            gpus.append(
                {
                    "node": nid,
                    "server": server + d // grp.gpus_per_node,
                    "local": d % grp.gpus_per_node,
                    "nic_gbps": grp.nic_gbps if grp.nic_gbps is not None else dev.nic_gbps,
                    "scaleup_gbps": dev.scaleup_GBps * _GBPS_PER_GBYTE_PER_S,
                }
            )
        server += grp.nodes
    nvs = [g.node("nvswitch", f"nvs{s}", server=s) for s in range(server)]
    for gpu in gpus:
        g.cable(gpu["node"], nvs[gpu["server"]], gpu["scaleup_gbps"], up_ns, "scale_up")
    return gpus


def _uplinks(down_gbps: float, oversubscription: float, link_gbps: float) -> int:
    """Links of ``link_gbps`` needed for ``down_gbps / oversubscription`` of uplink capacity."""
    need = down_gbps / oversubscription / link_gbps
    return max(1, math.ceil(need - 1e-9))  # tolerance: 12800/2/400 must be 16, not 17


def _add_leaf_spine(plan: Plan, g: _Graph, gpus: list[dict]) -> dict:
    so = plan.network.scale_out
    out_ns = so.latency_us * 1e3
    if so.rail_optimized:
        leaf_of = [gpu["local"] for gpu in gpus]
    else:
        if so.nodes_per_leaf < 1:
            raise PlanError(
                "network.scale_out.nodes_per_leaf", f"must be at least 1 (got {so.nodes_per_leaf})"
            )
        leaf_of = [gpu["server"] // so.nodes_per_leaf for gpu in gpus]
    num_leaves = max(leaf_of) + 1 if leaf_of else 0
    leaves = [g.node("leaf", f"leaf{i}") for i in range(num_leaves)]
    down = [0.0] * num_leaves
    for gpu, leaf in zip(gpus, leaf_of, strict=True):
        g.cable(gpu["node"], leaves[leaf], gpu["nic_gbps"], out_ns, "nic")
        down[leaf] += gpu["nic_gbps"]
    uplinks = [_uplinks(d, so.oversubscription, so.link_gbps) for d in down]
    if so.spines > 0:
        num_spines = so.spines
    else:
        num_spines = max(uplinks) if num_leaves > 1 else 0
    spines = [g.node("spine", f"spine{j}") for j in range(num_spines)]
    if num_spines:
        for leaf, n_up in zip(leaves, uplinks, strict=True):
            for j in range(n_up):  # round-robin: the (S+1)-th uplink is a parallel link
                g.cable(leaf, spines[j % num_spines], so.link_gbps, out_ns, "fabric")
    return {
        "scale_out": "leaf_spine",
        "rail_optimized": so.rail_optimized,
        "leaves": num_leaves,
        "spines": num_spines,
        "uplinks_per_leaf": uplinks if num_spines else [0] * num_leaves,
    }


def _fat_tree_k(plan: Plan, hosts: int) -> int:
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


def _add_fat_tree(plan: Plan, g: _Graph, gpus: list[dict]) -> dict:
    so = plan.network.scale_out
    out_ns = so.latency_us * 1e3
    k = _fat_tree_k(plan, len(gpus))
    half = k // 2
    num_edges = -(-len(gpus) // half)
    pods = -(-num_edges // half)
    edges = [g.node("leaf", f"leaf{i}") for i in range(pods * half)]
    aggs = [g.node("spine", f"spine{i}") for i in range(pods * half)]
    cores = [g.node("core", f"core{i}") for i in range(half * half)]
    for r, gpu in enumerate(gpus):
        g.cable(gpu["node"], edges[r // half], gpu["nic_gbps"], out_ns, "nic")
    for p in range(pods):
        for e in range(half):
            for a in range(half):
                g.cable(edges[p * half + e], aggs[p * half + a], so.link_gbps, out_ns, "fabric")
        for a in range(half):
            for c in range(half):  # aggregation switch a of every pod reaches core group a
                g.cable(aggs[p * half + a], cores[a * half + c], so.link_gbps, out_ns, "fabric")
    return {
        "scale_out": "fat_tree",
        "fat_tree_k": k,
        "pods": pods,
        "leaves": len(edges),
        "spines": len(aggs),
        "cores": len(cores),
    }


def _kind_of_name(name: str) -> str:
    kind = name.rstrip("0123456789")
    return kind or "explicit"


def _add_explicit_links(plan: Plan, g: _Graph) -> None:
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


def _resolve_events(plan: Plan, g: _Graph) -> pd.DataFrame:
    """Timed link events as rows (at_ns, link_id, factor), sorted by time, stable."""
    at: list[float] = []
    ids: list[int] = []
    factors: list[float] = []
    pair_links: dict[tuple[int, int], list[int]] = {}
    for lid, (s, d) in enumerate(zip(g.src, g.dst, strict=True)):
        pair_links.setdefault((min(s, d), max(s, d)), []).append(lid)
    for i, ev in enumerate(plan.network.events):
        where = f"network.events[{i}]"
        ends = []
        for field_name, name in (("src", ev.src), ("dst", ev.dst)):
            nid = g.by_name.get(name)
            if nid is None:
                raise PlanError(
                    f"{where}.{field_name}",
                    f"unknown topology node '{name}' (names look like gpu0, nvs0, leaf0, spine0)",
                )
            ends.append(nid)
        lids = pair_links.get((min(ends), max(ends)), [])
        if not lids:
            raise PlanError(where, f"no link between '{ev.src}' and '{ev.dst}'")
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
