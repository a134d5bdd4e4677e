"""Per-connection rate limits of NCCL's network transports between servers.

A flow that leaves its server (crosses a ``nic`` or ``measured`` link) belongs to one NCCL
connection: (source rank, destination rank, phase, channel), as
:func:`~.routing.connection_keys` hashes it. How fast one connection may go, apart from the
links it shares:

- ``network.nccl_net: ib`` (IB verbs, RoCE): one queue pair per connection
  (NCCL_IB_QPS_PER_CONNECTION = 1, NCCL docs, environment variables), one transport flow;
- ``network.nccl_net: socket``: NCCL's socket transport splits each message into tasks of
  ``max(64 KiB, bytes / sockets)`` over ``sockets = socket_nthreads x nsocks_per_thread``
  TCP sockets, one helper thread per ``nsocks_per_thread`` of them (NVIDIA/nccl
  ``src/transport/net_socket.cc``: ``MIN_CHUNKSIZE (64*1024)``, ``ncclSocketTest``; defaults 1
  thread x 1 socket, 2 x 8 on AWS ENA), so a message uses ``min(sockets, ceil(bytes / 64 KiB))``
  flows; NCCL's bandwidth is then "the minimum speed of the sockets multiplied by the number of
  sockets" (S. Jeaugey, NVIDIA/nccl-tests#83, 2021-05-17).

With ``network.per_flow_gbps`` (a cloud's per-flow limit) a connection is capped at
``per_flow_gbps x flows``; without it nothing is capped here (a TCP socket on bare-metal
Ethernet is taken to reach its links' rate). A ring all-reduce opens a connection per
channel, so it can use several NICs' and flows' worth; a pipeline send is one connection per
peer pair (one channel): its rate is one connection's.

The flow backend applies the cap as one virtual link per (connection, flows) at that rate,
appended to the flow's path (:func:`cap_paths`): flows of one connection share it, as they
share the connection's sockets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .routing import connection_keys

# NCCL src/transport/net_socket.cc MIN_CHUNKSIZE: the smallest task a message is split into.
NCCL_SOCKET_MIN_CHUNK_BYTES = 64 * 1024
# The tiers of links that leave a server (topology/model.py): NIC <-> leaf, measured sites.
LEAVING_TIERS = ("nic", "measured")


@dataclass(frozen=True)
class ConnectionLimit:
    """What caps one NCCL connection between servers (from ``network``)."""

    nccl_net: str = "ib"
    sockets: int = 1  # socket_nthreads x nsocks_per_thread (socket transport)
    per_flow_gbps: float | None = None

    @property
    def active(self) -> bool:
        return self.per_flow_gbps is not None

    def flows(self, nbytes: np.ndarray) -> np.ndarray:
        """Transport flows (TCP sockets or queue pairs) a message of ``nbytes`` uses (int64)."""
        nbytes = np.asarray(nbytes, dtype=np.int64)
        if self.nccl_net != "socket":
            return np.ones(len(nbytes), dtype=np.int64)
        chunks = np.maximum(1, -(-nbytes // NCCL_SOCKET_MIN_CHUNK_BYTES))
        return np.minimum(self.sockets, chunks)


def cap_paths(
    limit: ConnectionLimit, ops: pd.DataFrame, flow_rows: np.ndarray, offsets: np.ndarray,
    links: np.ndarray, link_tier: np.ndarray, num_links: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Paths (CSR ``offsets``, ``links`` over every op row) with one virtual link appended to
    each flow that leaves its server; returns (offsets, links, capacities in Gb/s of the
    virtual links, numbered from ``num_links``). Unchanged when ``limit`` is inactive."""
    empty = np.zeros(0, dtype=np.float64)
    if not limit.active or len(flow_rows) == 0:
        return offsets, links, empty
    n = len(offsets) - 1
    row_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))
    leaving = np.isin(link_tier[links], LEAVING_TIERS)
    capped = np.zeros(n, dtype=bool)
    capped[np.unique(row_of[leaving])] = True
    rows = np.flatnonzero(capped)
    if len(rows) == 0:
        return offsets, links, empty
    col = {c: ops[c].to_numpy()[rows] for c in ("rank", "dst", "phase", "channel", "bytes")}
    key = connection_keys(col["rank"], col["dst"], col["phase"], col["channel"])
    nflows = limit.flows(col["bytes"])
    groups, gid = np.unique(np.stack([key, nflows]), axis=1, return_inverse=True)
    gid = np.asarray(gid).reshape(-1)
    assert limit.per_flow_gbps is not None
    caps = limit.per_flow_gbps * groups[1].astype(np.float64)
    extra = capped.astype(np.int64)
    new_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.diff(offsets) + extra, out=new_off[1:])
    shift = np.cumsum(extra) - extra  # virtual links before each row
    out = np.empty(len(links) + len(rows), dtype=np.int32)
    out[np.arange(len(links)) + shift[row_of]] = links
    out[new_off[rows + 1] - 1] = num_links + gid
    return new_off, out, caps


def refuse_connection_limit(backend: str, limit: ConnectionLimit) -> None:
    """For a backend that does not apply per-connection caps: a one-line BackendError when
    the plan sets one (a cap silently ignored would be a wrong answer)."""
    if limit.active:
        from ..errors import BackendError

        raise BackendError(
            f"{backend}: network.per_flow_gbps ({limit.per_flow_gbps:g} Gb/s per flow) is "
            f"applied by the flow backend only; run with --backend flow or remove the key")
