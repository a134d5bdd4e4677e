"""Hand-built topologies and traces for the ns-3 backend tests (no plan machinery needed)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

from xsim_adapters.testing import handmade
from xsim_adapters.topology import Router, Topology

HAVE_NS3 = importlib.util.find_spec("ns") is not None and importlib.util.find_spec(
    "cppyy"
) is not None
needs_ns3 = [
    pytest.mark.ns3,
    pytest.mark.skipif(not HAVE_NS3, reason="the ns-3 wheel is not installed (pip install ns3)"),
]


def star_topology(
    servers: int,
    gpus_per_server: int,
    nic_gbps: float | list[float] = 100.0,
    nvlink_gbps: float = 2400.0,
    nic_latency_ns: float = 1000.0,
    nvlink_latency_ns: float = 250.0,
) -> Topology:
    """GPUs on an NVSwitch per server, every GPU's NIC on one leaf switch (cables both ways).

    ``nic_gbps`` may be a list, one entry per rank (a slow NIC is the heterogeneity case).
    """
    n = servers * gpus_per_server
    nic = list(nic_gbps) if isinstance(nic_gbps, list) else [float(nic_gbps)] * n
    kinds, names, ranks, srv = [], [], [], []
    for r in range(n):
        kinds.append("gpu")
        names.append(f"gpu{r}")
        ranks.append(r)
        srv.append(r // gpus_per_server)
    for s in range(servers):
        kinds.append("nvswitch")
        names.append(f"nvs{s}")
        ranks.append(-1)
        srv.append(s)
    leaf = len(kinds)
    kinds.append("leaf")
    names.append("leaf0")
    ranks.append(-1)
    srv.append(-1)
    rows = []

    def cable(a: int, b: int, gbps: float, lat: float, tier: str) -> None:
        rows.append((a, b, gbps, lat, tier))
        rows.append((b, a, gbps, lat, tier))

    for r in range(n):
        cable(r, n + r // gpus_per_server, nvlink_gbps, nvlink_latency_ns, "scale_up")
        cable(r, leaf, nic[r], nic_latency_ns, "nic")
    nodes = pd.DataFrame(
        {
            "node_id": np.arange(len(kinds), dtype=np.int32),
            "kind": kinds,
            "name": names,
            "rank": np.array(ranks, np.int32),
            "server": np.array(srv, np.int32),
        }
    )
    links = pd.DataFrame(
        {
            "link_id": np.arange(len(rows), dtype=np.int32),
            "src": np.array([x[0] for x in rows], np.int32),
            "dst": np.array([x[1] for x in rows], np.int32),
            "gbps": np.array([x[2] for x in rows], np.float64),
            "latency_ns": np.array([x[3] for x in rows], np.float64),
            "tier": [x[4] for x in rows],
        }
    )
    return Topology(
        nodes=nodes,
        links=links,
        rank_node=np.arange(n, dtype=np.int32),
        events=pd.DataFrame(
            {"at_ns": pd.Series([], dtype=np.float64), "link_id": pd.Series([], dtype=np.int32),
             "factor": pd.Series([], dtype=np.float64)}
        ),
        _router=Router(nodes, links),
    )


class TraceBuilder(handmade.TraceBuilder):
    """The ns-3 tests' call style: dependencies as the argument after the size."""

    def compute(self, rank: int, ns: int, deps: tuple[int, ...] = ()) -> int:  # type: ignore[override]
        return super().compute(rank, ns, deps=deps)

    def flow(self, src: int, dst: int, nbytes: int,  # type: ignore[override]
             deps: tuple[int, ...] = (), **tags) -> int:
        return super().flow(src, dst, nbytes, deps=deps, **tags)

    def barrier(self, deps: tuple[int, ...] = ()) -> int:  # type: ignore[override]
        return super().barrier(deps=deps)

    def ring_all_reduce(self, ranks: list[int], nbytes: int, collective: int = 0) -> list[int]:
        """The generator's ring all-reduce DAG (``handmade.ring_all_reduce``): the last flows."""
        return handmade.ring_all_reduce(self, ranks, nbytes, collective=collective)
