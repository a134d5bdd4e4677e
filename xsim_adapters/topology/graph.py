"""The mutable graph the topology builders fill: nodes and directed links, ids dense."""

from __future__ import annotations

import numpy as np
import pandas as pd


class Graph:
    """Accumulates nodes and directed links; ids are dense in insertion order."""

    def __init__(self) -> None:
        self.kind: list[str] = []
        self.name: list[str] = []
        self.rank: list[int] = []
        self.server: list[int] = []
        self.domain: list[int] = []  # explicit NVLink domain (-1: the server's, see frames)
        # NVLink domain of each global server (None: a domain per server, its own index)
        self.server_domain: list[int] | None = None
        self.by_name: dict[str, int] = {}
        self.src: list[int] = []
        self.dst: list[int] = []
        self.gbps: list[float] = []
        self.latency_ns: list[float] = []
        self.tier: list[str] = []
        self._counts: dict[str, int] = {}

    def node(self, kind: str, name: str, rank: int = -1, server: int = -1,
             domain: int = -1) -> int:
        """A new node; ``domain`` only for nodes of an NVLink domain outside any one server
        (the switch of a rack of trays): others take their server's domain."""
        nid = len(self.name)
        self.kind.append(kind)
        self.name.append(name)
        self.rank.append(rank)
        self.server.append(server)
        self.domain.append(domain)
        self.by_name[name] = nid
        self._counts[kind] = self._counts.get(kind, 0) + 1
        return nid

    def count(self, kind: str) -> int:
        """How many nodes of ``kind`` there are so far (the next one's index)."""
        return self._counts.get(kind, 0)

    def link(self, a: int, b: int, gbps: float, latency_ns: float, tier: str) -> None:
        """One directed link a->b."""
        self.src.append(a)
        self.dst.append(b)
        self.gbps.append(float(gbps))
        self.latency_ns.append(float(latency_ns))
        self.tier.append(tier)

    def cable(self, a: int, b: int, gbps: float, latency_ns: float, tier: str) -> None:
        """Two directed links a->b and b->a (ids consecutive)."""
        self.link(a, b, gbps, latency_ns, tier)
        self.link(b, a, gbps, latency_ns, tier)

    def domains(self) -> np.ndarray:
        """int32 NVLink domain of every node: its explicit one, else its server's (the server
        index itself without :attr:`server_domain`), -1 outside every domain."""
        server = np.asarray(self.server, dtype=np.int64)
        out = np.asarray(self.domain, dtype=np.int64)
        inside = (out < 0) & (server >= 0)
        if self.server_domain is None:
            out[inside] = server[inside]
        else:
            out[inside] = np.asarray(self.server_domain, dtype=np.int64)[server[inside]]
        return out.astype(np.int32)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        nodes = pd.DataFrame(
            {
                "node_id": np.arange(len(self.name), dtype=np.int32),
                "kind": pd.Series(self.kind, dtype=object),
                "name": pd.Series(self.name, dtype=object),
                "rank": np.asarray(self.rank, dtype=np.int32),
                "server": np.asarray(self.server, dtype=np.int32),
                "domain": self.domains(),
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
