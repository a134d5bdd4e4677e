"""Plan -> plain data -> YAML, such that loading the result gives an equal Plan.

The dict is fully explicit: the model as a mapping, every device type used with all its fields,
every stage with its layers and every replica with its batch share or micro-batch count, so the
round trip does not depend on presets or shorthands staying the same.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import yaml

from .._atomic import write_text_atomic
from .model import Plan
from .perturb import perturb_to_dict
from .server import server_to_plain


def _plain(obj: Any) -> Any:
    """Dataclasses -> dicts, tuples -> lists, recursively."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _model_plain(model: Any) -> dict[str, Any]:
    """The model as data; a dense model writes no ``moe`` key (as plans before MoE)."""
    d = _plain(model)
    if d.get("moe") is None:
        d.pop("moe", None)
    return d  # type: ignore[no-any-return]


def _stage_plain(stage: Any) -> dict[str, Any]:
    """A stage as data; ``ep``, ``cp`` and ``etp`` only when not 1 (their defaults)."""
    d = _plain(stage)
    for key in ("ep", "cp", "etp"):
        if d.get(key) == 1:
            d.pop(key)
    return d  # type: ignore[no-any-return]


def _collectives_plain(c: Any) -> dict[str, Any]:
    """The collectives section as data; ``channels: auto`` is stored as 0."""
    d = _plain(c)
    if d["channels"] == 0:
        d["channels"] = "auto"
    return d  # type: ignore[no-any-return]


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain data in the plan format (``plan_from_dict`` of it equals ``plan``)."""
    types = {}
    for name, dt in plan.device_types.items():
        entry = _plain(dt)
        del entry["name"]
        del entry["profile_rows"]  # read again from ``profile`` when the plan is loaded
        entry["server"] = server_to_plain(dt.server)
        for key in ("profile", "source"):  # unset: leave out rather than write null / ""
            if not entry[key]:
                del entry[key]
        types[name] = entry
    replicas = []
    for rep in plan.replicas:
        r: dict[str, Any] = {"stages": [_stage_plain(s) for s in rep.stages]}
        if rep.batch_share is not None:
            r["batch_share"] = rep.batch_share
        else:
            r["micro_batches"] = rep.micro_batches
        replicas.append(r)
    network = _plain(plan.network)
    for ev in network["events"]:  # a NIC event names a rank; a link event two nodes
        if ev["rank"] < 0:
            del ev["rank"]
        else:
            for key in ("src", "dst", "factor"):
                del ev[key]
    tr = network.get("transport")
    if tr is None:
        network.pop("transport", None)
    else:  # each cc's parameters only under that cc (the loader refuses them elsewhere)
        for key in ("dcqcn", "hpcc"):
            if tr["cc"] != key:
                del tr[key]
        if tr["pfc"]["alpha"] is None:  # static thresholds: written as xoff/xon alone
            del tr["pfc"]["alpha"]
        if tr["ecn"] is None:
            del tr["ecn"]
    ms = plan.network.measured
    if ms is None:
        network.pop("measured", None)
    else:
        network["measured"] = {"groups": [list(x) for x in ms.sites], "gbps": _plain(ms.gbps),
                               "latency_us": _plain(ms.latency_us)}
    return {
        "name": plan.name,
        "seed": plan.seed,
        "model": _model_plain(plan.model),
        "training": _training_plain(plan.training),
        "device_types": types,
        "device_groups": {
            g.name: {"type": g.type, "nodes": g.nodes, "gpus_per_node": g.gpus_per_node,
                     **({} if g.nic_gbps is None else {"nic_gbps": g.nic_gbps}),
                     **({} if not g.nvlink_domain_gpus
                        else {"nvlink_domain_gpus": g.nvlink_domain_gpus}),
                     **({} if g.server is None else {"server": server_to_plain(g.server)})}
            for g in plan.device_groups
        },
        "network": network,
        "replicas": replicas,
        "collectives": _collectives_plain(plan.collectives),
        **({"perturb": perturb_to_dict(plan.perturb)} if plan.perturb.active else {}),
    }


def _training_plain(training: Any) -> dict[str, Any]:
    """``training`` as plain data; ``fsdp`` only with ZeRO-3 (the loader allows it only there,
    and a ZeRO-3 plan that states it gets no default-changed warning when read back)."""
    out = _plain(training)
    if training.zero_stage != 3:
        del out["fsdp"]
    return out


def plan_to_yaml(plan: Plan) -> str:
    """:func:`plan_to_dict` as YAML text (keys in plan order)."""
    return yaml.safe_dump(plan_to_dict(plan), sort_keys=False, default_flow_style=None, width=100)


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write :func:`plan_to_yaml` to ``path`` atomically (temporary file, then rename)."""
    write_text_atomic(path, plan_to_yaml(plan))
