"""The checks of a parsed plan that need the generator's or the topology's models, and the
checked loaders every command reads a plan through.

:mod:`xsim_adapters.plan` is input only (parsing, validation, presets, parameter counts):
:func:`xsim_adapters.plan.loader.parse_plan` gives a validated :class:`~xsim_adapters.plan.Plan`
and nothing more. :func:`load_plan` and :func:`plan_from_dict` here parse it and then run
:func:`check_plan`: the size limits (:mod:`.size`: op estimate, memory budget, 2^53
magnitudes), the what-if events on the built topology and the memory feasibility
(:mod:`.memory`). A plan refused here is refused by every command with the same one-line error.
"""

from __future__ import annotations

import os
from typing import Any

from ..plan.loader import parse_plan, parse_plan_dict
from ..plan.model import Plan
from .memory import (
    GB,
    StageMemory,
    all_stage_memory,
    check_feasible,
    expert_params_per_device,
    in_flight_micro_batches,
    memory_report,
    stage_memory,
)
from .size import check_events, check_size


def check_plan(plan: Plan, *, feasibility: bool = True) -> Plan:
    """Refuse a parsed plan that is too large (PlanError), names what-if events its topology
    lacks (PlanError) or, unless ``feasibility`` is false, does not fit in device memory
    (InfeasiblePlanError). Returns ``plan``."""
    check_size(plan)
    if plan.network.events:
        check_events(plan)
    if feasibility:
        check_feasible(plan)
    return plan


def load_plan(
    path_or_text: str | os.PathLike[str], *, feasibility: bool = True, stored: bool = False
) -> Plan:
    """:func:`~xsim_adapters.plan.loader.parse_plan` (a ``.yaml`` path or YAML text), then
    :func:`check_plan`. ``stored``: a ``plan.yaml`` xsim wrote beside a trace."""
    return check_plan(parse_plan(path_or_text, stored=stored), feasibility=feasibility)


def plan_from_dict(
    d: Any, base_dir: str | None = None, *, feasibility: bool = True, source: str | None = None
) -> Plan:
    """:func:`~xsim_adapters.plan.loader.parse_plan_dict` (plain data as YAML gives it), then
    :func:`check_plan`."""
    return check_plan(parse_plan_dict(d, base_dir, source=source), feasibility=feasibility)


__all__ = [
    "GB",
    "StageMemory",
    "all_stage_memory",
    "check_events",
    "check_feasible",
    "check_plan",
    "check_size",
    "expert_params_per_device",
    "in_flight_micro_batches",
    "load_plan",
    "memory_report",
    "plan_from_dict",
    "stage_memory",
]
