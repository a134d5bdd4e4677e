"""What a sweep is: a base plan and ordered axes ``{yaml path: [values]}``.

Paths use the syntax of plan error messages: dotted mapping keys and ``[i]`` list indices,
e.g. ``training.micro_batch``, ``replicas[1].stages[0].layers``, ``device_groups.a100.nodes``.
Values are YAML: ``--set path=1,2`` is read as the YAML flow list ``[1,2]``, so
``--set replicas[0].stages[0].layers=[0,16],[0,20]`` gives two lists and ``lcm,direct`` two
strings.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import XsimError

PathPart = str | int
SWEEP_KEYS = ("base", "axes", "backend", "options", "jobs", "placement")
#: Variants one sweep may have: each holds a copy of the plan (a few kB) until it has run, so
#: 100,000 are a few hundred MB; at 0.1-1 s per flow simulation they are hours of work.
MAX_VARIANTS = 100_000


class SweepError(XsimError, ValueError):
    """A sweep is malformed (bad axis path or value syntax, a bad sweep file, no axes)."""


_KEY = re.compile(r"[^.\[\]]+")
_INDEX = re.compile(r"\[(-?\d+)\]")


def parse_path(text: str) -> tuple[PathPart, ...]:
    """``"replicas[1].stages[0].tp"`` -> ``("replicas", 1, "stages", 0, "tp")``.

    Raises SweepError naming the path and the position of the first character not understood.
    """
    s = text.strip()
    parts: list[PathPart] = []
    pos = 0
    while pos < len(s):
        m: re.Match[str] | None
        if s[pos] == "[":
            m = _INDEX.match(s, pos)
        else:
            # A key comes first or after a '.', never straight after a key or an index.
            ok = not parts or s[pos] == "."
            pos += 1 if parts and ok else 0
            m = _KEY.match(s, pos) if ok else None
        if m is None:
            raise SweepError(
                f"axis path {text!r}: cannot read it at character {pos + 1} "
                "(expected keys separated by '.' and list indices as [i], e.g. "
                "replicas[1].stages[0].tp)"
            )
        parts.append(int(m.group(1)) if m.re is _INDEX else m.group(0))
        pos = m.end()
    if not parts or isinstance(parts[0], int):
        raise SweepError(f"axis path {text!r}: must start with a section name (e.g. "
                         "training.micro_batch)")
    return tuple(parts)


def format_path(parts: Sequence[PathPart]) -> str:
    """The inverse of :func:`parse_path`: ``("replicas", 1, "tp")`` -> ``"replicas[1].tp"``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def parse_values(text: str, where: str) -> list[Any]:
    """``"1,2"`` -> ``[1, 2]``; the text is read as the body of a YAML flow list."""
    try:
        values = yaml.safe_load(f"[{text}]")
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SweepError(f"{where}: the values are not valid YAML ({problem})") from None
    if not values:
        raise SweepError(f"{where}: no values (expected e.g. 1,2)")
    return list(values)


def parse_set(item: str) -> tuple[str, list[Any]]:
    """One ``--set PATH=V1,V2`` argument -> (canonical path, values)."""
    path, sep, values = item.partition("=")
    if not sep or not path.strip():
        raise SweepError(
            f"--set {item!r}: expected PATH=VALUES (e.g. --set training.micro_batch=1,2)"
        )
    canonical = format_path(parse_path(path))
    return canonical, parse_values(values, f"--set {canonical}")


