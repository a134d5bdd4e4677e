"""The topology: one graph built from the plan, the same network for every backend.

Nodes (``nodes`` frame, ``node_id`` dense 0..N-1 equal to the row index):
``node_id`` int32, ``kind`` str (``gpu``, ``nvswitch``, ``leaf``, ``spine``, ``core``, or a
kind named by an explicit link), ``name`` str (unique, e.g. ``gpu12``, ``nvs3``, ``leaf0``,
``spine1``), ``rank`` int32 (global rank for a GPU, else -1), ``server`` int32 (global server
index for GPUs and NVSwitches, else -1).

Links (``links`` frame, ``link_id`` dense 0..L-1 equal to the row index): directed.
``link_id`` int32, ``src`` int32, ``dst`` int32 (node ids), ``gbps`` float64 (capacity in Gb/s),
``latency_ns`` float64 (propagation + switching), ``tier`` str (``scale_up``, ``nic``,
``fabric``, ``explicit``). A cable is two directed links. Several links between the same pair
are allowed (multi-edge) and are distinct link ids.

Routing is deterministic ECMP: :meth:`Topology.path` gives the link ids a flow crosses, from
its source GPU to its destination GPU, chosen among equal-cost shortest paths by a hash of
``key`` (the flow's op_id), so every backend that asks gets the same path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd


@dataclass
class Topology:
    nodes: pd.DataFrame
    links: pd.DataFrame
    rank_node: np.ndarray  # int32, rank -> node id of its GPU
    # Timed link events resolved to link ids: columns at_ns float64, link_id int32, factor float64
    events: pd.DataFrame = field(default_factory=pd.DataFrame)
    meta: dict[str, Any] = field(default_factory=dict)
    _router: Any = None  # set by the builder: an object with path(src_node, dst_node, key)

    @property
    def num_ranks(self) -> int:
        return len(self.rank_node)

    def path(self, src_rank: int, dst_rank: int, key: int) -> np.ndarray:
        """Link ids (int32, in order) from GPU ``src_rank`` to GPU ``dst_rank`` for flow ``key``."""
        return self._router.path(int(self.rank_node[src_rank]), int(self.rank_node[dst_rank]), key)
