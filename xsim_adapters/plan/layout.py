"""Splitting work by speed: layers over stages, micro-batches over replicas.

Both splits use the same rule, :func:`apportion`: proportional shares, every part at least a
minimum, largest-remainder rounding with ties going to the earliest part. Exact rational
arithmetic keeps the result independent of floating-point rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from .model import DeviceType, Plan, Replica, Stage


def apportion(total: int, weights: Sequence[float], minimum: int = 1) -> list[int]:
    """Split ``total`` into ``len(weights)`` integers proportional to ``weights``.

    Every part gets at least ``minimum``; the rest follows the largest-remainder method (ties to
    the earliest part). Requires ``total >= minimum * len(weights)`` and positive weights.
    """
    n = len(weights)
    if n == 0 or total < minimum * n:
        raise ValueError(f"cannot split {total} into {n} parts of at least {minimum}")
    fw = [Fraction(w) for w in weights]
    if any(w <= 0 for w in fw):
        raise ValueError(f"weights must be positive (got {list(weights)})")
    wsum = sum(fw)
    ideal = [total * w / wsum for w in fw]
    parts = [max(minimum, math.floor(x)) for x in ideal]
    # Raising small parts to the minimum can overshoot: take back from the most over-served.
    while sum(parts) > total:
        i = max(
            (i for i in range(n) if parts[i] > minimum),
            key=lambda i: (parts[i] - ideal[i], i),
        )
        parts[i] -= 1
    while sum(parts) < total:
        i = max(range(n), key=lambda i: (ideal[i] - parts[i], -i))
        parts[i] += 1
    return parts


def even_split(total: int, parts: int) -> list[int]:
    """``total`` into ``parts`` near-equal integers, the remainder to the earliest parts."""
    q, r = divmod(total, parts)
    return [q + 1 if i < r else q for i in range(parts)]


def ranges_from_counts(counts: Sequence[int], start: int = 0) -> list[tuple[int, int]]:
    """Consecutive half-open ranges ``[a, b)`` of the given sizes, starting at ``start``."""
    out = []
    for c in counts:
        out.append((start, start + c))
        start += c
    return out


def stage_speed(device_type: DeviceType, tp: int) -> float:
    """Sustained TFLOP/s of a stage's TP group: ``tp * DeviceType.sustained_tflops``."""
    return tp * device_type.sustained_tflops


def stage_speed_in(plan: Plan, stage: Stage) -> float:
    """:func:`stage_speed` of ``stage`` of ``plan`` (TFLOP/s)."""
    return stage_speed(plan.device_types[plan.group(stage.group).type], stage.tp)


def replica_speed(plan: Plan, replica: Replica | int) -> float:
    """Relative throughput of a replica: ``1 / max over stages of layers / stage TFLOP/s``.

    The slowest stage paces a pipeline, so this is proportional to micro-batches per second
    (unit: TFLOP/s per layer). Embedding and head are ignored: they are small next to a layer
    stack and identical across replicas.
    """
    rep = plan.replicas[replica] if isinstance(replica, int) else replica
    return 1.0 / max(s.num_layers / stage_speed_in(plan, s) for s in rep.stages)