@dataclass
class SweepSpec:
    """A base plan as plain data (what the YAML gives), the axes in product order (the first
    axis varies slowest), the backend and its options. ``base_dir`` resolves relative profile
    paths in the plan; ``source`` says where the base came from (for messages)."""

    base: dict[str, Any]
    axes: dict[str, list[Any]]
    backend: str = "flow"
    options: dict[str, Any] = field(default_factory=dict)
    base_dir: str | None = None
    source: str = "<plan>"
    base_path: str | None = None  # the plan file, when the base came from one
    # Other jobs on the same fabric (docs/whatif.md), each {path, data, base_dir}: every
    # variant of the base runs beside them (``xsim sweep --job``); placement as ``xsim run``.
    jobs: list[dict[str, Any]] = field(default_factory=list)
    placement: str = "packed"

    def to_yaml(self) -> str:
        """This sweep as a sweep file (``base`` is the plan's absolute path when it came
        from a file, else the plan inline; ``jobs`` their absolute paths)."""
        doc: dict[str, Any] = {
            "base": self.base_path or self.base,
            "axes": self.axes,
            "backend": self.backend,
            "options": self.options,
        }
        if self.jobs:
            doc["jobs"] = [j["path"] for j in self.jobs]
            doc["placement"] = self.placement
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)

    def __post_init__(self) -> None:
        self.axes = check_axes(self.axes)


