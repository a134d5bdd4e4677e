"""ASTRA-sim configurations beside a Chakra export: the analytical network, system and remote
memory files that describe a plan's cluster as far as ASTRA-sim can, and what they leave out.

ASTRA-sim's analytical network is a stack of uniform dimensions (``topology``, ``npus_count``,
``bandwidth`` GB/s, ``latency`` ns per dimension). A plan maps onto two ``Switch`` dimensions,
the servers' scale-up domain (``gpus_per_node`` GPUs at the slowest GPU's scale-up GB/s) and
the scale-out fabric between servers (each GPU's share of its NIC, the slowest one; latency:
the two links GPU -> leaf -> GPU), or one when the plan has one server. What that cannot
express is returned as warnings: servers of different sizes, scale-up or NIC speeds that
differ between GPUs, per-site links (``network.measured``), explicit links, timed link events,
an oversubscribed or multi-tier fabric (ASTRA-sim's switch is non-blocking).
"""

from __future__ import annotations

import json

import numpy as np

from ..plan.model import Plan
from ..workload.comm.rings import RankInfo

# examples/system/native_collectives/HGX-H100-validated.json of astra-sim (HEAD 518bd51):
# the scheduling and chunking settings of its validated HGX-H100 system configuration.
SYSTEM_DEFAULTS = {"scheduling-policy": "LIFO", "endpoint-delay": 10,
                   "active-chunks-per-dimension": 2, "preferred-dataset-splits": 4,
                   "collective-optimization": "localBWAware", "boost-mode": 0}
LEAF_HOPS = 2  # GPU -> leaf -> GPU: the scale-out latency of two links


def astra_configs(plan: Plan) -> tuple[dict[str, str], list[str]]:
    """(file name -> text of ``network.yml``, ``system.json``, ``memory.json``, and the
    warnings of what the plan has that they cannot express), for ``plan``."""
    info = RankInfo(plan)
    warn: list[str] = []
    sizes = sorted({g.gpus_per_node for g in plan.device_groups})
    nodes = plan.num_nodes
    up, out = info.scaleup_GBps, info.scaleout_GBps
    if len(sizes) > 1:
        warn.append(f"device_groups: servers of {', '.join(map(str, sizes))} GPUs; ASTRA-sim's "
                    "dimensions are uniform: written as one switch over all GPUs")
    if np.ptp(up) > 0:
        warn.append(f"device_types: scale-up {up.min():g}-{up.max():g} GB/s per GPU; written "
                    f"at the slowest, {up.min():g} GB/s")
    if nodes > 1 and np.ptp(out) > 0:
        warn.append(f"device_groups: NIC share {out.min():g}-{out.max():g} GB/s per GPU "
                    f"(heterogeneous NICs); written at the slowest, {out.min():g} GB/s")
    net = plan.network
    for what, present in (("network.measured: per-site links", net.measured is not None),
                          ("network.links: explicit links", bool(net.links)),
                          ("network.events: timed link events", bool(net.events)),
                          ("network.scale_out.oversubscription > 1",
                           net.scale_out.oversubscription > 1),
                          ("network.scale_out: a 3-tier fat tree",
                           net.scale_out.topology != "leaf_spine")):
        if present:
            warn.append(f"{what}: not expressible in ASTRA-sim's analytical network; left out")
    up_ns = round(net.scale_up.latency_us * 1e3, 3)
    out_ns = round(LEAF_HOPS * net.scale_out.latency_us * 1e3, 3)
    if len(sizes) > 1 or nodes == 1:
        dims = [(plan.num_ranks, float(min(up.min(), out.min()) if nodes > 1 else up.min()),
                 out_ns if nodes > 1 else up_ns)]
    else:
        dims = [(sizes[0], float(up.min()), up_ns), (nodes, float(out.min()), out_ns)]
    network = ("topology: [ " + ", ".join("Switch" for _ in dims) + " ]\n"
               f"npus_count: [ {', '.join(str(d[0]) for d in dims)} ]\n"
               f"bandwidth: [ {', '.join(f'{d[1]:g}' for d in dims)} ]  # GB/s\n"
               f"latency: [ {', '.join(f'{d[2]:g}' for d in dims)} ]  # ns\n")
    hbm = min(plan.device_types[g.type].hbm_GBps for g in plan.device_groups)
    system = dict(SYSTEM_DEFAULTS)
    for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        system[f"{kind}-implementation"] = ["ring"] * len(dims)
    system["local-mem-bw"] = hbm  # GB/s, the slowest GPU's HBM
    files = {"network.yml": network, "system.json": json.dumps(system, indent=1) + "\n",
             "memory.json": json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}) + "\n"}
    return files, warn


__all__ = ["astra_configs"]
