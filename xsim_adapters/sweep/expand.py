"""The cartesian product of the axes, each combination applied to a copy of the base plan dict.

Overrides are applied to the plan as the user wrote it, so shorthands keep working: changing
``training.micro_batch`` under ``replicas: {uniform: ...}`` re-derives every replica's
micro-batch count. Two shorthands are opened up only when a path reaches inside them:
- ``model: llama2-7b`` with a path ``model.<key>`` becomes ``{preset: llama2-7b, <key>: ...}``;
- ``replicas: {uniform: ...}`` (or any non-list form) with a path ``replicas[i]...`` becomes
  the explicit list of the validated base plan (``plan_to_dict``), so every stage exists;
  the micro-batch counts are left out unless the shorthand set a batch split itself, so the
  validator still derives them from ``training``.
A path that cannot be applied (an index out of range, a key under a scalar) fails that variant
only, with the path down to the part that failed.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import PlanError
from .spec import PathPart, format_path, parse_path


class OverrideError(PlanError):
    """An override path does not lead anywhere in the plan."""


@dataclass
class Variant:
    """One point of the product: its position, the override values by path, and either the
    plan dict to run or the reason it cannot be built (``error``)."""

    index: int
    overrides: dict[str, Any]
    plan: dict[str, Any] | None
    error: str = ""


def product(axes: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of axis values in nested-loop order (the first axis varies slowest)."""
    names = list(axes)
    return [dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(axes[n] for n in names))]


class _ExpandedReplicas:
    """The explicit replica list of the base plan, computed at most once per sweep."""

    def __init__(self, base: Mapping[str, Any], base_dir: str | None) -> None:
        self._base = base
        self._base_dir = base_dir
        self._value: list[Any] | None = None

    def get(self) -> list[Any]:
        if self._value is None:
            from ..feasibility import plan_from_dict
            from ..plan import plan_to_dict

            # Only the replica layout is needed: skip the memory check (a variant may fix it).
            plan = plan_from_dict(copy.deepcopy(dict(self._base)), base_dir=self._base_dir,
                                  feasibility=False)
            replicas = plan_to_dict(plan)["replicas"]
            if not _mentions(self._base.get("replicas"), ("micro_batches", "batch_share")):
                # The shorthand left the batch split to the validator (from global_batch and
                # micro_batch): keep it that way, so a training.micro_batch axis still works.
                for rep in replicas:
                    rep.pop("micro_batches", None)
            self._value = replicas
        return copy.deepcopy(self._value)


def _mentions(data: Any, keys: tuple[str, ...]) -> bool:
    """Whether any mapping inside ``data`` has one of ``keys``."""
    if isinstance(data, dict):
        return any(k in data for k in keys) or any(_mentions(v, keys) for v in data.values())
    if isinstance(data, list):
        return any(_mentions(v, keys) for v in data)
    return False


def apply_override(plan: dict[str, Any], parts: tuple[PathPart, ...], value: Any,
                   replicas: _ExpandedReplicas | None = None) -> None:
    """Set ``parts`` of ``plan`` (in place) to ``value``.

    Missing mapping keys are created (the plan validator then rejects unknown names with
    their path); list indices must exist. Raises OverrideError naming the failing prefix.
    """
    node: Any = plan
    for depth, part in enumerate(parts):
        here = format_path(parts[: depth + 1])
        last = depth == len(parts) - 1
        nxt = None if last else parts[depth + 1]
        if isinstance(part, int):
            if not isinstance(node, list):
                raise OverrideError(here, f"cannot index a {_kind(node)} with [{part}]")
            if not -len(node) <= part < len(node):
                raise OverrideError(here, f"index out of range (the list has {len(node)} "
                                          f"entries)")
            if last:
                node[part] = copy.deepcopy(value)
                return
            node[part] = _open(node[part], nxt, here, replicas)
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise OverrideError(here, f"cannot set key {part!r} inside a {_kind(node)}")
        if last:
            node[part] = copy.deepcopy(value)
            return
        if node.get(part) is None:
            node[part] = [] if isinstance(nxt, int) else {}
        node[part] = _open(node[part], nxt, here, replicas)
        node = node[part]


def _open(child: Any, nxt: PathPart | None, here: str,
          replicas: _ExpandedReplicas | None) -> Any:
    """Turn a shorthand into its explicit form when the path goes inside it."""
    if here == "model" and isinstance(child, str) and isinstance(nxt, str):
        return {"preset": child}
    if here == "replicas" and isinstance(nxt, int) and not isinstance(child, list):
        if replicas is None:
            raise OverrideError(here, "a shorthand; index it after expanding the replicas")
        try:
            return replicas.get()
        except PlanError as e:
            raise OverrideError(here, f"cannot expand the shorthand to index it: {e}") from None
    return child


def _kind(node: Any) -> str:
    if isinstance(node, dict):
        return "mapping"
    if isinstance(node, list):
        return "list"
    return f"value ({node!r})"


def expand(base: Mapping[str, Any], axes: Mapping[str, list[Any]],
           base_dir: str | None = None) -> list[Variant]:
    """One Variant per combination of ``axes`` over ``base`` (a plan as plain data), in
    product order. Axes are applied in the order given, so a later path may reach inside a
    value an earlier axis set."""
    parsed = {name: parse_path(name) for name in axes}
    replicas = _ExpandedReplicas(base, base_dir)
    out: list[Variant] = []
    for i, combo in enumerate(product(axes)):
        plan = copy.deepcopy(dict(base))
        try:
            for name, value in combo.items():
                apply_override(plan, parsed[name], value, replicas)
        except OverrideError as e:
            out.append(Variant(i, combo, None, f"{type(e).__name__}: {e}"))
            continue
        out.append(Variant(i, combo, plan))
    return out
