"""A plan with fields overridden (``SECTION.KEY=VALUE``), shared by the benchmark scripts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

import xsim_adapters as xs


def load_variant(path: str, sets: Sequence[str] = ()) -> Any:
    """The plan at ``path`` with each ``SECTION.KEY=VALUE`` of ``sets`` applied (VALUE is YAML)."""
    if not sets:
        return xs.load_plan(path)
    with open(path) as fh:
        d = yaml.safe_load(fh)
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected SECTION.KEY=VALUE")
        *parents, leaf = key.split(".")
        node = d
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = yaml.safe_load(value)
    return xs.load_plan(yaml.safe_dump(d))
