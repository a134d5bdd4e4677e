"""Which kind of xsim input file a YAML mapping is, from its top-level keys, so that a file given
to the wrong command gets one line naming the right one instead of ``space: unknown key``.

The kinds and the keys that only they have (docs/plan.md, "Which file is which"):

- a plan (``xsim validate / trace / run``): ``replicas``;
- a search spec (``xsim search``): ``space``, ``budget``, ``objective``, ``prices_per_gpu_hour``;
- a traffic spec (``xsim run PLAN --job FILE``): ``traffic``;
- a sweep file (``xsim sweep --sweep FILE``): ``axes``, or ``base`` without ``model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import PlanError

PLAN = "plan"
SEARCH_SPEC = "search spec"
TRAFFIC_SPEC = "traffic spec"
SWEEP_FILE = "sweep file"

_SEARCH_ONLY = ("space", "budget", "objective", "prices_per_gpu_hour")
# How each kind is run; FILE is replaced by the file's name.
_COMMAND = {
    PLAN: "run it with 'xsim run FILE' (or validate, trace, export)",
    SEARCH_SPEC: "run it with 'xsim search FILE'",
    TRAFFIC_SPEC: "run it beside a plan with 'xsim run PLAN --job FILE'",
    SWEEP_FILE: "run it with 'xsim sweep --sweep FILE'",
}


def file_kind(d: Any) -> str | None:
    """The kind of input ``d`` (a parsed YAML document) is, or None when its keys say nothing."""
    if not isinstance(d, Mapping):
        return None
    keys = {k for k in d if isinstance(k, str)}
    if "replicas" in keys:
        return PLAN
    if "traffic" in keys:
        return TRAFFIC_SPEC
    if "axes" in keys or ("base" in keys and "model" not in keys):
        return SWEEP_FILE
    if keys & set(_SEARCH_ONLY):
        return SEARCH_SPEC
    return None


def check_kind(d: Any, expected: str, source: str | None) -> None:
    """PlanError if ``d`` is recognisably another kind of file than ``expected``: one line
    naming the file (``source``; "this file" for text) and the command that reads it."""
    kind = file_kind(d)
    if kind is None or kind == expected:
        return
    name = source or "FILE"
    what = f"{source}: this" if source else "this"
    article = "an" if expected[0] in "aeiou" else "a"
    raise PlanError(
        "", f"{what} is a {kind}, not {article} {expected}: "
        f"{_COMMAND[kind].replace('FILE', name)}"
    )
