"""Ring orders over a set of ranks, ring bandwidths, and splitting bytes across channels.

``hetero_aware`` (default): the ranks of one server are contiguous, so a ring crosses the
scale-out fabric once per server boundary; servers are sorted by NIC speed (then server index),
so the ring crosses between NIC speed classes only twice (slow ones together, fast ones
together). ``natural``: ascending rank order.

Channels, as NCCL builds them on servers with one NIC per GPU: inside each server a channel's
ring is a rotation of that server's members, so it enters the server at one GPU and leaves it
from the GPU just before (that GPU's NIC carries the channel out). Channel pair j (channels 2j
and 2j+1) starts server 0 at its member j; every next server starts at the member on the same
local index (the same rail) as the GPU the ring left the previous server from, so every hop
between servers stays on one rail (except, when the servers' members do not line up, the wrap-
around). Odd servers are walked in the other direction, so with an even number of servers the
wrap-around is on a rail too. Channel pair j leaves server 0 from its member j-1 and the odd
servers from member j, so channel pairs 0..m-1 use all m NICs of a server with m ring members.
Odd channels run the same ring reversed (the other direction of each NIC). On one server,
channels are the base order and its reverse. ``channels: auto`` (the default) opens the rings
NCCL opens: one forward ring per NIC the members of a server use (:func:`auto_orders`). Each
channel's share of the bytes is proportional to its ring's bottleneck bandwidth (slowest hop).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...plan.model import Plan
from ...topology.profile import ServerProfile, server_profile, site_GBps
from .nccl import ring_cost


class RankInfo:
    """Per-rank facts of a plan, indexed by global rank, and per-pair bandwidth queries.

    ``server`` is the rank's NVLink domain, what NCCL calls a node: a server, or the compute
    trays of an NVL rack (``nvlink_domain_gpus``), which NCCL's multi-node NVLink fuses into
    one node (NVIDIA/nccl ``src/graph/topo.cc``: the topologies of an MNNVL clique are fused;
    ``src/init.cc``: nNodes counts ring graphs). ``tray`` is the physical server.
    Arrays: ``server``, ``tray``, ``group``, ``local`` (index in its domain), ``site`` (of
    ``network.measured``; 0 without), ``nic_gbps`` (line rate of the rank's NIC, Gb/s),
    ``scaleup_GBps`` (the type's NVLink GB/s), ``nic`` (global NIC index, numbered server by
    server), ``nic_local`` (NIC index inside the server: the rail), ``scaleout_GBps`` (the rank's
    share of its NIC, capped by its PCIe route to it, GB/s). Pair queries come from the server
    fabric the topology builds (:func:`xsim_adapters.topology.profile.server_profile`).
    """

    def __init__(self, plan: Plan) -> None:
        n = plan.num_ranks
        self.server = np.zeros(n, dtype=np.int64)
        self.tray = np.zeros(n, dtype=np.int64)
        self.nic_gbps = np.zeros(n, dtype=np.float64)
        self.scaleup_GBps = np.zeros(n, dtype=np.float64)
        self.group = np.zeros(n, dtype=np.int64)
        self.local = np.zeros(n, dtype=np.int64)
        self.site = np.zeros(n, dtype=np.int64)
        self.nic = np.zeros(n, dtype=np.int64)
        self.nic_local = np.zeros(n, dtype=np.int64)
        self.scaleout_GBps = np.zeros(n, dtype=np.float64)
        self._profiles: list[ServerProfile] = []
        ms = plan.network.measured
        site_of = {} if ms is None else {x: i for i, st in enumerate(ms.sites) for x in st}
        off = node_off = dom_off = nic_off = 0
        for gi, g in enumerate(plan.device_groups):
            dt = plan.device_types[g.type]
            prof = server_profile(plan, g)  # one NVLink domain of the group
            self._profiles.append(prof)
            d = np.arange(g.num_devices)
            sl = slice(off, off + g.num_devices)
            local = d % g.domain_gpus
            node = d // g.gpus_per_node
            nics_per_domain = int(prof.nic.max()) + 1 if len(prof.nic) else 0
            nics_per_tray = nics_per_domain // g.domain_nodes
            self.server[sl] = dom_off + d // g.domain_gpus
            self.tray[sl] = node_off + node
            self.nic_gbps[sl] = g.nic_gbps if g.nic_gbps is not None else dt.nic_gbps
            self.scaleup_GBps[sl] = dt.scaleup_GBps
            self.group[sl] = gi
            self.local[sl] = local
            self.site[sl] = site_of.get(g.name, 0)
            self.nic_local[sl] = prof.nic[local] - (local // g.gpus_per_node) * nics_per_tray
            self.nic[sl] = nic_off + (d // g.domain_gpus) * nics_per_domain + prof.nic[local]
            self.scaleout_GBps[sl] = prof.scaleout_GBps[local]
            off += g.num_devices
            node_off += g.nodes
            dom_off += g.num_domains
            nic_off += g.nodes * nics_per_tray
        self._site_GBps = site_GBps(plan)

    def link_GBps(self, a: int, b: int) -> float:
        """Bandwidth from rank ``a`` to rank ``b``, GB/s: inside a server (NVLink domain), the
        bottleneck of their route in its fabric; across domains, the smaller of the two ranks' NIC
        shares (and of the measured path between their sites)."""
        if self.server[a] == self.server[b]:
            prof = self._profiles[int(self.group[a])]
            return float(prof.pair_GBps[self.local[a], self.local[b]])
        bw = float(min(self.scaleout_GBps[a], self.scaleout_GBps[b]))
        if self._site_GBps is not None and self.site[a] != self.site[b]:
            bw = min(bw, float(self._site_GBps[self.site[a], self.site[b]]))
        return bw

    def link_kind(self, a: int, b: int) -> str:
        """NCCL's link type between two ranks: ``nvlink`` (an NVLink-only route inside a
        server), ``pci`` (a route inside a server that crosses PCIe) or ``net`` (servers)."""
        if self.server[a] != self.server[b]:
            return "net"
        prof = self._profiles[int(self.group[a])]
        return prof.pair_kind[int(self.local[a])][int(self.local[b])]


def ring_order(info: RankInfo, ranks: Sequence[int], policy: str) -> list[int]:
    """The ring order of ``ranks`` under ``policy`` (``hetero_aware`` or ``natural``)."""
    rs = sorted(int(r) for r in ranks)
    if policy == "natural":
        return rs
    # Sort key per rank: (NIC speed of its server's class, server, rank). Servers are homogeneous
    # (one device group each), so ranks of a server stay contiguous.
    return sorted(rs, key=lambda r: (info.nic_gbps[r], info.server[r], r))


def ring_bottleneck_GBps(info: RankInfo, order: Sequence[int]) -> float:
    """The slowest hop of the ring ``order`` (including the wrap-around), GB/s."""
    n = len(order)
    if n < 2:
        return float("inf")
    return min(info.link_GBps(order[i], order[(i + 1) % n]) for i in range(n))


def ring_delay_ns(info: RankInfo, kind: str, orders: Sequence[Sequence[int]],
                  sizes: Sequence[int]) -> int:
    """NCCL's extra cost (latency and protocol bandwidth, :mod:`.nccl`) of a ring ``kind``
    whose channels have ``orders`` and carry ``sizes`` bytes: the largest over channels, ns."""
    worst = 0
    for order, nbytes in zip(orders, sizes, strict=True):
        n = len(order)
        if n < 2 or nbytes <= 0:
            continue
        hops = [(order[i], order[(i + 1) % n]) for i in range(n)]
        slow = min(hops, key=lambda h: info.link_GBps(*h))
        link = info.link_kind(*slow)  # nvlink | pci | net, from the server fabric
        servers = len({int(info.server[r]) for r in order})
        cost = ring_cost(kind, n, int(nbytes), servers, info.link_GBps(*slow), link, len(orders),
                         nics=nics_per_server(info, order))
        worst = max(worst, cost.extra_ns)
    return worst


def nics_per_server(info: RankInfo, ranks: Sequence[int]) -> int:
    """Distinct NICs the members of the fullest (in NICs) server among ``ranks`` use."""
    per: dict[int, set[int]] = {}
    for r in ranks:
        per.setdefault(int(info.server[r]), set()).add(int(info.nic[r]))
    return max((len(v) for v in per.values()), default=1)


def _server_blocks(info: RankInfo, order: Sequence[int]) -> list[list[int]]:
    """``order`` cut into runs of consecutive ranks on one server."""
    blocks: list[list[int]] = []
    for r in order:
        if blocks and info.server[blocks[-1][-1]] == info.server[r]:
            blocks[-1].append(r)
        else:
            blocks.append([r])
    return blocks


def _rail_aligned(info: RankInfo, blocks: list[list[int]], j: int) -> list[int]:
    """Channel pair ``j``'s ring: server blocks rotated so each hop between servers stays on
    one rail and successive servers leave from successive GPUs (see the module docstring)."""
    out: list[int] = []
    exit_local = -1
    for b, block in enumerate(blocks):
        locals_ = [int(info.local[r]) for r in block]
        if b > 0 and exit_local in locals_:
            start = locals_.index(exit_local)
        else:
            start = j % len(block)
        m = len(block)
        # Odd servers are walked downwards, so the ring closes on a rail with an even count.
        rot = [block[(start + (-i if b % 2 else i)) % m] for i in range(m)]
        out += rot
        exit_local = int(info.local[rot[-1]])
    return out


def channel_orders(info: RankInfo, base: Sequence[int], channels: int) -> list[list[int]]:
    """Ring orders of the channels of a ring over ``base`` (a server-contiguous order).

    ``channels`` > 0: that many rail-aligned rotations, channel pair j (2j, 2j+1) leaving
    server 0 from its member j-1, odd channels reversed (the plan's explicit count).
    ``channels`` = 0 (``auto``): NCCL's channels, see :func:`auto_orders`."""
    base = list(base)
    if channels <= 0:
        return auto_orders(info, base)
    blocks = _server_blocks(info, base)
    out = []
    for c in range(channels):
        order = base if len(blocks) < 2 else _rail_aligned(info, blocks, c // 2)
        out.append(order[::-1] if c % 2 else order)
    return out


def auto_orders(info: RankInfo, base: Sequence[int]) -> list[list[int]]:
    """``channels: auto``: the rings NCCL opens for the ring's members (its topology search
    gives at least one ring per NIC a server contributes; each ring enters a server through
    one NIC and leaves through another, so a ring per NIC loads every NIC once in each
    direction). One rail-aligned forward ring per distinct NIC among the members of the
    server with the most of them, leaving server 0 from the first member on each NIC; on one
    server a single ring (every GPU link carries the ring once each way already)."""
    base = list(base)
    blocks = _server_blocks(info, base)
    if len(blocks) < 2:
        return [base]
    first = blocks[0]
    exits: dict[int, int] = {}
    for pos, r in enumerate(first):
        exits.setdefault(int(info.nic[r]), pos)
    most = max(len({int(info.nic[r]) for r in b}) for b in blocks)
    if len(exits) == most:
        starts = [(pos + 1) % len(first) for pos in sorted(exits.values())]
    else:  # another server has more NICs: successive starts cover its members
        starts = list(range(most))
    return [_rail_aligned(info, blocks, j) for j in starts]


def channels_for(info: RankInfo, ranks: Sequence[int], requested: int) -> int:
    """Channel count of a ring over ``ranks``: ``requested`` if positive, else (``auto``) the
    number of rings :func:`auto_orders` opens."""
    if requested > 0:
        return requested
    base = ring_order(info, ranks, "hetero_aware")
    return len(auto_orders(info, base))


def split_bytes(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` bytes into integer parts proportional to ``weights`` (sum is exact)."""
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)) or w.sum() <= 0:
        w = np.ones(len(w))
    cum = np.concatenate([[0.0], np.cumsum(w)]) / w.sum()
    cuts = np.floor(total * cum + 1e-9).astype(np.int64)
    cuts[-1] = total
    return np.diff(cuts).tolist()
