"""The analytical side of the search: stage costs, the derived splits, memory, the lower bound.

Every number comes from the generator's own compute model: a stage's per-micro-batch forward and
backward times are the sums of the unit durations :func:`..workload.blocks.stage_units` gives
(the very durations the trace carries), and the optimizer step is
:func:`..workload.compute.optimizer_time_ns` over the parameters the generator gives it. Memory
is :func:`..plan.memory.stage_memory`. Nothing here runs a simulation.

The lower bound (proof in docs/search.md#bound), for every replica r and stage i with m_r
micro-batches, per-micro-batch forward F and backward B (all of the stage's compute ops, in ns),
and optimizer step O:

    LB = max over r, i of  fill_i + m_r * (F_i + B_i) + max(O_i, drain_i + O_0)

with fill_i = sum_{j<i} F_j (the first forward of stage i needs the first forward of every
earlier stage) and drain_i = sum_{j<i} B_j (the last backward of stage 0 follows the last
backward of stage i through every stage between), drain used only for gpipe and 1f1b, whose
last op on a stage is the backward of the last micro-batch.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Any

from ..plan.layout import even_split, ranges_from_counts
from ..plan.memory import GB, stage_memory
from ..plan.model import Plan, Replica, Stage, TrainingSpec
from ..workload.blocks import stage_units
from ..workload.compute import optimizer_time_ns, stage_params
from .space import Candidate, Choice, Part, Structure
from .spec import SearchSpec

DRAIN_SCHEDULES = ("gpipe", "1f1b")
FILL_SCHEDULES = ("gpipe", "1f1b", "zb_h1")


@dataclass(frozen=True)
class StageCost:
    """Per-micro-batch compute of one stage on one rank (ns): forward and backward blocks."""

    fwd_ns: int
    bwd_ns: int

    @property
    def total_ns(self) -> int:
        return self.fwd_ns + self.bwd_ns


class Analyzer:
    """Cached compute-model numbers for one spec (costs per stage, splits, bounds, memory)."""

    def __init__(self, spec: SearchSpec) -> None:
        self.spec = spec
        self.types = {g.name: spec.device_types[g.type] for g in spec.device_groups}
        self._cost: dict[tuple[Any, ...], StageCost] = {}
        self._plans: dict[Choice, Plan] = {}
        self._split: dict[tuple[Any, ...], tuple[tuple[int, int], ...] | None] = {}

    # ---- compute model --------------------------------------------------------------------
    def training(self, ch: Choice) -> TrainingSpec:
        return replace(self.spec.training, global_batch=ch.global_batch,
                       micro_batch=ch.micro_batch, schedule=ch.schedule,  # type: ignore[arg-type]
                       recompute=ch.recompute)  # type: ignore[arg-type]

    def base_plan(self, ch: Choice, replicas: tuple[Replica, ...] = ()) -> Plan:
        """A Plan object of the spec's cluster under ``ch`` (not validated; for the models)."""
        s = self.spec
        return Plan(name=s.name, model=s.model, training=self.training(ch),
                    device_types=dict(s.device_types), device_groups=s.device_groups,
                    network=s.network, replicas=replicas, collectives=s.collectives, seed=s.seed)

    def stage_cost(self, ch: Choice, group: str, tp: int, layers: tuple[int, int]) -> StageCost:
        """Forward and backward block durations (ns) of one micro-batch on a stage."""
        first, last = layers[0] == 0, layers[1] == self.spec.model.layers
        key = (ch.micro_batch, ch.recompute, ch.schedule, self.types[group].name, tp,
               layers[1] - layers[0], first, last)
        hit = self._cost.get(key)
        if hit is None:
            plan = self._plans.get(ch) or self._plans.setdefault(ch, self.base_plan(ch))
            st = Stage(group=group, devices=(0, tp), tp=tp, layers=layers)
            split_w = ch.schedule == "zb_h1"
            units = stage_units(plan, st, self.types[group], first, last, split_w=split_w)
            tp_ns = self.tp_comm_ns(ch, group, tp)
            # a unit's collectives delay the rank's next unit of the same block; the last
            # unit's do not delay the rank (only the next stage), so they are not counted
            per = [sum(_min_ns(u.duration_ns) for u in us)
                   + tp_ns * sum(1 for u in us[:-1] if u.kinds) for us in units]
            hit = StageCost(per[0], sum(per[1:]))
            self._cost[key] = hit
        return hit

    def tp_comm_ns(self, ch: Choice, group: str, tp: int) -> int:
        """A lower bound (ns) on one TP collective of a unit on a rank: the bytes every ring
        member must send, 2 (tp - 1) floor(S / tp) with S = b s h dtype bytes, over all the
        rank's outgoing capacity (NVLink + NIC). 0 with ``overlap.tp_comm`` (the collective
        then runs beside a GEMM) or tp = 1."""
        if tp == 1 or self.spec.training.overlap.tp_comm:
            return 0
        m = self.spec.model
        S = ch.micro_batch * m.seq_len * m.hidden * m.dtype_bytes
        dev = self.types[group]
        g = next(x for x in self.spec.device_groups if x.name == group)
        nic = g.nic_gbps if g.nic_gbps is not None else dev.nic_gbps
        cap_Bps = (dev.scaleup_GBps * 8 + nic) / 8 * 1e9
        return int(2 * (tp - 1) * (S // tp) / cap_Bps * 1e9)

    def optimizer_ns(self, group: str, tp: int, layers: tuple[int, int], dp: int) -> int:
        """The optimizer step of a stage's rank, as the generator sizes it (ZeRO: / dp)."""
        zero = self.spec.training.zero_stage >= 1 and dp > 1
        params = stage_params(self.spec.model, layers) / tp / (dp if zero else 1)
        return optimizer_time_ns(params, self.types[group])

    # ---- derived splits -------------------------------------------------------------------
    def layer_split(self, ch: Choice, part: Part) -> tuple[tuple[int, int], ...] | None:
        """Layer ranges of ``part``'s stages by ``ch.layer_split`` (None: too few layers)."""
        shapes = part.stage_shapes()
        L = self.spec.model.layers
        if len(shapes) > L:
            return None
        key = (ch.micro_batch, ch.recompute, ch.layer_split,
               tuple((self.types[g].name, t) for g, t in shapes))
        if key in self._split:
            return self._split[key]
        if ch.layer_split == "even":
            out = tuple(ranges_from_counts(even_split(L, len(shapes))))
        else:
            out = self._balanced(ch, shapes)
        self._split[key] = out
        return out

    def _time(self, ch: Choice, shape: tuple[str, int], a: int, b: int) -> int:
        return self.stage_cost(ch, shape[0], shape[1], (a, b)).total_ns

    def _balanced(self, ch: Choice, shapes: tuple[tuple[str, int], ...]
                  ) -> tuple[tuple[int, int], ...]:
        """The contiguous split minimising the slowest stage's per-micro-batch compute.

        Binary search on the threshold T; a split under T exists iff filling stages from the
        last one backwards, each with as many layers as stay under T (keeping one layer for
        every earlier stage), covers all layers. Filling from the back gives the early stages,
        which hold the most micro-batches in flight, the fewest layers.
        """
        L, S = self.spec.model.layers, len(shapes)

        def fill(T: int) -> list[int] | None:
            counts, stop = [0] * S, L
            for s in range(S - 1, -1, -1):
                n = 0
                while stop - n - 1 >= s and self._time(ch, shapes[s], stop - n - 1, stop) <= T:
                    n += 1
                if n == 0:
                    return None
                counts[s], stop = n, stop - n
            return counts if stop == 0 else None

        lo = -1  # no split fits under a negative time
        hi = max(self._time(ch, sh, 0, L) for sh in shapes)  # every stage under its all-layer time
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fill(mid) is None:
                lo = mid
            else:
                hi = mid
        counts = fill(hi)
        assert counts is not None
        return tuple(ranges_from_counts(counts))

    def micro_batch_split(self, ch: Choice, parts: Structure,
                          layers: tuple[tuple[tuple[int, int], ...], ...]
                          ) -> tuple[tuple[int, ...], ...] | None:
        """Micro-batches per replica: each one goes to the replica whose estimated time
        (m - 1) * slowest stage + sum of stages grows least (ties: the earliest replica).
        None if there are fewer micro-batches than replicas."""
        total = ch.global_batch // ch.micro_batch
        n = sum(p.count for p in parts)
        if total < n:
            return None
        per_part = []
        for p, lay in zip(parts, layers, strict=True):
            ts = [self._time(ch, sh, *r) for sh, r in zip(p.stage_shapes(), lay, strict=True)]
            per_part.append((max(ts), sum(ts)))
        counts = [[1] * p.count for p in parts]
        heap = [(per_part[i][1] + per_part[i][0], i, j) for i, p in enumerate(parts)
                for j in range(p.count)]
        heapq.heapify(heap)
        for _ in range(total - n):
            t, i, j = heapq.heappop(heap)
            counts[i][j] += 1
            heapq.heappush(heap, (t + per_part[i][0], i, j))
        return tuple(tuple(c) for c in counts)

    # ---- bound and memory -----------------------------------------------------------------
    def lower_bound_ns(self, c: Candidate) -> int:
        """A lower bound on the simulated iteration time of ``c`` (ns); see the module doc."""
        ch = c.choice
        dp = sum(p.count for p in c.parts)
        best = 0
        for p, lay, ms in zip(c.parts, c.layers, c.micro_batches, strict=True):
            shapes = p.stage_shapes()
            costs = [self.stage_cost(ch, g, t, r) for (g, t), r in zip(shapes, lay, strict=True)]
            opt = [self.optimizer_ns(g, t, r, dp) for (g, t), r in zip(shapes, lay, strict=True)]
            m = max(ms)
            fill = drain = 0
            for i, cost in enumerate(costs):
                end = fill + m * cost.total_ns
                tail = opt[i]
                if ch.schedule in DRAIN_SCHEDULES:
                    tail = max(tail, drain + opt[0])
                best = max(best, end + tail)
                if ch.schedule in FILL_SCHEDULES:
                    fill += cost.fwd_ns
                if ch.schedule in DRAIN_SCHEDULES:
                    drain += cost.bwd_ns
        return best

    def candidate_plan(self, c: Candidate) -> Plan:
        """The candidate as a Plan object (for the memory model; not validated)."""
        from .space import iter_replicas

        reps = []
        for _, m, stages in iter_replicas(c):
            reps.append(Replica(stages=tuple(Stage(s["group"], tuple(s["devices"]), s["tp"],
                                                   tuple(s["layers"])) for s in stages),
                                micro_batches=m))
        return self.base_plan(c.choice, tuple(reps))

    def min_headroom_GB(self, c: Candidate) -> float:
        """The smallest memory headroom of any stage (GB, 1e9 bytes; negative: does not fit).

        Replicas of one part with the same micro-batch count have the same memory; only one
        of each is computed.
        """
        plan = self.candidate_plan(c)
        seen: set[tuple[int, int]] = set()
        r, worst = 0, float("inf")
        for i, p in enumerate(c.parts):
            for j in range(p.count):
                key = (i, c.micro_batches[i][j])
                if key not in seen:
                    seen.add(key)
                    for s in range(p.depth):
                        sm = stage_memory(plan, r, s)
                        worst = min(worst, (sm.capacity - sm.total) / GB)
                r += 1
        return worst


def _min_ns(duration: int | tuple[int, ...]) -> int:
    """A unit's duration for the bound: MoE units give one per local rank (expert loads
    differ); the smallest keeps the bound a lower bound."""
    return duration if isinstance(duration, int) else min(duration)
