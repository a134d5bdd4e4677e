"""The ``network`` keys of NCCL's transport between servers: ``nccl_net``, ``socket_nthreads``,
``nsocks_per_thread``, ``per_flow_gbps`` (their model: topology/connections.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from ..errors import PlanError
from . import _fields as f
from . import limits as lim
from .model import NcclNet, NetworkSpec

# NCCL src/transport/net_socket.cc: MAX_THREADS 16 helper threads, MAX_SOCKETS 64 sockets per
# connection (NCCL caps nsocks_per_thread to 64 / nthreads; a plan asking more is refused).
NCCL_SOCKET_MAX_THREADS = 16
NCCL_SOCKET_MAX_SOCKETS = 64


def parse_nccl_net(m: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``network.nccl_net``, ``socket_nthreads``, ``nsocks_per_thread``, ``per_flow_gbps``."""
    out: dict[str, Any] = {
        "nccl_net": f.get_enum(m, "nccl_net", path, get_args(NcclNet), NetworkSpec.nccl_net),
        "socket_nthreads": f.get_int(m, "socket_nthreads", path, NetworkSpec.socket_nthreads,
                                     minimum=1, maximum=NCCL_SOCKET_MAX_THREADS,
                                     limit="NCCL's MAX_THREADS"),
        "nsocks_per_thread": f.get_int(m, "nsocks_per_thread", path,
                                       NetworkSpec.nsocks_per_thread, minimum=1,
                                       maximum=NCCL_SOCKET_MAX_SOCKETS,
                                       limit="NCCL's MAX_SOCKETS"),
    }
    socks = out["socket_nthreads"] * out["nsocks_per_thread"]
    if socks > NCCL_SOCKET_MAX_SOCKETS:
        raise PlanError(f.join(path, "nsocks_per_thread"),
                        f"socket_nthreads x nsocks_per_thread must be at most "
                        f"{NCCL_SOCKET_MAX_SOCKETS} sockets per connection (NCCL's MAX_SOCKETS) "
                        f"(got {out['socket_nthreads']} x {out['nsocks_per_thread']} = {socks})")
    if "per_flow_gbps" in m and m["per_flow_gbps"] is not None:
        out["per_flow_gbps"] = f.get_number(m, "per_flow_gbps", path, at_least=lim.MIN_RATE,
                                            at_most=lim.MAX_RATE)
    return out
