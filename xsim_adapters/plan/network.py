"""Parser of the plan's ``network:`` section: scale-out fabric, scale-up, explicit links, timed
link events, measured inter-site matrices, ECMP, NCCL's network transport and the packet
backends' RoCE transport. Each sub-parser raises :class:`PlanError` naming the first wrong field.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, get_args

from ..errors import PlanError
from . import _fields as f
from . import limits as lim
from .measured import parse_measured
from .model import (
    NIC_EVENT_KINDS,
    EcmpMode,
    ExplicitLink,
    LinkEvent,
    LinkEventKind,
    NetworkSpec,
    ScaleOut,
    ScaleOutTopology,
    ScaleUp,
)
from .nccl_net import parse_nccl_net
from .transport import parse_transport


def parse_network(value: Any, path: str, base_dir: str | None = None) -> NetworkSpec:
    """The ``network:`` section (every part optional) -> NetworkSpec.

    ``base_dir`` resolves a relative ``measured`` CSV path (default: the working directory).
    """
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, ("scale_out", "scale_up", "links", "events", "measured", "ecmp",
                           "nccl_net", "socket_nthreads", "nsocks_per_thread", "per_flow_gbps",
                           "transport"))
    so = _parse_scale_out(m.get("scale_out", {}), f.join(path, "scale_out"))
    su = _parse_scale_up(m.get("scale_up", {}), f.join(path, "scale_up"))
    links = tuple(
        _parse_link(x, f.join(f.join(path, "links"), i))
        for i, x in enumerate(f.expect_list(m.get("links", []), f.join(path, "links")))
    )
    events = tuple(
        _parse_event(x, f.join(f.join(path, "events"), i))
        for i, x in enumerate(f.expect_list(m.get("events", []), f.join(path, "events")))
    )
    measured = (
        parse_measured(m["measured"], f.join(path, "measured"), so.latency_us, base_dir)
        if m.get("measured") is not None else None
    )
    ecmp = f.get_enum(m, "ecmp", path, get_args(EcmpMode), NetworkSpec.ecmp)
    transport = (parse_transport(m["transport"], f.join(path, "transport"))
                 if m.get("transport") is not None else None)
    return NetworkSpec(scale_out=so, scale_up=su, links=links, events=events, measured=measured,
                       ecmp=ecmp, transport=transport,  # type: ignore[arg-type]
                       **parse_nccl_net(m, path))



def _parse_scale_out(value: Any, path: str) -> ScaleOut:
    m = f.expect_mapping(value, path)
    d = ScaleOut()
    f.check_keys(m, path, [x.name for x in dataclasses.fields(ScaleOut)])
    k = f.get_int(m, "fat_tree_k", path, d.fat_tree_k, minimum=0, maximum=lim.MAX_FAT_TREE_K,
                  limit="MAX_FAT_TREE_K, docs/plan.md#limits")
    if k % 2:
        raise PlanError(f.join(path, "fat_tree_k"), f"expected an even radix, or 0 (got {k})")
    return ScaleOut(
        topology=f.get_enum(m, "topology", path, get_args(ScaleOutTopology), d.topology),  # type: ignore[arg-type]
        link_gbps=_rate(m, "link_gbps", path, d.link_gbps),
        latency_us=_time(m, "latency_us", path, d.latency_us),
        oversubscription=f.get_number(
            m, "oversubscription", path, d.oversubscription, at_least=1, at_most=lim.MAX_RATE
        ),
        rail_optimized=f.get_bool(m, "rail_optimized", path, d.rail_optimized),
        nodes_per_leaf=f.get_int(m, "nodes_per_leaf", path, d.nodes_per_leaf,
                                 maximum=lim.MAX_DEVICES, limit=_DEVICES),
        spines=f.get_int(m, "spines", path, d.spines, minimum=0, maximum=lim.MAX_DEVICES,
                         limit=_DEVICES),
        fat_tree_k=k,
    )


_DEVICES = "MAX_DEVICES, docs/plan.md#limits"


def _rate(m: Mapping[str, Any], key: str, path: str, default: Any = f.MISSING) -> float:
    """A bandwidth (Gb/s or GB/s) in [MIN_RATE, MAX_RATE]."""
    return f.get_number(m, key, path, default, at_least=lim.MIN_RATE, at_most=lim.MAX_RATE)


def _time(m: Mapping[str, Any], key: str, path: str, default: Any = f.MISSING) -> float:
    """A non-negative time in microseconds, at most MAX_TIME_US."""
    return f.get_number(m, key, path, default, positive=False, at_most=lim.MAX_TIME_US)


def _parse_scale_up(value: Any, path: str) -> ScaleUp:
    m = f.expect_mapping(value, path)
    d = ScaleUp()
    f.check_keys(m, path, [x.name for x in dataclasses.fields(ScaleUp)])
    return ScaleUp(
        latency_us=_time(m, "latency_us", path, d.latency_us),
        tp_across_nodes=f.get_bool(m, "tp_across_nodes", path, d.tp_across_nodes),
    )


def _parse_link(value: Any, path: str) -> ExplicitLink:
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, ("src", "dst", "gbps", "latency_us"), ("src", "dst", "gbps"))
    src, dst = f.get_str(m, "src", path), f.get_str(m, "dst", path)
    if src == dst:
        raise PlanError(f.join(path, "dst"), f"expected a node other than src (got {f.got(dst)})")
    return ExplicitLink(
        src=src,
        dst=dst,
        gbps=_rate(m, "gbps", path),
        latency_us=_time(m, "latency_us", path, 1.0),
    )


def _parse_event(value: Any, path: str) -> LinkEvent:
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, ("at_us", "kind", "src", "dst", "factor", "rank"), ("at_us", "kind"))
    kind = f.get_enum(m, "kind", path, get_args(LinkEventKind))
    if kind in NIC_EVENT_KINDS:
        for key in ("src", "dst", "factor"):
            if key in m:
                raise PlanError(f.join(path, key), f"not with kind {kind}: a NIC event names "
                                                   f"the GPU whose NIC goes down or up (rank)")
        if "rank" not in m:
            raise PlanError(f.join(path, "rank"), "required key is missing (the global rank "
                                                  "whose NIC goes down or up)")
        return LinkEvent(
            at_us=_time(m, "at_us", path), kind=kind, src="", dst="",  # type: ignore[arg-type]
            factor=0.0 if kind == "nic_down" else 1.0,
            rank=f.get_int(m, "rank", path, minimum=0, maximum=lim.MAX_DEVICES - 1,
                           limit=_DEVICES),
        )
    if "rank" in m:
        raise PlanError(f.join(path, "rank"), f"only with kind nic_down or nic_up (got kind "
                                              f"{kind}, which names src and dst)")
    for key in ("src", "dst"):
        if key not in m:
            raise PlanError(f.join(path, key), "required key is missing")
    if kind == "fail":
        factor = f.get_number(m, "factor", path, 0.0, positive=False)
        if factor != 0.0:
            raise PlanError(
                f.join(path, "factor"),
                f"expected 0 or nothing for a fail event (got {f.got(m['factor'])})",
            )
    elif kind == "degrade":
        factor = f.get_number(m, "factor", path, at_most=1.0)
    else:  # restore: back to nominal unless told otherwise
        factor = f.get_number(m, "factor", path, 1.0, at_most=1.0)
    return LinkEvent(
        at_us=_time(m, "at_us", path),
        kind=kind,  # type: ignore[arg-type]
        src=f.get_str(m, "src", path),
        dst=f.get_str(m, "dst", path),
        factor=factor,
    )


# ---------------------------------------------------------------- collectives
