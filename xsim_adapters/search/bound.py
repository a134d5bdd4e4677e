"""The analytical side of the search: stage costs, the derived splits, memory, the lower bound.

Every number comes from the generator's own models: a block's cost is the sum of the unit
durations :func:`..workload.blocks.stage_units` gives (the very durations the trace carries)
plus, after each unit with TP collectives, the floor :mod:`.comm` proves for them (the NCCL
delay barrier and the bytes the rank must send over its links); the optimizer step is
:func:`..workload.compute.optimizer_time_ns` over the parameters the generator gives it.
Memory is :func:`..feasibility.memory.stage_memory`. Nothing here runs a simulation.

The lower bound (proof in docs/search.md#bound) is the largest of, per candidate:

- per replica and stage, the earliest end of its last block in the pipeline's dependency graph
  under those costs (:func:`.pipeline.earliest_schedule`; fill, drain and the wait of every
  micro-batch for the stages after it are in it) plus its optimizer step;
- per server, the DP sync that must cross its links after the gradients are ready, then an
  optimizer step; with ZeRO the parameter all-gathers (:mod:`.dpbound`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any

from ..feasibility.memory import GB, stage_memory
from ..plan.layout import even_split, ranges_from_counts
from ..plan.model import Plan, Replica, Stage, TrainingSpec
from ..plan.sizes import activation_bytes
from ..workload.blocks import Unit, stage_units, tp_kinds
from ..workload.compute.costs import optimizer_time_ns, stage_params
from ..workload.schedule import BWD, FWD, WGRAD, replica_chunks
from .comm import Fabric
from .dpbound import Costs, SyncShape, dp_tail_ns, gather_floors, sync_shape
from .pipeline import StageTimes, earliest_schedule
from .space import Candidate, Choice, Part, Structure, iter_replicas
from .spec import SearchSpec


@dataclass(frozen=True)
class BlockCost:
    """One block's floor on one rank (ns): ``total_ns`` (compute and the TP collectives the
    rank's next op waits for), ``compute_end_ns`` (the end of its last compute op) and, per
    unit mark, the unit's (start, compute end) offsets from the block's start."""

    total_ns: int
    compute_end_ns: int
    marks: dict[object, tuple[int, int]] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class StageCost:
    """Per-micro-batch blocks of one model chunk of a stage: forward, backward[, weight
    gradient] (ns)."""

    blocks: tuple[BlockCost, ...]

    @property
    def fwd_ns(self) -> int:
        return self.blocks[0].total_ns

    @property
    def bwd_ns(self) -> int:
        return sum(b.total_ns for b in self.blocks[1:])

    @property
    def total_ns(self) -> int:
        return self.fwd_ns + self.bwd_ns


def block_cost(units: list[Unit], gap_ns: int) -> BlockCost:
    """The floor of a block of ``units`` when each unit with TP collectives is followed by
    ``gap_ns`` on the rank (its next compute op, or the next block, waits for them)."""
    t = 0
    marks: dict[object, tuple[int, int]] = {}
    compute_end = 0
    for u in units:
        begin = t
        t += _min_ns(u.duration_ns)
        compute_end = t
        if u.mark is not None:
            marks[u.mark] = (begin, t)
        if u.kinds:
            t += gap_ns
    return BlockCost(t, compute_end, marks)


class Analyzer:
    """Cached model numbers for one spec (costs per stage, splits, bounds, memory)."""

    def __init__(self, spec: SearchSpec) -> None:
        self.spec = spec
        self.types = {g.name: spec.device_types[g.type] for g in spec.device_groups}
        self._cost: dict[tuple[Any, ...], StageCost] = {}
        self._plans: dict[Choice, Plan] = {}
        self._split: dict[tuple[Any, ...], tuple[tuple[int, int], ...] | None] = {}
        self._dag: dict[tuple[Any, ...], list[StageTimes]] = {}
        self._sync: dict[tuple[Any, ...], SyncShape] = {}
        self._units: dict[tuple[Any, ...], list[list[Unit]]] = {}
        self._times: dict[tuple[Any, ...], int] = {}
        self._opt: dict[tuple[Any, ...], int] = {}
        self._fabric: Fabric | None = None

    # ---- compute model --------------------------------------------------------------------
    def training(self, ch: Choice) -> TrainingSpec:
        return replace(self.spec.training, global_batch=ch.global_batch,
                       micro_batch=ch.micro_batch, schedule=ch.schedule,  # type: ignore[arg-type]
                       recompute=ch.recompute,  # type: ignore[arg-type]
                       zero_stage=ch.zero_stage, sequence_parallel=ch.sequence_parallel,
                       virtual_stages=ch.virtual_stages)

    def base_plan(self, ch: Choice, replicas: tuple[Replica, ...] = ()) -> Plan:
        """A Plan object of the spec's cluster under ``ch`` (not validated; for the models)."""
        s = self.spec
        return Plan(name=s.name, model=s.model, training=self.training(ch),
                    device_types=dict(s.device_types), device_groups=s.device_groups,
                    network=s.network, replicas=replicas, collectives=s.collectives, seed=s.seed)

    @property
    def fabric(self) -> Fabric:
        """Capacities and collective floors of the whole cluster (built on first use)."""
        if self._fabric is None:
            self._fabric = Fabric(self.base_plan(Choice(self.spec.global_batches[0], 1,
                                                        "1f1b", "none", "balanced")))
        return self._fabric

    def act_bytes(self, ch: Choice) -> int:
        """Bytes of one micro-batch's activation (what a TP collective and a PP send carry)."""
        return activation_bytes(self.spec.model, ch.micro_batch)

    def tp_gap_ns(self, ch: Choice, group: str, lo: int, tp: int) -> int:
        """The floor (ns) a unit's TP collectives put between its compute and the rank's next
        op (:meth:`.comm.Fabric.tp_gap_ns`); 0 with ``overlap.tp_comm`` (the collectives then
        run beside the GEMMs) or tp = 1."""
        if tp == 1 or self.spec.training.overlap.tp_comm:
            return 0
        plan = self._plans.get(ch) or self._plans.setdefault(ch, self.base_plan(ch))
        return self.fabric.tp_gap_ns(group, lo, tp, self.act_bytes(ch), tp_kinds(plan))

    def stage_cost(self, ch: Choice, group: str, tp: int, layers: tuple[int, int], lo: int = 0,
                   first: bool | None = None, last: bool | None = None) -> StageCost:
        """The blocks of one micro-batch on a stage (or model chunk) holding ``layers`` on the
        TP group [lo, lo + tp) of ``group`` (ns). ``first`` / ``last``: the chunk holds the
        embedding / the head (default: from ``layers``)."""
        first = layers[0] == 0 if first is None else first
        last = layers[1] == self.spec.model.layers if last is None else last
        gap = self.tp_gap_ns(ch, group, lo, tp)
        ukey = (ch.micro_batch, ch.recompute, ch.schedule == "zb_h1", ch.sequence_parallel,
                self.types[group].name, tp, layers[1] - layers[0], first, last)
        key = (*ukey, gap)
        hit = self._cost.get(key)
        if hit is None:
            units = self._units.get(ukey)
            if units is None:
                plan = self._plans.get(ch) or self._plans.setdefault(ch, self.base_plan(ch))
                st = Stage(group=group, devices=(0, tp), tp=tp, layers=layers)
                units = stage_units(plan, st, self.types[group], first, last, layers,
                                    split_w=ch.schedule == "zb_h1")
                self._units[ukey] = units
            hit = StageCost(tuple(block_cost(us, gap) for us in units))
            self._cost[key] = hit
        return hit

    def optimizer_ns(self, ch: Choice, group: str, tp: int, layers: tuple[int, int],
                     dp: int) -> int:
        """The optimizer step of a stage's rank, as the generator sizes it (ZeRO: / dp)."""
        zero = ch.zero_stage >= 1 and dp > 1
        key = (self.types[group].name, tp, layers, dp if zero else 1)
        hit = self._opt.get(key)
        if hit is None:
            params = stage_params(self.spec.model, layers) / tp / (dp if zero else 1)
            hit = optimizer_time_ns(params, self.types[group])
            self._opt[key] = hit
        return hit

    # ---- derived splits -------------------------------------------------------------------
    def layer_split(self, ch: Choice, part: Part) -> tuple[tuple[int, int], ...] | None:
        """Layer ranges of ``part``'s stages by ``ch.layer_split`` (None: too few layers, or
        fewer than ``virtual_stages`` on a stage of an interleaved pipeline)."""
        shapes = part.stage_shapes()
        L = self.spec.model.layers
        v = ch.virtual_stages if ch.schedule == "interleaved" and len(shapes) > 1 else 1
        if len(shapes) * v > L:
            return None
        key = (ch.micro_batch, ch.recompute, ch.layer_split, ch.sequence_parallel, v,
               tuple((self.types[g].name, t) for g, t in shapes))
        if key in self._split:
            return self._split[key]
        if ch.layer_split == "even":
            out = tuple(ranges_from_counts(even_split(L, len(shapes))))
        else:
            out = self._balanced(ch, shapes, v)
        self._split[key] = out
        return out

    def _time(self, ch: Choice, shape: tuple[str, int], a: int, b: int) -> int:
        """Per-micro-batch cost of a stage of ``shape`` holding layers [a, b) (cached)."""
        L = self.spec.model.layers
        key = (ch.micro_batch, ch.recompute, ch.schedule == "zb_h1", ch.sequence_parallel,
               shape, b - a, a == 0, b == L)
        hit = self._times.get(key)
        if hit is None:
            hit = self.stage_cost(ch, shape[0], shape[1], (a, b)).total_ns
            self._times[key] = hit
        return hit

    def _balanced(self, ch: Choice, shapes: tuple[tuple[str, int], ...], least: int = 1
                  ) -> tuple[tuple[int, int], ...]:
        """The contiguous split minimising the slowest stage's per-micro-batch cost, every
        stage holding at least ``least`` layers.

        Binary search on the threshold T; a split under T exists iff filling stages from the
        last one backwards, each with as many layers as stay under T (keeping ``least`` layers
        for every earlier stage), covers all layers. Filling from the back gives the early
        stages, which hold the most micro-batches in flight, the fewest layers.
        """
        L, S = self.spec.model.layers, len(shapes)

        def fill(T: int) -> list[int] | None:
            counts, stop = [0] * S, L
            for s in range(S - 1, -1, -1):
                n = 0
                while stop - n - 1 >= s * least and \
                        self._time(ch, shapes[s], stop - n - 1, stop) <= T:
                    n += 1
                if n < least:
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
        if counts is None:  # only the least-per-stage floor binds: fall back to equal counts
            counts = even_split(L, S)
        return tuple(ranges_from_counts(counts))

    def micro_batch_split(self, ch: Choice, parts: Structure,
                          layers: tuple[tuple[tuple[int, int], ...], ...]
                          ) -> tuple[tuple[int, ...], ...] | None:
        """Micro-batches per replica: each one (under ``interleaved`` each pp of them, as
        Megatron requires m a multiple of pp) goes to the replica whose estimated time
        (m - 1) * slowest stage + sum of stages grows least (ties: the earliest replica).
        None if the replicas cannot all get their share."""
        total = ch.global_batch // ch.micro_batch
        quantum = [p.depth if ch.schedule == "interleaved" and p.depth > 1 else 1
                   for p in parts]
        need = sum(q * p.count for q, p in zip(quantum, parts, strict=True))
        if total < need:
            return None
        per_part = []
        for p, lay in zip(parts, layers, strict=True):
            ts = [self._time(ch, sh, *r) for sh, r in zip(p.stage_shapes(), lay, strict=True)]
            per_part.append((max(ts), sum(ts)))
        counts = [[quantum[i]] * p.count for i, p in enumerate(parts)]
        heap = [(per_part[i][1] + quantum[i] * per_part[i][0], i, j)
                for i, p in enumerate(parts) for j in range(p.count)]
        heapq.heapify(heap)
        left = total - need
        while left and heap:
            t, i, j = heapq.heappop(heap)
            q = quantum[i]
            if q > left:  # this replica can take no more whole quanta
                continue
            counts[i][j] += q
            left -= q
            heapq.heappush(heap, (t + q * per_part[i][0], i, j))
        if left:
            return None
        return tuple(tuple(c) for c in counts)

    # ---- bound and memory -----------------------------------------------------------------
    def candidate_plan(self, c: Candidate) -> Plan:
        """The candidate as a Plan object (for the models; not validated)."""
        reps = []
        for _, m, stages in iter_replicas(c):
            reps.append(Replica(stages=tuple(Stage(s["group"], tuple(s["devices"]), s["tp"],
                                                   tuple(s["layers"])) for s in stages),
                                micro_batches=m))
        used = set(c.groups_used)
        plan = self.base_plan(c.choice, tuple(reps))
        return replace(plan, device_groups=tuple(g for g in plan.device_groups
                                                 if g.name in used))

    def sync_shape(self, c: Candidate, plan: Plan) -> SyncShape | None:
        """The DP rings of ``c`` (None without data parallelism), cached per structure."""
        if plan.dp < 2:
            return None
        ch = c.choice
        key = (tuple(tuple((st.group, st.devices, st.tp, st.layers) for st in rep.stages)
                     for rep in plan.replicas), ch.zero_stage >= 1,
               ch.virtual_stages if ch.schedule == "interleaved" else 1)
        hit = self._sync.get(key)
        if hit is None:
            hit = sync_shape(self, plan, ch.zero_stage >= 1)
            self._sync[key] = hit
        return hit

    def stage_costs(self, c: Candidate, plan: Plan) -> Costs:
        """The blocks of every (replica, stage, chunk) of a candidate plan."""
        ch = c.choice
        out: Costs = {}
        for r, rep in enumerate(plan.replicas):
            chunks = replica_chunks(plan, r)
            nv, pp = len(chunks[0]), rep.pp
            for s, st in enumerate(rep.stages):
                for k, lay in enumerate(chunks[s]):
                    out[(r, s, k)] = self.stage_cost(ch, st.group, st.tp, lay, st.devices[0],
                                                     s == 0 and k == 0,
                                                     s == pp - 1 and k == nv - 1)
        return out

    def replica_times(self, c: Candidate, plan: Plan, costs: Costs, shape: SyncShape | None
                      ) -> list[list[StageTimes]]:
        """Per replica (plan order), per stage: the earliest schedule of its blocks."""
        ch = c.choice
        floors = gather_floors(costs, c, plan, shape)
        out = []
        method = plan.collectives.resharding
        nbytes = self.act_bytes(ch)
        fab = self.fabric
        for r, rep in enumerate(plan.replicas):
            chunks = replica_chunks(plan, r)
            nv, pp = len(chunks[0]), rep.pp
            cost = []
            for s in range(pp):
                per: dict[tuple[int, int], int] = {}
                for k in range(nv):
                    for kind, blk in zip((FWD, BWD, WGRAD), costs[(r, s, k)].blocks,
                                         strict=False):
                        per[(kind, k)] = blk.total_ns
                cost.append(per)
            fx, bx = [], []
            for j in range(pp * nv - 1):
                a, b = rep.stages[j % pp], rep.stages[(j + 1) % pp]
                sa, sb = (a.group, a.devices[0], a.tp), (b.group, b.devices[0], b.tp)
                fx.append(fab.transfer_ns(sa, sb, nbytes, method))
                bx.append(fab.transfer_ns(sb, sa, nbytes, method))
            fl = floors.get(r)
            key = (ch.schedule, pp, rep.micro_batches, nv,
                   tuple(tuple(sorted(d.items())) for d in cost), tuple(fx), tuple(bx),
                   None if fl is None else tuple(tuple(sorted(d.items())) for d in fl))
            hit = self._dag.get(key)
            if hit is None:
                hit = earliest_schedule(ch.schedule, pp, rep.micro_batches, nv, cost, fx, bx,
                                        fl)
                self._dag[key] = hit
            out.append(hit)
        return out

    def lower_bound_ns(self, c: Candidate, full: bool = True) -> int:
        """A lower bound on the simulated iteration time of ``c`` (ns); see the module doc.

        ``full=False``: the pipeline and optimizer part only (no DP sync, no ZeRO
        all-gather): cheaper, and never above the full bound (:class:`.bnb.Searcher` refines
        a candidate's bound when its turn comes)."""
        plan = self.candidate_plan(c)
        shape = self.sync_shape(c, plan) if full else None
        costs = self.stage_costs(c, plan)
        times = self.replica_times(c, plan, costs, shape)
        best = 0.0
        for r, rep in enumerate(plan.replicas):
            for s, st in enumerate(rep.stages):
                opt = self.optimizer_ns(c.choice, st.group, st.tp, st.layers, plan.dp)
                best = max(best, times[r][s].last_end + opt)
        if shape is not None:
            best = max(best, dp_tail_ns(self, costs, c, plan, times, shape))
        return int(best)

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
