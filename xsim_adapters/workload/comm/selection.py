"""Which algorithm a collective runs, its lowering template and its NCCL delay.

``collectives.algorithm`` (per kind) is ``auto`` (NCCL's tuner rule, :func:`.nccl.choose`),
``ring``, ``tree``, ``nvls`` or ``hierarchical``. A requested algorithm the group cannot run
falls back to ``ring`` (recorded in the trace's ``collectives.algorithm`` column): tree lowers
all-reduce only, NVLS reduce-scatter / all-gather one server only; NVLS needs NVLink SHARP on
every member's server and >= 3 members per server, hierarchical and NVLS need the same member
count on every server. The delay of a templated algorithm adds what its kernel achieves beyond
the tuner's model (:mod:`.nccl_achieved`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...plan.model import Plan
from .algorithms import Layout, layout_of, lower, merge, nominal_ns, tile
from .collectives import RingFlows, ring_flows
from .nccl import NVLS_MIN_RANKS_PER_SERVER, Fabric, choose, delay_ns
from .nccl_achieved import extra_us
from .rings import RankInfo, channels_for, nics_per_server

# A scale-up rate at or below PCIe Gen5 x16 (64 GB/s per direction, Hopper blog) is taken to be
# PCIe, not NVLink (NCCL's link type for its per-step latency and PCI_BW efficiency).
PCIE_MAX_GBPS = 64.0
# Discretization, not calibration: a flow-level pipeline of J pieces over D hops takes
# (J + D - 1) piece times plus J link latencies per hop, so pieces are no smaller than NCCL's
# Simple step (NCCL_BUFFSIZE 4 MiB / NCCL_STEPS 8 = 512 KiB, src/include/device.h, init.cc), at
# most TREE_PIECES_PER_HOP per hop of a tree's depth (fill <= 1/3 of the time), at most
# max(MIN_PIPELINE_CHUNKS, collectives.chunks) for the three phases of a staged lowering.
PIECE_MIN_BYTES = 512 * 1024
TREE_PIECES_PER_HOP = 2
MIN_PIPELINE_CHUNKS = 4
MAX_PIPELINE_CHUNKS = 64


@dataclass(frozen=True)
class Choice:
    """The algorithm a collective runs (``ring`` or a templated one) and its NCCL cost."""

    algorithm: str
    protocol: str
    label: str  # for the trace's collectives.algorithm column
    layout: Layout | None = None  # member positions by server (templated algorithms)
    delay_ns: int = 0  # NCCL delay of a templated algorithm (rings compute their own)
    channels: int = 0  # templated: channels and pipelined pieces (template_args)
    chunks: int = 0


def fabric(plan: Plan, info: RankInfo, ranks: Sequence[int], channels: int = 1) -> Fabric:
    """What NCCL's tuner sees of ``ranks``: the server fabric decides the intra-server rate
    and link type (a route crossing PCIe is ``pci``), each GPU's share of its NIC the
    scale-out rate, and NVLink SHARP needs an NVSwitch server (docs/topology.md)."""
    r = np.asarray(list(ranks), dtype=np.int64)
    servers, counts = np.unique(info.server[r], return_counts=True)
    groups = [plan.device_groups[int(i)] for i in np.unique(info.group[r])]
    types = {plan.device_types[g.type] for g in groups}
    intra = float(info.scaleup_GBps[r].min())
    kinds = set()
    for s in servers:  # the slowest route between members that share a server
        mem = r[info.server[r] == s]
        for a, b in zip(mem[:-1], mem[1:], strict=True):
            intra = min(intra, info.link_GBps(int(a), int(b)))
            kinds.add(info.link_kind(int(a), int(b)))
    many = len(servers) > 1
    pci = "pci" in kinds or intra <= PCIE_MAX_GBPS
    nvswitch = all(plan.server_spec(g).fabric == "nvswitch" for g in groups)
    return Fabric(
        n=len(r), servers=len(servers), ppn=int(counts.max()),
        intra_GBps=intra,
        nic_GBps=float(info.scaleout_GBps[r].min()) if many else float("inf"),
        intra_link="pci" if pci else "nvlink",
        cc=min(t.compute_capability for t in types),
        nvls=nvswitch and all(t.nvls for t in types),
        channels=channels, nics=nics_per_server(info, r.tolist()))


def choose_algorithm(plan: Plan, info: RankInfo, ranks: Sequence[int], kind: str,
                     nbytes: int) -> Choice:
    """The algorithm ``kind`` of ``nbytes`` per rank runs over ``ranks`` (in member order)."""
    want = plan.collectives.algorithm.of(kind)
    r = list(ranks)
    if len(r) < 2 or nbytes <= 0:
        return Choice("ring", "Simple", "ring")
    fab = fabric(plan, info, r, channels_for(info, r, plan.collectives.channels))
    idx = np.asarray(r, dtype=np.int64)
    layout = layout_of(info.server[idx], info.local[idx])
    ok = {"ring", "tree", "nvls", "hierarchical"}
    if kind != "all_reduce":
        ok.discard("tree")
        if fab.servers > 1:  # NVLS RS / AG across servers needs CollNet (enqueue.cc)
            ok.discard("nvls")
    if not (fab.nvls and fab.ppn >= NVLS_MIN_RANKS_PER_SERVER):
        ok.discard("nvls")
    if not layout.uniform:
        ok -= {"nvls", "hierarchical"}
    if fab.ppn < 2:  # one member per server: the hierarchy is the ring itself (and the staged
        ok.discard("hierarchical")  # lowering's one-member server rings made dangling edges)
    cost = choose(kind, nbytes, fab, want if want in ok else ("auto" if want == "auto"
                                                              else "ring"))
    if cost.algorithm not in ok:  # auto chose what this layout cannot lower
        cost = choose(kind, nbytes, fab, "ring")
    if cost.algorithm == "ring":
        return Choice("ring", cost.protocol, f"ring:{cost.protocol}")
    t = template(cost.algorithm, kind, layout, nbytes, plan)
    server = layout.server_of()
    flow_ns = nominal_ns(t, server, fab.intra_GBps, fab.nic_GBps)
    delay = delay_ns(cost, flow_ns) + int(round(extra_us(cost, kind, nbytes, fab) * 1e3))
    return Choice(cost.algorithm, cost.protocol, f"{cost.algorithm}:{cost.protocol}", layout,
                  delay if plan.collectives.nccl_cost else 0,
                  *template_args(cost.algorithm, layout, nbytes, plan))


def template_args(algorithm: str, layout: Layout, nbytes: int, plan: Plan) -> tuple[int, int]:
    """(channels, pipelined pieces) of a templated lowering of ``nbytes`` per member. Trees
    across servers get two channels per member of a server (each chain head, so each NIC,
    carries one channel of each tree, as NCCL spreads tree channels over the NICs)."""
    c = plan.collectives
    ppn = max(len(b) for b in layout.blocks)
    nsrv = len(layout.blocks)
    channels = max(2, c.channels)
    cap = max(MIN_PIPELINE_CHUNKS, c.chunks)
    if algorithm == "tree":
        channels = max(channels, 2 * ppn if nsrv > 1 else 2)
        depth = ppn - 1 + int(np.ceil(np.log2(nsrv))) + 1
        cap = max(c.chunks, TREE_PIECES_PER_HOP * depth)
        per = -(-nbytes // channels)
    else:
        per = nbytes
    pieces = max(1, -(-per // PIECE_MIN_BYTES))
    return channels, int(min(MAX_PIPELINE_CHUNKS, cap, pieces))


def template(algorithm: str, kind: str, layout: Layout, nbytes: int, plan: Plan) -> RingFlows:
    """The lowering template of a templated algorithm with the plan's channels and chunks."""
    return lower(algorithm, kind, layout, nbytes,
                 *template_args(algorithm, layout, nbytes, plan))


