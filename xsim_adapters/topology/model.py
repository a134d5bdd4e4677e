"""The topology: one graph built from the plan, the same network for every backend.

Nodes (``nodes`` frame, ``node_id`` dense 0..N-1 equal to the row index):
``node_id`` int32, ``kind`` str (``gpu``, ``nvswitch``, ``nvlink_port``, ``pcie_switch``,
``pcie_switch_down``, ``host_bridge``, ``host_memory``, ``nic``, ``leaf``, ``spine``, ``core``,
``gateway``, or a kind named by an explicit link), ``name`` str (unique, e.g. ``gpu12``,
``nvs3``, ``nvp5``, ``psw2``, ``pswd2``, ``hb1``, ``hbx1``, ``hm1``, ``nic7``, ``leaf0``,
``spine1``, ``gw0``, ``nvl0``), ``rank`` int32 (global rank for
a GPU, else -1), ``server`` int32 (global server index for GPUs and every node inside a server,
else -1), ``domain`` int32 (NVLink domain: the server's, or a rack's over several servers with
``nvlink_domain_gpus``, its switch ``nvl<d>`` included; -1 outside; frames without the column
have one domain per server).

Links (``links`` frame, ``link_id`` dense 0..L-1 equal to the row index): directed.
``link_id`` int32, ``src`` int32, ``dst`` int32 (node ids), ``gbps`` float64 (capacity in Gb/s),
``latency_ns`` float64 (propagation + switching), ``tier`` str (``scale_up``: NVLink and
NVSwitch; ``pcie``: PCIe links inside a server; ``nic``: NIC to leaf; ``fabric``: between
switches; ``measured``: between sites of ``network.measured``; ``explicit``). A cable is two
directed links. Several links between the same pair are allowed (multi-edge) and are distinct
link ids.

Routing is deterministic ECMP: :meth:`Topology.path` gives the link ids a flow crosses, from
its source GPU to its destination GPU, chosen among equal-cost shortest paths by a hash of
``key``, so every backend that asks gets the same path. :meth:`Topology.ecmp_keys` gives each
flow's key by the plan's ``network.ecmp`` (``ecmp``): its op id (``flow``) or its NCCL
connection (``connection``; :func:`~.routing.connection_keys`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .connections import ConnectionLimit

#: The ``tier`` of scale-up links (NVLink / NVSwitch inside one server).
TIER_SCALE_UP = "scale_up"
#: The tiers of links inside one server: NVLink/NVSwitch and PCIe.
SERVER_TIERS = (TIER_SCALE_UP, "pcie")


def is_scale_up_path(scale_up_link: np.ndarray, path: np.ndarray) -> bool:
    """Whether a flow on ``path`` (link ids) stays on the links of ``scale_up_link`` (bool per
    link id): a non-empty path every link of which is marked. With
    :meth:`Topology.server_links` as the mask (what both packet backends pass) this is an
    intra-server flow (NVLink and/or PCIe), which they time with their fluid (max-min) model
    under ``scale_up=fluid``; this is the one definition both use."""
    p = np.asarray(path, dtype=np.int64)
    return bool(len(p)) and bool(scale_up_link[p].all())


@dataclass
class Topology:
    nodes: pd.DataFrame
    links: pd.DataFrame
    rank_node: np.ndarray  # int32, rank -> node id of its GPU
    # Timed link events resolved to link ids: columns at_ns float64, link_id int32, factor float64
    events: pd.DataFrame = field(default_factory=pd.DataFrame)
    meta: dict[str, Any] = field(default_factory=dict)
    _router: Any = None  # set by the builder: an object with path(src_node, dst_node, key)
    ecmp: str = "flow"  # network.ecmp: what keys a flow's path (routing.ECMP_MODES)
    # network.nccl_net / per_flow_gbps: the rate cap of one NCCL connection between servers
    # (topology/connections.py); the default caps nothing
    connection_limit: ConnectionLimit = field(default_factory=ConnectionLimit)
    # The device type of each rank's GPU (as the plan names it), or None when the builder did
    # not record it (a hand-built topology); checked against a trace's manifest before a run.
    rank_device_types: tuple[str, ...] | None = None
    # network.transport (plan/transport.py TransportSpec): PFC, ECN, NIC congestion control for
    # the packet backends; None: the section is absent (each backend's transport as before).
    transport: Any = None

    @property
    def num_ranks(self) -> int:
        return len(self.rank_node)

    @property
    def router(self) -> Any:
        """The ECMP router; built from ``nodes``/``links`` on first use if the builder set none."""
        if self._router is None:
            from .routing import Router  # late import: routing imports nothing from here

            self._router = Router(self.nodes, self.links)
        return self._router

    def scale_up_links(self) -> np.ndarray:
        """Bool per link id: the link is a scale-up (NVLink/NVSwitch) link."""
        return (self.links["tier"].astype(str) == TIER_SCALE_UP).to_numpy()

    def server_links(self) -> np.ndarray:
        """Bool per link id: the link is inside a server (NVLink/NVSwitch or PCIe).

        PCIe is lossless and credit-based, with no congestion control a packet transport could
        stand in for, so the packet backends' ``scale_up=fluid`` mode times a flow whose whole
        path is such links with the fluid model, as it does NVLink flows. A flow that crosses a
        NIC is a packet flow over all of its path, its PCIe hops included (queues at PCIe rate).
        The two kinds do not see each other on a PCIe link they share (docs/topology.md).
        """
        return self.links["tier"].astype(str).isin(SERVER_TIERS).to_numpy()

    def path(self, src_rank: int, dst_rank: int, key: int) -> np.ndarray:
        """Link ids (int32, in order) from GPU ``src_rank`` to GPU ``dst_rank`` for flow ``key``."""
        return self.router.path(int(self.rank_node[src_rank]), int(self.rank_node[dst_rank]), key)

    def single_path(self, src_rank: int, dst_rank: int) -> bool:
        """Whether every flow from ``src_rank`` to ``dst_rank`` takes the same path (there is
        one shortest path: ECMP has no choice to make)."""
        return bool(self.router.single_path(int(self.rank_node[src_rank]),
                                            int(self.rank_node[dst_rank])))

    def paths_for(
        self, src_ranks: np.ndarray, dst_ranks: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Paths of many flows at once, as CSR ``(offsets int64[n+1], link_ids int32)``.

        Flow ``i`` crosses ``link_ids[offsets[i]:offsets[i+1]]``, the same links as
        ``path(src_ranks[i], dst_ranks[i], keys[i])``. Use this for every flow of a trace.
        """
        src = self.rank_node[np.asarray(src_ranks, dtype=np.int64)]
        dst = self.rank_node[np.asarray(dst_ranks, dtype=np.int64)]
        return self.router.paths_for(src, dst, np.asarray(keys, dtype=np.int64))

    def ecmp_keys(self, ops: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
        """ECMP key (int64) of the flows at ``rows`` of a trace's op table (``op_id`` equal to
        the row index): the op id under ``ecmp: flow``, the flow's NCCL connection (source,
        destination, phase, channel) under ``ecmp: connection``. Every backend routes a
        flow with this key, so they agree on its path."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.ecmp == "flow":
            return rows
        from .routing import connection_keys

        def col(name: str) -> np.ndarray:
            return ops[name].to_numpy()[rows]

        return connection_keys(col("rank"), col("dst"), col("phase"), col("channel"))

    def paths_of_rows(self, ops: pd.DataFrame, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Paths of the flows at ``rows`` (ascending) of a trace's op table, keyed by
        :meth:`ecmp_keys`, as CSR over *every* row: ``(offsets int64[len(ops) + 1], link ids
        int32)``; rows not listed have no links. Routed in slices, so memory beyond the result
        is 4 bytes per flow plus a bounded slice (:func:`~.routing.route_rows`).
        """
        from .routing import route_rows

        node = self.rank_node
        src_ranks = ops["rank"].to_numpy()
        dst_ranks = ops["dst"].to_numpy()
        return route_rows(self.router, rows, len(ops), lambda lo, hi: (
            node[src_ranks[rows[lo:hi]]], node[dst_ranks[rows[lo:hi]]],
            self.ecmp_keys(ops, rows[lo:hi])))
