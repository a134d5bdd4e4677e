"""``xsim calibrate``: fit one device-type constant to a user's measured iteration times.

The compute model has two measured constants per device type (docs/compute.md):
``efficiency`` (best-shaped GEMM / peak) and ``hbm_efficiency`` (copy bandwidth / spec). A user
with their own cluster can fit one of them to iteration times they measured on plans they ran:
the predicted iteration time falls monotonically as either constant rises, so bisection on the
median log error ``median(log(predicted / measured))`` finds the value where half the plans are
predicted slow and half fast. Nothing else is changed; the result is a plan override
(``device_types: {NAME: {efficiency: X}}``) the user can review and keep.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from .errors import PlanError
from .plan.model import Plan

FIELDS = ("efficiency", "hbm_efficiency")
LOW, HIGH = 0.02, 1.0  # search interval of a fraction of a spec figure
TOLERANCE = 0.002  # stop when the interval is this narrow (absolute, in the fraction)


@dataclass(frozen=True)
class Calibration:
    """The fitted value, and each plan's relative error before and after."""

    device_type: str
    field: str
    before: float
    value: float
    errors_before: tuple[float, ...]
    errors_after: tuple[float, ...]
    simulations: int
    at_bound: bool  # the fit hit LOW or HIGH: the model cannot match with this constant alone


def with_constant(plan: Plan, device_type: str, field: str, value: float) -> Plan:
    """``plan`` with ``device_types[device_type].field`` set to ``value``."""
    types = dict(plan.device_types)
    old = types[device_type]
    if field == "efficiency":
        types[device_type] = replace(old, efficiency=value)
    elif field == "hbm_efficiency":
        types[device_type] = replace(old, hbm_efficiency=value)
    else:
        raise PlanError("calibrate.field", f"expected one of {', '.join(FIELDS)} (got {field!r})")
    return replace(plan, device_types=types)


def iteration_seconds(plan: Plan, backend: str = "flow") -> float:
    """Simulated iteration time of ``plan`` on ``backend``, in seconds."""
    from . import api

    trace = api.generate(plan)
    tl = api.run(trace, backend, topology=api.build_topology(plan))
    return api.metrics(trace, tl).summary["iteration_time_ns"] * 1e-9


def fit(
    measured: Sequence[tuple[Plan, float]],
    device_type: str,
    field: str = "efficiency",
    predict: Callable[[Plan], float] = iteration_seconds,
) -> Calibration:
    """Fit ``field`` of ``device_type`` so the median log error over ``measured`` is zero.

    ``measured``: (plan, measured iteration seconds) pairs; every plan must use the type.
    """
    if field not in FIELDS:
        raise PlanError("calibrate.field", f"expected one of {', '.join(FIELDS)} (got {field!r})")
    if not measured:
        raise PlanError("calibrate", "expected at least one measured plan (got none)")
    for i, (plan, secs) in enumerate(measured):
        if device_type not in plan.device_types:
            raise PlanError(
                f"calibrate.plans[{i}]",
                f"plan {plan.name!r} does not use device type {device_type!r} "
                f"(it uses {', '.join(sorted(plan.device_types))})",
            )
        if not (isinstance(secs, int | float) and math.isfinite(secs) and secs > 0):
            raise PlanError(f"calibrate.plans[{i}]", f"expected a finite positive time in "
                                                    f"seconds (got {secs!r})")
    before = getattr(measured[0][0].device_types[device_type], field)
    runs = 0

    def errors(value: float) -> list[float]:
        nonlocal runs
        runs += len(measured)
        return [predict(with_constant(p, device_type, field, value)) / s - 1 for p, s in measured]

    def g(errs: list[float]) -> float:
        return statistics.median(math.log1p(e) for e in errs)

    errs_before = errors(before)
    lo, hi = LOW, HIGH
    e_hi = errors(hi)
    if g(e_hi) > 0:  # even at the bound the model is too slow
        return Calibration(device_type, field, before, hi, tuple(errs_before), tuple(e_hi), runs,
                           True)
    e_lo = errors(lo)
    if g(e_lo) < 0:
        return Calibration(device_type, field, before, lo, tuple(errs_before), tuple(e_lo), runs,
                           True)
    while hi - lo > TOLERANCE:
        mid = (lo + hi) / 2
        if g(errors(mid)) > 0:  # predicted too slow: the constant must rise
            lo = mid
        else:
            hi = mid
    value = round((lo + hi) / 2, 4)
    return Calibration(device_type, field, before, value, tuple(errs_before),
                       tuple(errors(value)), runs, False)


__all__ = ["FIELDS", "Calibration", "fit", "iteration_seconds", "with_constant"]