def check_axes(axes: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Canonical paths, each with a non-empty list of values; a path given twice is an error."""
    if not isinstance(axes, Mapping):
        raise SweepError(f"axes: expected a mapping of path -> list of values (got "
                         f"{type(axes).__name__})")
    out: dict[str, list[Any]] = {}
    for raw, values in axes.items():
        path = format_path(parse_path(str(raw)))
        if path in out:
            raise SweepError(f"axes: {path} is given twice (merge its values into one list)")
        if not isinstance(values, list | tuple):
            values = [values]  # one value: a fixed override, still a column of the result
        if len(values) == 0:
            raise SweepError(f"axes: {path} has no values")
        out[path] = list(values)
    count = math.prod(len(v) for v in out.values())
    if count > MAX_VARIANTS:
        sizes = " x ".join(str(len(v)) for v in out.values())
        raise SweepError(f"axes: {count:,} variants ({sizes}), more than the {MAX_VARIANTS:,} "
                         "one sweep may run (MAX_VARIANTS, docs/sweep.md); split the sweep or "
                         "give fewer values")
    return out


def check_axis_paths(axes: Mapping[str, Any]) -> None:
    """Every axis path leads to a key the plan format has (its JSON Schema, generated from the
    plan loader: :func:`xsim_adapters.plan.schema.plan_schema`), before any variant runs;
    SweepError naming the path, the first unknown part and the closest known key, e.g.
    ``axis training.micro_bach: unknown key micro_bach under training; did you mean
    micro_batch?``. Values are left to the loader (each variant is validated as a plan)."""
    schema = _plan_schema()
    for path in axes:
        node: Any = schema
        parts = parse_path(path)
        for depth, part in enumerate(parts):
            node = _schema_child(node, part)
            if node is None:
                _unknown(path, parts, depth, _schema_keys(_schema_at(schema, parts[:depth])))
            if node == {}:
                break  # any value here (a key the loader reads without a shape)


_SCHEMA_CACHE: list[dict[str, Any]] = []


def _plan_schema() -> dict[str, Any]:
    """The plan JSON Schema, built once per process (~0.1 s)."""
    if not _SCHEMA_CACHE:
        from ..plan.schema import plan_schema

        _SCHEMA_CACHE.append(plan_schema())
    return _SCHEMA_CACHE[0]


def _alternatives(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(node.get("anyOf", [node]))


def _schema_child(node: Mapping[str, Any], part: PathPart) -> Any:
    """The schema of ``part`` (a key or a list index) below ``node``: {} for any value, None
    if no alternative of ``node`` has it."""
    for alt in _alternatives(node):
        if isinstance(part, int):
            if alt.get("type") == "array":
                return alt.get("items", {})
            continue
        if alt.get("type") != "object":
            continue
        props = alt.get("properties")
        if props is not None and part in props:
            return props[part]
        extra = alt.get("additionalProperties")
        if isinstance(extra, Mapping):  # a mapping of names (device_groups.<name>)
            return extra
        if props is None and extra is None:
            return {}  # an object of any keys
    return None


def _schema_at(schema: Mapping[str, Any], parts: Sequence[PathPart]) -> Mapping[str, Any]:
    node: Any = schema
    for part in parts:
        node = _schema_child(node, part) or {}
    return node


def _schema_keys(node: Mapping[str, Any]) -> list[str]:
    return sorted({k for alt in _alternatives(node) for k in (alt.get("properties") or {})})


def _unknown(path: str, parts: Sequence[PathPart], depth: int, keys: list[str]) -> None:
    """Raise the SweepError of an axis path whose part ``depth`` the plan has not."""
    from .._suggest import closest

    part, under = parts[depth], format_path(parts[:depth]) or "the plan's top level"
    if isinstance(part, int):
        raise SweepError(f"axis {path}: {under} is not a list in a plan, so [{part}] "
                         "cannot index it")
    close = closest(part, keys)
    hint = f"; did you mean {close}?" if close else ""
    known = f" (known keys: {', '.join(keys)})" if keys and not close else ""
    raise SweepError(f"axis {path}: unknown key {part} under {under}{hint}{known}"[:600])


def load_sweep_file(path: str | os.PathLike[str]) -> SweepSpec:
    """Read a sweep YAML file: ``base`` (a plan path relative to this file, or an inline
    plan mapping), ``axes`` ({path: [values]}), optional ``backend`` and ``options``."""
    from ..plan import parse_yaml

    p = Path(path)
    if not p.is_file():
        raise SweepError(f"{p}: not a regular file (expected a sweep YAML file)" if p.exists()
                         else f"sweep file not found: {p}")
    d = parse_yaml(p.read_text(), str(p))
    if not isinstance(d, Mapping):
        raise SweepError(f"{p}: expected a mapping with keys base, axes (got "
                         f"{type(d).__name__})")
    unknown = [k for k in d if k not in SWEEP_KEYS]
    if unknown:
        raise SweepError(f"{p}: unknown key {unknown[0]!r} (expected one of "
                         f"{', '.join(SWEEP_KEYS)})")
    for key in ("base", "axes"):
        if key not in d:
            raise SweepError(f"{p}: missing key {key!r}")
    base_dir = str(p.resolve().parent)
    if isinstance(d["base"], str):
        plan_path = Path(base_dir) / d["base"]
        base, base_dir, source = read_plan_data(plan_path)
        base_path: str | None = str(plan_path.resolve())
    elif isinstance(d["base"], Mapping):
        base, source, base_path = dict(d["base"]), f"{p} (inline base)", None
    else:
        raise SweepError(f"{p}: base: expected a plan file path or a plan mapping (got "
                         f"{type(d['base']).__name__})")
    options = d.get("options") or {}
    if not isinstance(options, Mapping):
        raise SweepError(f"{p}: options: expected a mapping of backend options")
    jobs = d.get("jobs") or []
    if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
        raise SweepError(f"{p}: jobs: expected a list of plan or traffic file paths")
    placement = str(d.get("placement") or "packed")
    if placement not in ("packed", "spread"):
        raise SweepError(f"{p}: placement: expected packed or spread (got {placement!r})")
    here = p.resolve().parent
    return SweepSpec(base=base, axes=d["axes"] or {}, backend=str(d.get("backend") or "flow"),
                     options=dict(options), base_dir=base_dir, source=source,
                     base_path=base_path, jobs=[read_job(here / j) for j in jobs],
                     placement=placement)


def read_job(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A job file (a plan or a traffic file) for ``jobs``: ``{path, data, base_dir}``."""
    data, base_dir, _ = read_plan_data(path)
    return {"path": str(Path(path).resolve()), "data": data, "base_dir": base_dir}


def read_plan_data(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str, str]:
    """A plan file as plain data (not validated yet), its directory and its name."""
    from ..errors import PlanError
    from ..plan import parse_yaml

    p = Path(path)
    if not p.is_file():
        raise PlanError("", f"plan file not found: {p}")
    data = parse_yaml(p.read_text(), str(p))
    if not isinstance(data, Mapping):
        raise PlanError("", f"{p}: expected a mapping at the top level of the plan")
    return dict(data), str(p.resolve().parent), str(p)
