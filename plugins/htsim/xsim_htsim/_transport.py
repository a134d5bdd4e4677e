"""The driver's ``--transport`` file from ``Topology.transport`` (the plan's network.transport).

Text, one ``key value`` per line (``xsim-htsim``'s transport.cpp reads it), then one
``ecn_link ID KMIN KMAX`` line per link: the ECN thresholds in bytes at that link's speed,
computed here once by :meth:`EcnSpec.thresholds_at` (the rule's one home).
"""

from __future__ import annotations

import os
from typing import Any

from xsim_adapters.backend_api import BackendError, Topology


def transport_label(spec: Any) -> str:
    """``pfc+dcqcn``, ``none+none``: lossless mode and congestion control, for stats."""
    return f"{spec.lossless}+{spec.cc}"


def write_transport(spec: Any, topology: Topology, path: str | os.PathLike[str],
                    protocol: str, queue_bytes: int | None) -> None:
    """Write the transport file for ``spec`` (a TransportSpec); BackendError for combinations
    the driver does not model (said in one line)."""
    if protocol != "roce":
        raise BackendError(f"htsim: network.transport models RoCE NICs; it applies to protocol"
                           f" roce only (got protocol {protocol})")
    if queue_bytes is not None:
        raise BackendError("htsim: option queue_bytes conflicts with network.transport (the"
                           " switch buffer is network.transport.pfc.buffer_bytes)")
    if spec.cc == "hpcc" and len(topology.events):
        raise BackendError("htsim: network.transport.cc hpcc with timed link events is not"
                           " supported (htsim's HPCC sender cannot be moved to a detour)")
    p = spec.pfc
    lines = [f"lossless {spec.lossless}", f"cc {spec.cc}", f"buffer_bytes {p.buffer_bytes}",
             f"alpha {p.alpha if p.alpha is not None else 0!r}", f"xoff_bytes {p.xoff_bytes}",
             f"xon_bytes {p.xon_bytes}", f"xon_offset_bytes {p.xon_offset_bytes}"]
    if spec.cc == "dcqcn":
        d = spec.dcqcn
        for key in ("g", "alpha_timer_us", "rate_timer_us", "byte_counter_bytes",
                    "fast_recovery_steps", "rai_mbps", "rhai_mbps", "min_rate_mbps",
                    "cnp_interval_us", "initial_alpha"):
            lines.append(f"{key} {getattr(d, key)!r}")
    if spec.cc == "hpcc":
        h = spec.hpcc
        lines += [f"eta {h.eta!r}", f"max_stage {h.max_stage}", f"w_ai_bytes {h.w_ai_bytes}"]
    if spec.ecn is not None:
        lines += ["ecn 1", f"pmax {spec.ecn.pmax!r}"]
        for i, gbps in enumerate(topology.links["gbps"].to_numpy(dtype=float)):
            kmin, kmax = spec.ecn.thresholds_at(float(gbps))
            lines.append(f"ecn_link {i} {kmin} {max(kmax, kmin + 1)}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
