"""Rerouting around failed links: the detours every backend moves a flow to (docs/whatif.md).

A link is *down* while its capacity is 0 (a ``fail`` event or a ``nic_down``, until a
``restore`` / ``nic_up``). Timed link events are a fixed schedule, so which links are down at
any time is known before a run: the distinct event times cut the run into *epochs* (epoch ``e``
starts at the ``e``-th distinct event time, after every event of that instant is applied), and
in each epoch with links down the detour of a flow is its route on the topology without those
links: the same router and rules (:mod:`.routing`: fewest hops, the same ECMP hash of the same
key) on the surviving links. In a leaf-spine or fat tree a failed switch-to-switch link leaves
equal-cost paths, and the detour is one of them; a failed NIC cable leaves none (GPUs do not
forward traffic), and the flow has no detour.

The engines' rule, the same on every backend:

- at the start of epoch ``e``, every flow in flight whose current path crosses a down link
  moves to its epoch-``e`` detour, if it has one; without one it stays, stalled, and if its
  link never comes back the run ends with the error naming the flow and the link;
- a flow starting in epoch ``e`` whose route crosses a down link starts on its detour;
- a restore moves nothing back (a detoured flow keeps its detour to its end; flows starting
  afterwards take their usual route).

What the bytes in flight do is each engine's physics (docs/whatif.md): the flow model moves the
flow's remaining bytes to the detour at the epoch's start (nothing is lost; the flow ends the
detour's latency after its last byte); ns-3 rewrites the pair's host routes, so packets on the
dead link are lost and TCP retransmits them over the detour; htsim switches the flow's route
for packets sent from then on, packets queued at the dead link stay there (delivered as late
duplicates after a restore) and the transport recovers the gap.

:func:`detours` computes the table once for a list of flows (or of ns-3's per-pair paths),
keyed ``epoch * num_items + item``, as CSR arrays every engine loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import PlanError
from .model import Topology
from .routing import Router


@dataclass(frozen=True)
class Epochs:
    """The distinct event times (ns, rising) and the links down from each one on."""

    at_ns: np.ndarray  # float64, one per epoch
    down: list[np.ndarray] = field(default_factory=list)  # bool per link, one per epoch

    @property
    def any_down(self) -> bool:
        return any(d.any() for d in self.down)


def epochs(topology: Topology) -> Epochs:
    """Epochs of ``topology.events``: a link is down from a factor-0 event to the next event
    on it with a positive factor. Events of one instant apply in their stable time order."""
    ev = topology.events
    num_links = len(topology.links)
    if ev is None or len(ev) == 0:
        return Epochs(at_ns=np.zeros(0))
    order = np.argsort(ev["at_ns"].to_numpy(dtype=np.float64), kind="stable")
    at = ev["at_ns"].to_numpy(dtype=np.float64)[order]
    link = ev["link_id"].to_numpy(dtype=np.int64)[order]
    factor = ev["factor"].to_numpy(dtype=np.float64)[order]
    down = np.zeros(num_links, dtype=bool)
    times: list[float] = []
    masks: list[np.ndarray] = []
    for i in range(len(at)):
        down[link[i]] = factor[i] == 0.0
        if i + 1 == len(at) or at[i + 1] != at[i]:
            times.append(float(at[i]))
            masks.append(down.copy())
    return Epochs(at_ns=np.asarray(times, dtype=np.float64), down=masks)


@dataclass(frozen=True)
class Detours:
    """Detour paths as CSR: entry ``j`` is item ``key[j] % num_items`` in epoch
    ``key[j] // num_items``, crossing ``links[offsets[j]:offsets[j+1]]``; keys rise."""

    num_items: int
    key: np.ndarray  # int64
    offsets: np.ndarray  # int64, len(key) + 1
    links: np.ndarray  # int32
    epoch_at_ns: np.ndarray  # float64 per epoch (every epoch, with or without detours)

    def __len__(self) -> int:
        return len(self.key)

    def path(self, j: int) -> np.ndarray:
        return self.links[self.offsets[j]:self.offsets[j + 1]]

    def as_dict(self) -> dict[int, np.ndarray]:
        """key -> link ids (for engines that look entries up by key)."""
        return {int(k): self.path(j) for j, k in enumerate(self.key.tolist())}


def no_detours(num_items: int) -> Detours:
    return Detours(num_items=num_items, key=np.zeros(0, dtype=np.int64),
                   offsets=np.zeros(1, dtype=np.int64), links=np.zeros(0, dtype=np.int32),
                   epoch_at_ns=np.zeros(0))


def detours(topology: Topology, src_rank: np.ndarray, dst_rank: np.ndarray, keys: np.ndarray,
            offsets: np.ndarray, links: np.ndarray, ep: Epochs | None = None) -> Detours:
    """The detour of item ``i`` (a flow ``src_rank[i] -> dst_rank[i]`` routed with key
    ``keys[i]`` on ``links[offsets[i]:offsets[i+1]]``) in every epoch in which a path it may
    be on (its route or an earlier detour) crosses a down link and the surviving topology has
    a route; items without a route get no entry (they stall)."""
    n = len(src_rank)
    ep = epochs(topology) if ep is None else ep
    if not ep.any_down or n == 0:
        out = no_detours(n)
        return Detours(num_items=n, key=out.key, offsets=out.offsets, links=out.links,
                       epoch_at_ns=ep.at_ns)
    offsets = np.asarray(offsets, dtype=np.int64)
    links = np.asarray(links, dtype=np.int64)
    rank_node = topology.rank_node
    rows: list[tuple[int, np.ndarray]] = []
    alts: dict[int, list[np.ndarray]] = {}  # item -> the detours it may be on
    for e, down in enumerate(ep.down):
        if not down.any():
            continue
        hit = np.concatenate(([0], np.cumsum(down[links])))
        cand = set(np.flatnonzero(hit[offsets[1:]] - hit[offsets[:-1]] > 0).tolist())
        cand.update(i for i, ps in alts.items() if any(down[p].any() for p in ps))
        if not cand:
            continue
        router = Router(topology.nodes, topology.links, exclude=down)
        for i in sorted(cand):
            s, d = int(rank_node[src_rank[i]]), int(rank_node[dst_rank[i]])
            try:
                p = router.path(s, d, int(keys[i]))
            except PlanError:  # no route without the down links: the flow stalls
                continue
            if len(p) == 0:
                continue
            rows.append((e * n + i, p))
            alts.setdefault(i, []).append(np.asarray(p, dtype=np.int64))
    rows.sort(key=lambda r: r[0])
    key = np.asarray([k for k, _ in rows], dtype=np.int64)
    off = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(p) for _, p in rows], out=off[1:])
    flat = (np.concatenate([p for _, p in rows]).astype(np.int32) if rows
            else np.zeros(0, dtype=np.int32))
    return Detours(num_items=n, key=key, offsets=off, links=flat, epoch_at_ns=ep.at_ns)
