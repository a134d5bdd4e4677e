"""Interval compute slowdowns: the manifest's ``compute_slowdowns`` and how backends apply them.

A plan's ``perturb.slow`` entries with ``from_us`` / ``until_us`` (docs/whatif.md) make ranks
compute slower only inside a window of simulated time (throttling). A trace holds each kernel's
duration, not its start time, so such a slowdown cannot be written into the ops: the generator
records it in the manifest, and every backend stretches the compute ops it runs while a window
is open. The record (a JSON list, absent when the plan has none)::

    "compute_slowdowns": [{"ranks": [2, 3], "factor": 2.0, "from_ns": 100000.0,
                           "until_ns": 300000.0}, ...]        # until_ns null: to the end

The model. A rank ``r`` computes at speed ``1 / F_r(t)``, where ``F_r(t)`` is the product of the
factors of the records naming ``r`` whose window ``[from_ns, until_ns)`` holds ``t`` (1 outside
every window). A compute op of duration ``d`` (its trace duration, whole-iteration slowdowns
and jitter included) that starts at ``t0`` ends at the ``t1`` with
``integral_{t0}^{t1} dt / F_r(t) = d``: a kernel straddling a window's start runs at full speed
up to it and at ``1 / factor`` after. Only ``compute`` ops are stretched (not timed barriers,
which stand for collective latency, and not flows). A kernel that overlaps no window ends at
``t0 + d`` exactly as without the record.

:func:`schedule` turns the records into per-rank disjoint segments with their factor products
(CSR over ranks), the form every engine takes; :func:`stretched_end` is the reference
computation, which the flow backend's two engines, the ns-3 engine and the htsim driver each
repeat operation for operation (in double precision; ns-3 then rounds to the ns, htsim to the
ps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TraceError
from .schema import KIND_COMPUTE

#: The manifest key (absent in traces of plans without interval slowdowns).
MANIFEST_KEY = "compute_slowdowns"


@dataclass(frozen=True)
class SlowSchedule:
    """Per-rank slowdown segments: rank ``r``'s are ``offsets[r]:offsets[r+1]``, sorted,
    disjoint, each ``[lo_ns, hi_ns)`` (``hi_ns`` may be +inf) at ``factor`` (never 1)."""

    offsets: np.ndarray  # int64, num_ranks + 1
    lo_ns: np.ndarray  # float64
    hi_ns: np.ndarray  # float64
    factor: np.ndarray  # float64

    @property
    def num_ranks(self) -> int:
        return len(self.offsets) - 1

    def slowed(self) -> np.ndarray:
        """Bool per rank: the rank has at least one segment."""
        return np.diff(self.offsets) > 0


def schedule(manifest: Mapping[str, Any], num_ranks: int) -> SlowSchedule | None:
    """The manifest's interval slowdowns as per-rank segments, or None when it has none.

    Overlapping records multiply in the overlap; elementary segments whose product is exactly 1
    are dropped and equal neighbours are merged, so the result depends only on ``F_r(t)``.
    """
    records = manifest.get(MANIFEST_KEY) or []
    if not records:
        return None
    per_rank: list[list[tuple[float, float, float]]] = [[] for _ in range(num_ranks)]
    for rec in records:
        hi = math.inf if rec.get("until_ns") is None else float(rec["until_ns"])
        for r in rec["ranks"]:
            per_rank[int(r)].append((float(rec["from_ns"]), hi, float(rec["factor"])))
    offsets = np.zeros(num_ranks + 1, dtype=np.int64)
    lo: list[float] = []
    hi_out: list[float] = []
    fac: list[float] = []
    for r, entries in enumerate(per_rank):
        for a, b, x in _segments(entries):
            if hi_out and len(lo) > offsets[r] and hi_out[-1] == a and fac[-1] == x:
                hi_out[-1] = b  # same factor continues: one segment
                continue
            lo.append(a)
            hi_out.append(b)
            fac.append(x)
        offsets[r + 1] = len(lo)
    return SlowSchedule(offsets=offsets, lo_ns=np.asarray(lo, dtype=np.float64),
                        hi_ns=np.asarray(hi_out, dtype=np.float64),
                        factor=np.asarray(fac, dtype=np.float64))


def _segments(entries: Sequence[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """Elementary segments of one rank's windows with the product of the factors over each."""
    cuts = sorted({t for a, b, _ in entries for t in (a, b)})
    out = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        x = 1.0
        for lo, hi, f in entries:  # in record order: the product is the same in every engine
            if lo <= a and b <= hi:
                x *= f
        if x != 1.0:
            out.append((a, b, x))
    return out


