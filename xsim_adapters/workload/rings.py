"""Ring orders over a set of ranks, ring bandwidths, and splitting bytes across channels.

``hetero_aware`` (default): the ranks of one server are contiguous, so a ring crosses the
scale-out fabric once per server boundary; servers are sorted by NIC speed (then server index),
so the ring crosses between NIC speed classes only twice (slow ones together, fast ones
together). ``natural``: ascending rank order.

Channels: channel c uses the base order reversed when c is odd, and rotated by c // 2 servers
(a different start) otherwise; each channel's share of the bytes is proportional to its ring's
bottleneck bandwidth (the slowest hop).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..plan.model import Plan


class RankInfo:
    """Per-rank arrays (server, NIC Gb/s, scale-up GB/s) of a plan, indexed by global rank."""

    def __init__(self, plan: Plan) -> None:
        n = plan.num_ranks
        self.server = np.zeros(n, dtype=np.int64)
        self.nic_gbps = np.zeros(n, dtype=np.float64)
        self.scaleup_GBps = np.zeros(n, dtype=np.float64)
        self.group = np.zeros(n, dtype=np.int64)
        off = node_off = 0
        for gi, g in enumerate(plan.device_groups):
            dt = plan.device_types[g.type]
            d = np.arange(g.num_devices)
            sl = slice(off, off + g.num_devices)
            self.server[sl] = node_off + d // g.gpus_per_node
            self.nic_gbps[sl] = dt.nic_gbps
            self.scaleup_GBps[sl] = dt.scaleup_GBps
            self.group[sl] = gi
            off += g.num_devices
            node_off += g.nodes

    def link_GBps(self, a: int, b: int) -> float:
        """Bandwidth between two ranks, GB/s: min scale-up if same server, else min NIC."""
        if self.server[a] == self.server[b]:
            return float(min(self.scaleup_GBps[a], self.scaleup_GBps[b]))
        return float(min(self.nic_gbps[a], self.nic_gbps[b])) / 8.0


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


def channel_orders(info: RankInfo, base: Sequence[int], channels: int) -> list[list[int]]:
    """``channels`` ring orders derived from ``base``: odd channels reversed, even rotated."""
    base = list(base)
    n = len(base)
    # Rotation step: one server's worth of ranks, so rotated rings start on another server.
    per_server = max(1, sum(1 for r in base if info.server[r] == info.server[base[0]]))
    out = []
    for c in range(channels):
        rot = ((c // 2) * per_server) % n if n else 0
        order = base[rot:] + base[:rot]
        out.append(order[::-1] if c % 2 else order)
    return out


def split_bytes(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` bytes into integer parts proportional to ``weights`` (sum is exact)."""
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)) or w.sum() <= 0:
        w = np.ones(len(w))
    cum = np.concatenate([[0.0], np.cumsum(w)]) / w.sum()
    cuts = np.floor(total * cum + 1e-9).astype(np.int64)
    cuts[-1] = total
    return np.diff(cuts).tolist()