def lower_instances(members: np.ndarray, perm: np.ndarray, sizes: np.ndarray,
                    nbytes: np.ndarray, choices: Sequence[Choice], kind: str, granularity: str,
                    chunks: int, ring_label: str, ring_channels: int
                    ) -> tuple[RingFlows, object, object]:
    """Flows of I instances of ``kind`` (``members`` (I, n); rings: ``perm`` (I, C, n) and
    ``sizes`` (I, C)): rings vectorized, other algorithms tiled from one template per layout
    and size. Returns the flows, each instance's algorithm label and channel count (scalars
    when every instance is a ring)."""
    num_i = len(choices)
    ring_idx = np.array([i for i, ch in enumerate(choices) if ch.algorithm == "ring"],
                        dtype=np.int64)
    if len(ring_idx) == num_i:
        return (ring_flows(members, perm, sizes, kind, granularity, chunks), ring_label,
                ring_channels)
    parts: list[tuple[np.ndarray, RingFlows]] = []
    if len(ring_idx):
        parts.append((ring_idx, ring_flows(members[ring_idx], perm[ring_idx], sizes[ring_idx],
                                           kind, granularity, chunks)))
    groups: dict[tuple[Choice, int], list[int]] = {}
    for i, ch in enumerate(choices):
        if ch.algorithm != "ring":
            groups.setdefault((ch, int(nbytes[i])), []).append(i)
    for (ch, size), idx in groups.items():
        assert ch.layout is not None
        t = lower(ch.algorithm, kind, ch.layout, size, ch.channels, ch.chunks)
        parts.append((np.asarray(idx), tile(t, members[idx])))
    labels = np.array([ring_label if ch.algorithm == "ring" else ch.label for ch in choices],
                      dtype=object)
    chans = np.array([ring_channels if ch.algorithm == "ring" else ch.channels
                      for ch in choices], dtype=np.int64)
    return merge(parts, num_i), labels, chans