def stretched_end(t: float, work: float, lo: Sequence[float], hi: Sequence[float],
                  factor: Sequence[float], a: int, b: int) -> float:
    """When a kernel of ``work`` ns (at full speed) started at ``t`` ends, on a rank whose
    segments are ``lo[a:b], hi[a:b], factor[a:b]`` (sorted, disjoint). Pure float arithmetic in
    a fixed order: the C++ engines repeat it step for step."""
    cur = t
    rem = work
    for i in range(a, b):
        if hi[i] <= cur:
            continue
        if lo[i] > cur:  # full speed up to the segment
            gap = lo[i] - cur
            if rem <= gap:
                return cur + rem
            rem -= gap
            cur = lo[i]
        span = hi[i] - cur
        need = rem * factor[i]
        if need <= span:
            return cur + need
        rem -= span / factor[i]
        if rem < 0.0:
            rem = 0.0
        cur = hi[i]
    return cur + rem


def slowed_compute(kind: np.ndarray, rank: np.ndarray, sched: SlowSchedule | None) -> np.ndarray:
    """int32 per op: the op's rank if it is a compute op on a rank with segments, else -1 (the
    per-op form the packet engines load)."""
    out = np.full(len(kind), -1, dtype=np.int32)
    if sched is None:
        return out
    slowed = sched.slowed()
    r = np.asarray(rank, dtype=np.int64)
    ok = (np.asarray(kind) == KIND_COMPUTE) & (r >= 0) & (r < sched.num_ranks)
    ok[ok] = slowed[r[ok]]
    out[ok] = r[ok]
    return out


def check_slowdowns(m: Mapping[str, Any], where: str, num_ranks: int) -> None:
    """The manifest's ``compute_slowdowns`` shape (TraceError naming the field), if present."""
    records = m.get(MANIFEST_KEY)
    if records is None:
        return
    at = f"{where}: {MANIFEST_KEY}"
    if not isinstance(records, list):
        raise TraceError(f"{at}: expected a list of slowdown records")
    for i, rec in enumerate(records):
        ri = f"{at}[{i}]"
        if not isinstance(rec, Mapping):
            raise TraceError(f"{ri}: expected an object with ranks, factor, from_ns, until_ns")
        ranks = rec.get("ranks")
        if not isinstance(ranks, list) or not ranks or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < num_ranks for x in ranks
        ):
            raise TraceError(f"{ri}.ranks: expected a non-empty list of ranks in "
                             f"0..{num_ranks - 1}")
        f: Any = rec.get("factor")
        if not _number(f) or not 0 < f <= 1e4:
            raise TraceError(f"{ri}.factor: expected a number in (0, 1e4] (got {f!r})")
        lo: Any = rec.get("from_ns")
        if not _number(lo) or lo < 0:
            raise TraceError(f"{ri}.from_ns: expected a non-negative number (got {lo!r})")
        hi: Any = rec.get("until_ns")
        if hi is not None and (not _number(hi) or hi <= lo):
            raise TraceError(f"{ri}.until_ns: expected null or a number after from_ns "
                             f"(got {hi!r})")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def remap(records: Sequence[Mapping[str, Any]], rank_map: np.ndarray) -> list[dict[str, Any]]:
    """The records with every rank ``r`` renamed ``rank_map[r]`` (a job placed on a cluster)."""
    return [{**rec, "ranks": [int(rank_map[int(r)]) for r in rec["ranks"]]} for rec in records]


def refuse_export(manifest: Mapping[str, Any], fmt: str) -> None:
    """XsimError for an exporter whose format has no way to say ``compute_slowdowns`` (GOAL,
    Chakra ET hold fixed durations): exporting would silently drop the windows."""
    from ..errors import XsimError

    if manifest.get(MANIFEST_KEY):
        raise XsimError(f"export {fmt}: the trace has interval compute slowdowns "
                        f"({MANIFEST_KEY}: perturb.slow entries with from_us/until_us), which "
                        f"{fmt} cannot express (it holds fixed kernel durations); export the "
                        f"plan without them")
