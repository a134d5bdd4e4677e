"""Hand-built topologies and traces for the what-if tests (rerouting, interval slowdowns)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from xsim_adapters.testing import handmade
from xsim_adapters.topology import Router, Topology
from xsim_adapters.trace.schema import Trace

NIC_GBPS = 100.0
LAT_NS = 1000.0
RATE_B_PER_NS = NIC_GBPS / 8.0  # 12.5 bytes/ns


def two_spines(gpus_per_leaf: int = 2, spine_gbps: float = NIC_GBPS) -> Topology:
    """Two leaves, two spines: GPUs ``0..g-1`` on ``leaf0``, ``g..2g-1`` on ``leaf1``; every
    cable 100 Gb/s (spine cables ``spine_gbps``), 1 us. A flow between the leaves has two
    equal-cost paths, one per spine."""
    n = 2 * gpus_per_leaf
    names = [f"gpu{i}" for i in range(n)] + ["leaf0", "leaf1", "spine0", "spine1"]
    kinds = ["gpu"] * n + ["leaf", "leaf", "spine", "spine"]
    nodes = pd.DataFrame({
        "node_id": np.arange(len(names), dtype=np.int32),
        "kind": pd.Series(kinds, dtype=object),
        "name": pd.Series(names, dtype=object),
        "rank": np.array(list(range(n)) + [-1] * 4, dtype=np.int32),
        "server": np.array(list(range(n)) + [-1] * 4, dtype=np.int32),
    })
    leaf, spine = n, n + 2
    src, dst, bw, tier = [], [], [], []

    def cable(a: int, b: int, gbps: float, t: str) -> None:
        src.extend([a, b])
        dst.extend([b, a])
        bw.extend([gbps, gbps])
        tier.extend([t, t])

    for i in range(n):
        cable(i, leaf + i // gpus_per_leaf, NIC_GBPS, "nic")
    for lf in range(2):
        for sp in range(2):
            cable(leaf + lf, spine + sp, spine_gbps, "fabric")
    links = pd.DataFrame({
        "link_id": np.arange(len(src), dtype=np.int32),
        "src": np.array(src, dtype=np.int32),
        "dst": np.array(dst, dtype=np.int32),
        "gbps": np.array(bw, dtype=np.float64),
        "latency_ns": np.full(len(src), LAT_NS),
        "tier": pd.Series(tier, dtype=object),
    })
    topo = Topology(nodes=nodes, links=links, rank_node=np.arange(n, dtype=np.int32))
    topo._router = Router(nodes, links)
    return topo


def spine_of(topo: Topology, path: np.ndarray) -> int:
    """Which spine (0 or 1) a leaf-to-leaf path crosses."""
    names = topo.nodes["name"].astype(str).to_numpy()
    dsts = names[topo.links["dst"].to_numpy()[path]]
    return int(next(d for d in dsts if d.startswith("spine"))[-1])


def fail_cable(topo: Topology, a: str, b: str, at_ns: float,
               restore_ns: float | None = None) -> None:
    """Set ``topo.events``: the a<->b cable fails at ``at_ns`` (both directions), and comes
    back at ``restore_ns`` if given."""
    names = topo.nodes["name"].astype(str).tolist()
    ia, ib = names.index(a), names.index(b)
    s, d = topo.links["src"].to_numpy(), topo.links["dst"].to_numpy()
    ids = np.flatnonzero(((s == ia) & (d == ib)) | ((s == ib) & (d == ia))).tolist()
    rows = [(at_ns, lk, 0.0) for lk in ids]
    if restore_ns is not None:
        rows += [(restore_ns, lk, 1.0) for lk in ids]
    topo.events = pd.DataFrame({
        "at_ns": np.array([r[0] for r in rows], dtype=np.float64),
        "link_id": np.array([r[1] for r in rows], dtype=np.int32),
        "factor": np.array([r[2] for r in rows], dtype=np.float64),
    })


def two_flows_on_two_spines(nbytes: int, same: bool = False
                            ) -> tuple[Trace, Topology, int, int]:
    """Flows ``gpu0 -> gpu2`` and ``gpu1 -> gpu3`` of ``nbytes`` each, starting at 0, on
    different spines (``same``: on one spine; op ids chosen so their ECMP hashes say so).
    Returns (trace, topology, the first flow's op id, the other's)."""
    topo = two_spines()
    for pad in range(64):  # leading compute ops shift the flows' op ids (their ECMP keys)
        tb = handmade.TraceBuilder(4)
        for _ in range(pad):
            tb.compute(0, 0)
        a = tb.flow(0, 2, nbytes)
        b = tb.flow(1, 3, nbytes)
        sa, sb = spine_of(topo, topo.path(0, 2, a)), spine_of(topo, topo.path(1, 3, b))
        if (sa == sb) == same:
            return tb.build(), topo, a, b
    raise AssertionError("no op ids put the two flows where asked")
