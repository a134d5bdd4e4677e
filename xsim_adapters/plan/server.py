"""The ``server:`` field of a device type or device group: how one server's GPUs are wired.

Forms (docs/topology.md, "Server fabrics"):

- a preset name: ``server: dgx1_v100`` (see :data:`SERVER_PRESETS`);
- a mapping ``{fabric, pcie, nvlink, nvlink_GBps, pair_GBps, nics}``, every key optional.

``nvlink`` is a list of ``[a, b, links]`` between local GPU indices, or the name of a shipped
mesh (:data:`NVLINK_MESHES`). Checks that need the group's ``gpus_per_node`` (indices in range,
a connected mesh, a NIC map of the right length) are in :func:`check_server`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from ..errors import PlanError
from . import _fields as f
from . import limits as lim
from .model import NicLayout, PcieSpec, ServerFabric, ServerSpec

SERVER_KEYS = ("fabric", "pcie", "nvlink", "nvlink_GBps", "pair_GBps", "nics")
PCIE_KEYS = ("gen", "lanes", "gpus_per_switch", "uplink_lanes", "host_bridge_GBps", "latency_us",
             "p2p", "host_memory_GBps")
PCIE_GENS = range(1, 7)
PCIE_LANE_WIDTHS = (1, 2, 4, 8, 16, 32)
# pair_GBps builds a cable per GPU pair (n(n-1)/2 per server); bounded by the largest NVLink
# domain announced (NVIDIA Rubin Ultra NVL576: 576 GPUs), so a typo cannot build millions.
MAX_PAIR_CEILING_GPUS = 576

# NVIDIA DGX-1 with Tesla V100 System Architecture (whitepaper WP-08437-002), "DGX-1 NVLink
# Network Topology": a cube with GPUs at its corners, all twelve edges NVLinks (some doubled) and
# two opposite faces with their diagonals: six NVLinks of 25 GB/s per direction on every GPU.
# Doubled pairs as `nvidia-smi topo -m` shows them on a DGX-1V (NV2).
HYBRID_CUBE_MESH: tuple[tuple[int, int, int], ...] = (
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2), (2, 3, 2),
    (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2),
)
NVLINK_MESHES = {"hybrid_cube_mesh": HYBRID_CUBE_MESH}

# Same whitepaper: V100s in pairs under four PCIe Gen3 switches, one 100 Gb/s EDR InfiniBand
# NIC on each switch (one NIC per GPU pair), the switches under the two CPUs' root complexes
# (modelled as one host bridge).
SERVER_PRESETS = {
    "dgx1_v100": ServerSpec(
        fabric="nvlink_mesh",
        pcie=PcieSpec(gen=3, lanes=16, gpus_per_switch=2, uplink_lanes=16),
        nvlink=HYBRID_CUBE_MESH,
        nics="per_pair",
    ),
}


def _named(value: str, table: Mapping[str, Any], path: str, what: str, other: str) -> Any:
    """``table[value]``, or a PlanError listing the names and the other accepted form."""
    if value not in table:
        raise PlanError(
            path, f"unknown {what}; expected one of {', '.join(table)} or {other} "
            f"(got {f.got(value)})"
        )
    return table[value]


def parse_server(value: Any, path: str) -> ServerSpec:
    """A ``server:`` value (preset name or mapping) -> ServerSpec (structure checked here)."""
    if isinstance(value, str):
        return _named(value, SERVER_PRESETS, path, "server preset", "a mapping")
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, SERVER_KEYS)
    m = {k: v for k, v in m.items() if v is not None}  # null: the default (serialized plans)
    fabric = f.get_enum(m, "fabric", path, get_args(ServerFabric), "nvswitch")
    pcie = _parse_pcie(m["pcie"], f.join(path, "pcie")) if "pcie" in m else None
    if fabric == "pcie" and pcie is None:
        pcie = PcieSpec()
    nvlink = _parse_nvlink(m["nvlink"], f.join(path, "nvlink")) if "nvlink" in m else ()
    nvlink_GBps, pair_GBps = (
        f.get_number(m, key, path, at_least=lim.MIN_RATE, at_most=lim.MAX_RATE)
        if key in m else None
        for key in ("nvlink_GBps", "pair_GBps")
    )
    if fabric == "nvlink_mesh" and not nvlink:
        raise PlanError(
            f.join(path, "nvlink"), "required with fabric nvlink_mesh: a list of [a, b, links] "
            f"or {', '.join(NVLINK_MESHES)} (got nothing)"
        )
    if fabric == "nvswitch" and nvlink:
        raise PlanError(
            f.join(path, "nvlink"),
            "only for fabric nvlink_mesh (the mesh) or pcie (NVLink bridges); an NVSwitch "
            "server has no point-to-point NVLinks (got a list)",
        )
    if fabric == "pcie" and nvlink and nvlink_GBps is None:
        raise PlanError(
            f.join(path, "nvlink_GBps"),
            "required with NVLink bridges on a pcie server: GB/s per bridge, one direction "
            "(got nothing)",
        )
    if pair_GBps is not None and fabric != "nvswitch":
        raise PlanError(
            f.join(path, "pair_GBps"),
            f"only for fabric nvswitch; a {fabric} server's pairs are set by its links "
            f"(got {f.got(pair_GBps)})",
        )
    return ServerSpec(
        fabric=fabric,  # type: ignore[arg-type]
        pcie=pcie,
        nvlink=nvlink,
        nvlink_GBps=nvlink_GBps,
        pair_GBps=pair_GBps,
        nics=_parse_nics(m.get("nics", "per_gpu"), f.join(path, "nics")),
    )


def _parse_pcie(value: Any, path: str) -> PcieSpec:
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, PCIE_KEYS)
    m = {k: v for k, v in m.items() if v is not None}
    d = PcieSpec()
    for key in ("lanes", "uplink_lanes"):
        if key in m and m[key] not in PCIE_LANE_WIDTHS:
            raise PlanError(
                f.join(path, key),
                f"expected a PCIe link width, one of {', '.join(map(str, PCIE_LANE_WIDTHS))} "
                f"(got {f.got(m[key])})",
            )
    hb, hm = (
        f.get_number(m, key, path, at_least=lim.MIN_RATE, at_most=lim.MAX_RATE)
        if key in m else None
        for key in ("host_bridge_GBps", "host_memory_GBps")
    )
    p2p = f.get_bool(m, "p2p", path) if "p2p" in m else None
    if p2p and hm is not None:
        raise PlanError(f.join(path, "host_memory_GBps"),
                        "only without peer-to-peer (p2p: false): with p2p: true no GPU "
                        f"transfer goes through host memory (got {hm:g})")
    return PcieSpec(
        gen=f.get_int_in(m, "gen", path, PCIE_GENS, d.gen),
        lanes=f.get_int(m, "lanes", path, d.lanes),
        gpus_per_switch=f.get_int(m, "gpus_per_switch", path, d.gpus_per_switch, minimum=0,
                                  maximum=lim.MAX_DEVICES, limit="MAX_DEVICES"),
        uplink_lanes=f.get_int(m, "uplink_lanes", path, d.uplink_lanes),
        host_bridge_GBps=hb,
        latency_us=f.get_number(m, "latency_us", path, d.latency_us, positive=False,
                                at_most=lim.MAX_TIME_US),
        p2p=p2p,
        host_memory_GBps=hm,
    )


def _parse_nvlink(value: Any, path: str) -> tuple[tuple[int, int, int], ...]:
    if isinstance(value, str):
        return _named(value, NVLINK_MESHES, path, "NVLink mesh", "a list of [a, b, links]")
    out: list[tuple[int, int, int]] = []
    seen: set[tuple[int, int]] = set()
    for i, item in enumerate(f.expect_list(value, path)):
        ok = (
            isinstance(item, list | tuple) and len(item) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
            and item[0] >= 0 and item[1] >= 0 and item[2] >= 1 and item[0] != item[1]
        )
        if not ok:
            raise PlanError(
                f.join(path, i),
                "expected [a, b, links]: two different local GPU indices >= 0 and a positive "
                f"NVLink count (got {f.got(item)})",
            )
        a, b, n = (int(x) for x in item)
        key = (min(a, b), max(a, b))
        if key in seen:
            raise PlanError(f.join(path, i), f"GPU pair {key[0]}-{key[1]} is listed twice")
        seen.add(key)
        out.append((a, b, n))
    return tuple(out)


def _parse_nics(value: Any, path: str) -> NicLayout | tuple[int, ...]:
    if isinstance(value, str):
        if value not in get_args(NicLayout):
            raise PlanError(
                path, f"expected one of {', '.join(get_args(NicLayout))} or a list with the NIC "
                f"index of every local GPU (got {f.got(value)})"
            )
        return value  # type: ignore[return-value]
    items = f.expect_list(value, path) if not isinstance(value, tuple) else list(value)
    if not items or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                            for x in items):
        raise PlanError(
            path,
            f"expected the NIC index (an integer >= 0) of every local GPU (got {f.got(value)})",
        )
    used = sorted(set(items))
    if used != list(range(len(used))):
        raise PlanError(
            path, f"expected NIC indices 0..{len(used) - 1} each used at least once "
            f"(got {f.got(value)})"
        )
    return tuple(int(x) for x in items)


def nic_of_local(spec: ServerSpec, gpus_per_node: int) -> list[int]:
    """The local NIC index of each local GPU of a server with ``gpus_per_node`` GPUs."""
    if isinstance(spec.nics, tuple):
        return list(spec.nics)
    if spec.nics == "per_pair":
        return [i // 2 for i in range(gpus_per_node)]
    if spec.nics == "per_server":
        return [0] * gpus_per_node
    return list(range(gpus_per_node))


def check_server(spec: ServerSpec, gpus_per_node: int, path: str, group: str) -> None:
    """Checks of ``spec`` against a group of ``gpus_per_node`` GPUs per server (``path``: where
    the spec was written)."""
    for i, (a, b, _) in enumerate(spec.nvlink):
        if max(a, b) >= gpus_per_node:
            raise PlanError(
                f.join(f.join(path, "nvlink"), i),
                f"GPU index out of range for group {group} of {gpus_per_node} GPUs per server "
                f"(got {[a, b]})",
            )
    if spec.fabric == "nvlink_mesh" and gpus_per_node > 1:
        reach = {0}
        frontier = [0]
        while frontier:
            u = frontier.pop()
            for a, b, _ in spec.nvlink:
                for x, y in ((a, b), (b, a)):
                    if x == u and y not in reach:
                        reach.add(y)
                        frontier.append(y)
        missing = sorted(set(range(gpus_per_node)) - reach)
        if missing:
            raise PlanError(
                f.join(path, "nvlink"),
                f"the mesh must connect all {gpus_per_node} GPUs of group {group}; GPU "
                f"{missing[0]} has no NVLink path to GPU 0",
            )
    if spec.pair_GBps is not None and gpus_per_node > MAX_PAIR_CEILING_GPUS:
        raise PlanError(
            f.join(path, "pair_GBps"),
            f"a per-pair ceiling needs at most {MAX_PAIR_CEILING_GPUS} GPUs per server "
            f"(MAX_PAIR_CEILING_GPUS; group {group} has {gpus_per_node})",
        )
    if isinstance(spec.nics, tuple) and len(spec.nics) != gpus_per_node:
        raise PlanError(
            f.join(path, "nics"),
            f"expected one NIC index per GPU of group {group} ({gpus_per_node}) "
            f"(got {len(spec.nics)})",
        )


# The largest NVLink domain announced (NVIDIA Rubin Ultra NVL576: 576 GPUs); also bounds the
# domain star the topology builds and the pair table of its profile (topology/profile.py).
MAX_NVLINK_DOMAIN_GPUS = MAX_PAIR_CEILING_GPUS


def check_nvlink_domain(domain_gpus: int, gpus_per_node: int, spec: ServerSpec,
                        path: str) -> None:
    """``device_groups.<g>.nvlink_domain_gpus`` against the group's servers (PlanError)."""
    if domain_gpus > MAX_NVLINK_DOMAIN_GPUS:
        raise PlanError(path, f"expected at most {MAX_NVLINK_DOMAIN_GPUS} GPUs (the largest "
                              f"NVLink domain announced, NVL576) (got {domain_gpus})")
    if domain_gpus % gpus_per_node:
        raise PlanError(path, f"must be a multiple of the group's {gpus_per_node} GPUs per "
                              f"node (a domain is whole servers) (got {domain_gpus})")
    if domain_gpus > gpus_per_node and spec.fabric != "nvswitch":
        raise PlanError(path, f"a domain of several servers needs the nvswitch server fabric "
                              f"(NVLink switch trays); the group's is {spec.fabric}")


def server_to_plain(spec: ServerSpec) -> dict[str, Any]:
    """``spec`` as plan data (:func:`parse_server` of it equals ``spec``)."""
    out: dict[str, Any] = {"fabric": spec.fabric}
    if spec.pcie is not None:
        out["pcie"] = {k: getattr(spec.pcie, k) for k in PCIE_KEYS
                       if getattr(spec.pcie, k) is not None}
    if spec.nvlink:
        out["nvlink"] = [list(x) for x in spec.nvlink]
    for key in ("nvlink_GBps", "pair_GBps"):
        if getattr(spec, key) is not None:
            out[key] = getattr(spec, key)
    out["nics"] = list(spec.nics) if isinstance(spec.nics, tuple) else spec.nics
    return out
