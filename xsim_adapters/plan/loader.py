"""From YAML text or a plain dict to a validated :class:`Plan`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import PlanError
from . import _fields as f
from .memory import check_feasible
from .model import DeviceType, Plan
from .presets import _device_presets, _model_presets
from .replicas import parse_groups, parse_replicas
from .sections import (
    check_precision,
    parse_collectives,
    parse_device_type,
    parse_model,
    parse_network,
    parse_training,
)

TOP_KEYS = (
    "name",
    "seed",
    "model",
    "training",
    "device_types",
    "device_groups",
    "network",
    "replicas",
    "collectives",
)
REQUIRED_TOP_KEYS = ("name", "model", "training", "device_groups", "replicas")
OPTIONAL_SECTIONS = ("device_types", "network", "collectives")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last silently."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, list | dict):
            continue  # unhashable keys fail in the base constructor with its own message
        if key in seen:
            mark = key_node.start_mark
            raise PlanError(
                "",
                f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: "
                f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,  # type: ignore[arg-type]
)


def parse_yaml(text: str, source: str = "<text>") -> Any:
    """YAML text -> Python data; YAML errors become PlanError with a 1-based line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = e.problem or e.context or "malformed"
        raise PlanError("", f"invalid YAML{where} in {source}: {problem}") from None
    except yaml.YAMLError as e:
        raise PlanError("", f"invalid YAML in {source}: {e}") from None


def load_plan(path_or_text: str | os.PathLike[str], *, feasibility: bool = True) -> Plan:
    """Read a plan from a ``.yaml``/``.yml`` file path or from YAML text; validate fully.

    Relative ``profile:`` paths resolve against the file's directory (the working directory for
    text). Runs :func:`check_feasible` unless ``feasibility`` is false.
    """
    # A one-line string is a path if it names a file or looks like one; YAML text otherwise.
    is_path = isinstance(path_or_text, os.PathLike) or (
        "\n" not in path_or_text
        and (path_or_text.strip().endswith((".yaml", ".yml")) or os.path.isfile(path_or_text))
    )
    if is_path:
        p = Path(path_or_text)
        if not p.is_file():
            raise PlanError("", f"plan file not found: {p}")
        data = parse_yaml(p.read_text(), str(p))
        base_dir: str | None = str(p.resolve().parent)
    else:
        data = parse_yaml(str(path_or_text))
        base_dir = None
    return plan_from_dict(data, base_dir=base_dir, feasibility=feasibility)


def plan_from_dict(d: Any, base_dir: str | None = None, *, feasibility: bool = True) -> Plan:
    """A plan as plain data (what YAML gives) -> validated Plan; see docs/plan.md for the format.

    ``base_dir`` resolves relative profile paths (default: the working directory).
    """
    if d is None:
        raise PlanError(
            "",
            f"the plan is empty: expected a mapping with keys {', '.join(REQUIRED_TOP_KEYS)}"
            " (got nothing)",
        )
    if not isinstance(d, Mapping):
        raise PlanError(
            "", f"expected a mapping at the top level of the plan (got a {type(d).__name__})"
        )
    f.check_keys(d, "", TOP_KEYS, REQUIRED_TOP_KEYS)
    # An optional section written with nothing under it (`network:`) means all defaults.
    d = {k: ({} if v is None and k in OPTIONAL_SECTIONS else v) for k, v in d.items()}
    name = f.get_str(d, "name", "")
    seed = f.get_int(d, "seed", "", 0, minimum=0)
    model = parse_model(d["model"], "model", _model_presets())
    training = parse_training(d["training"], "training")
    defined = _parse_device_types(d.get("device_types", {}), base_dir)
    known = {**_device_presets(), **defined}
    groups = parse_groups(d["device_groups"], "device_groups", known)
    network = parse_network(d.get("network", {}), "network")
    collectives = parse_collectives(d.get("collectives", {}), "collectives")
    used = {g.type: known[g.type] for g in groups}
    check_precision(training, used)
    device_types = {**used, **{k: v for k, v in defined.items() if k not in used}}
    replicas = parse_replicas(
        d["replicas"], "replicas", model, training, groups, known, network.scale_up
    )
    plan = Plan(
        name=name,
        model=model,
        training=training,
        device_types=device_types,
        device_groups=groups,
        network=network,
        replicas=replicas,
        collectives=collectives,
        seed=seed,
    )
    if feasibility:
        check_feasible(plan)
    return plan


def _parse_device_types(value: Any, base_dir: str | None) -> dict[str, DeviceType]:
    m = f.expect_mapping(value, "device_types")
    presets = _device_presets()
    out = {}
    for name, entry in m.items():
        path = f.join("device_types", str(name))
        if not isinstance(name, str) or not name:
            raise PlanError(path, f"expected a device type name that is a string (got {name!r})")
        out[name] = parse_device_type(entry, path, name, presets.get(name), base_dir)
    return out
