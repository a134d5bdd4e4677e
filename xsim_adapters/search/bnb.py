"""Branch and bound over the candidates of a spec (docs/search.md#search).

Phase 1, analytical (microseconds per candidate): enumerate the space, derive each candidate's
layer and micro-batch splits, drop what cannot run (too few layers or micro-batches, memory
over capacity) and compute the lower bound of its objective from the iteration-time bound.

Phase 2, simulated: best-first. The surviving candidates are ordered by bound (ties by key) and
simulated on the flow backend in rounds of ``budget.wave``; a candidate whose bound is above the
best simulated objective so far (the incumbent) is cut without simulation, and since the order
is by bound, the search stops at the first such candidate. With a valid bound (bound <= simulated
time, docs/search.md#bound) the result is the best plan of the space, the same one an exhaustive
evaluation finds. Round sizes do not depend on ``--jobs``, so the evaluated set, and every
output, is the same for a given spec whatever the parallelism.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import PlanError
from .bound import Analyzer
from .budget import Deadline
from .evaluate import Evaluator, Row
from .space import Candidate, Choice, Structure, choices, plan_dict, structures
from .spec import SearchSpec

# Why a candidate of the space was not simulated (the ``status`` column).
STATUS_EVALUATED = "evaluated"
STATUS_LAYERS = "pruned:layers"  # more stages than layers
STATUS_BATCH = "pruned:batch"  # fewer micro-batches than replicas
STATUS_MEMORY = "pruned:memory"  # a stage exceeds its device memory
STATUS_DOMINATED = "pruned:dominated"  # the same plan as another candidate, or no better
# Phase 1 analyses every candidate (about a millisecond each): a space larger than this is an
# error naming the keys that shrink it, not a search that runs for hours.
MAX_CANDIDATES = 200_000
STATUS_BOUND = "pruned:bound"  # bound above the incumbent
STATUS_BUDGET = "not_reached:budget"  # the budget ran out first
STATUS_ERROR = "error"  # simulated, but the plan or the backend failed
# A resumed row more than this fraction below its candidate's lower bound is simulated again
# (the bound is proven <= the simulated time, docs/search.md#bound; the slack is for rounding).
BOUND_SLACK = 1e-6

Progress = Callable[[int, str], None]


@dataclass
class Entry:
    """One candidate with its analysis and (once simulated) its result row."""

    index: int
    cand: Candidate
    status: str
    lb_ns: float = float("nan")
    headroom_GB: float = float("nan")
    row: Row | None = None
    full: bool = False  # lb_ns is the full bound (else the pipeline part, refined on demand)


@dataclass
class Outcome:
    """The result of one branch-and-bound pass over a subset of the space."""

    label: str
    best: Entry | None
    considered: int  # feasible candidates in the subset
    evaluated: int  # simulated (or taken from the cache) by this pass
    cut: int  # cut by the bound
    unreached: int  # left when the budget ran out
    proven: bool  # the pass finished (not stopped by the budget)
    statuses: dict[int, str] = field(default_factory=dict)
    not_analysed: int = 0  # candidates of the whole space phase 1 did not reach (no entry)
    # The proven lower bound on the objective over the subset: the least of the best simulated
    # objective and the bounds of the candidates left unreached (inf: nothing ran, nothing left;
    # 0.0: phase 1 did not analyse some candidates, which have no bound).
    floor: float = float("inf")
    best_objective: float = float("nan")  # the best simulated objective (nan: none)

    @property
    def bound_over_best(self) -> float | None:
        """``floor`` / the best objective: 1.0 when proven, else the fraction of the best's
        objective that no plan of the subset can beat (None: nothing simulated)."""
        if self.best is None or self.best.row is None:
            return None
        return self.floor / self.best_objective


_NONE = Entry(-1, None, "none")  # type: ignore[arg-type]  # a lookup miss


def twin(spec: SearchSpec, c: Candidate) -> Choice | None:
    """The choice that gives ``c``'s very plan another name, if the space holds it: sequence
    parallel without TP (no TP collective to split, the same activation memory), ZeRO without
    data parallelism (the generator shards nothing), ``interleaved`` on single-stage replicas
    (run as 1F1B), ``tp-dp-pp`` where no part has both several replicas and several stages on
    one group (the very devices of ``tp-pp-dp``). None when ``c`` is its own canonical form."""
    ch, sp = c.choice, spec.space
    out = ch
    if ch.sequence_parallel and all(t == 1 for p in c.parts for t in p.tp) \
            and False in sp.sequence_parallel:
        out = replace(out, sequence_parallel=False)
    if ch.zero_stage and sum(p.count for p in c.parts) == 1 and 0 in sp.zero_stage:
        out = replace(out, zero_stage=0)
    if ch.schedule == "interleaved" and all(p.depth == 1 for p in c.parts) \
            and "1f1b" in sp.schedules:
        out = replace(out, schedule="1f1b", virtual_stages=1)
    if ch.order != "tp-pp-dp" and "tp-pp-dp" in sp.order and all(
            p.count == 1 or max(p.pp) == 1 for p in c.parts):
        out = replace(out, order="tp-pp-dp")  # one replica or one stage per group: same devices
    return None if out == ch else out


class Space(list[Entry]):
    """The entries :func:`enumerate_space` analysed, in space order, and ``size``: every
    candidate of the space (more than ``len`` when the budget stopped phase 1)."""

    size: int = 0

    @property
    def not_analysed(self) -> int:
        """Candidates phase 1 did not reach (``not_reached:budget``, not listed)."""
        return self.size - len(self)


def not_analysed(entries: list[Entry]) -> int:
    """How many candidates of the space ``entries`` stand for phase 1 did not reach."""
    return entries.not_analysed if isinstance(entries, Space) else 0


def enumerate_space(spec: SearchSpec, an: Analyzer, until: float = math.inf) -> Space:
    """Every candidate of the space with its phase-1 status, bound and headroom.

    Dominance (``pruned:dominated``): a candidate whose plan another candidate already is
    (:func:`twin`), and one with ZeRO stage z >= 2 when a lower stage >= 1 of the same plan
    fits in memory (ZeRO-2 and -3 move the same bytes as ZeRO-1 here and only save memory).
    ``until``: the monotonic instant the budget allows phase 1 (search/budget.py); the
    candidates not analysed by then are only counted (``Space.size``)."""
    out = Space()
    seen: dict[tuple[Choice, Structure, str], Entry] = {}
    level1, level2 = structures(spec), choices(spec)
    if len(level1) * len(level2) > MAX_CANDIDATES:
        raise PlanError("space", f"expected at most {MAX_CANDIDATES:,} candidates (got "
                                 f"{len(level1):,} structures x {len(level2):,} training "
                                 "choices); lower space.shapes_per_group or narrow space.tp, "
                                 "pp_min..pp_max or the choice lists")
    reshards = [spec.space.resharding if any(len(set(p.tp)) > 1 for p in parts)
                else spec.space.resharding[:1] for parts in level1]
    out.size = len(level2) * sum(len(r) for r in reshards)
    for ch in level2:
        for parts, reshard in zip(level1, reshards, strict=True):
            if until != math.inf and time.monotonic() >= until:
                return out  # the budget ran out: the rest is counted, not analysed
            layers = tuple(an.layer_split(ch, p) for p in parts)
            if any(lay is None for lay in layers):
                for r in reshard:
                    out.append(Entry(len(out), Candidate(ch, parts, r, (), ()), STATUS_LAYERS))
                continue
            lays = tuple(lay for lay in layers if lay is not None)
            mbs = an.micro_batch_split(ch, parts, lays)
            for r in reshard:
                if mbs is None:
                    out.append(Entry(len(out), Candidate(ch, parts, r, lays, ()), STATUS_BATCH))
                    continue
                c = Candidate(ch, parts, r, lays, mbs)
                if twin(spec, c) is not None or any(
                        seen.get((replace(ch, zero_stage=z), parts, r), _NONE).status == ""
                        for z in range(1, ch.zero_stage)):
                    out.append(Entry(len(out), c, STATUS_DOMINATED))
                    continue
                e = Entry(len(out), c, "", lb_ns=float(an.lower_bound_ns(c, full=False)),
                          headroom_GB=an.min_headroom_GB(c))
                e.status = STATUS_MEMORY if e.headroom_GB < 0 else ""
                seen[(ch, parts, r)] = e
                out.append(e)
    return out


class Searcher:
    """Phase 2 over the entries of :func:`enumerate_space`, sharing one evaluator (cache)."""

    def __init__(self, spec: SearchSpec, entries: list[Entry], evaluator: Evaluator,
                 progress: Progress | None = None, analyzer: Analyzer | None = None,
                 deadline: Deadline | None = None) -> None:
        self.spec = spec
        self.entries = entries
        self.ev = evaluator
        self._analyzer = analyzer
        self.progress = progress
        # the seconds budget bounds every pass together, from the command's start
        self.deadline = deadline or Deadline(spec.budget.seconds)
        self.simulations = 0  # over every pass, cached or not
        self._pass_sims = 0  # in the current pass (the evaluation budget is per pass)
        # phase 1 stopped by the budget: candidates of the space with no entry (no bound)
        self.not_analysed = not_analysed(entries)

    @property
    def analyzer(self) -> Analyzer:
        """The analyzer that refines bounds (the one given, else one made on first use)."""
        if self._analyzer is None:
            self._analyzer = Analyzer(self.spec)
        return self._analyzer

    def tokens(self, c: Candidate) -> int:
        return c.choice.global_batch * self.spec.model.seq_len

    def price_per_s(self, c: Candidate) -> float:
        """$ per second of the GPUs the candidate uses (0 without prices)."""
        prices = self.spec.prices_per_gpu_hour
        if not prices:
            return 0.0
        types = {g.name: g.type for g in self.spec.device_groups}
        total = 0.0
        for p in c.parts:
            for g, t, pp in zip(p.groups, p.tp, p.pp, strict=True):
                total += prices[types[g]] * t * pp * p.count
        return total / 3600.0

    def objective(self, c: Candidate, time_ns: float) -> float:
        """What is minimised: ns per token (throughput) or $ per million tokens (cost)."""
        if self.spec.objective == "cost":
            return self.price_per_s(c) * time_ns * 1e-9 / self.tokens(c) * 1e6
        return time_ns / self.tokens(c)

    def _budget_left(self) -> bool:
        b = self.spec.budget
        if b.evaluations is not None and self._pass_sims >= b.evaluations:
            return False
        return not self.deadline.passed()

    def _evaluate(self, batch: list[Entry]) -> list[Row | None]:
        """The rows of ``batch`` (None: killed at the deadline). A row read back for --resume
        whose time is below the candidate's proven lower bound cannot be a simulation's: it is
        simulated again (and the evaluator says why) instead of trusted."""
        plans = [plan_dict(self.spec, e.cand) for e in batch]
        keys = [e.cand.key for e in batch]
        rows = self.ev.evaluate(plans, keys, self.deadline.at)
        again = [k for k, (e, row) in enumerate(zip(batch, rows, strict=True))
                 if row is not None and _valid_time(row.get("iteration_time_ns"))
                 and float(row["iteration_time_ns"]) < e.lb_ns * (1 - BOUND_SLACK)
                 and self.ev.distrust(plans[k], f"{keys[k]}: {row['iteration_time_ns']} ns is "
                                                f"below its lower bound {e.lb_ns:.0f} ns")]
        if again:
            redo = self.ev.evaluate([plans[k] for k in again], [keys[k] for k in again],
                                    self.deadline.at)
            for k, row in zip(again, redo, strict=True):
                rows[k] = row
        return rows

    def refine(self, e: Entry) -> None:
        """Give ``e`` its full bound (the DP sync and ZeRO floors on top of the pipeline's)."""
        if not e.full:
            e.lb_ns = max(e.lb_ns, float(self.analyzer.lower_bound_ns(e.cand)))
            e.full = True

    def run(self, label: str, keep: Callable[[Entry], bool] = lambda e: True,
            exhaustive: bool = False) -> Outcome:
        """Best-first branch and bound over the feasible entries ``keep`` accepts
        (``exhaustive``: no cut, every one is simulated; the budget still applies).

        Candidates wait in a heap ordered by (objective bound, key). A candidate whose bound
        is still the pipeline part is given its full bound when it reaches the top and goes
        back in; a fully bounded one at the top is simulated (in rounds of ``budget.wave``),
        unless its bound is above the best simulated objective: then so is every other's,
        and the pass ends."""
        pool = [e for e in self.entries if e.status in ("", STATUS_EVALUATED, STATUS_ERROR)
                and keep(e)]
        heap = [(self.objective(e.cand, e.lb_ns), e.cand.key, e.index) for e in pool]
        heapq.heapify(heap)
        by_index = {e.index: e for e in pool}
        best: Entry | None = None
        best_obj = float("inf")
        statuses: dict[int, str] = {}
        evaluated = unstarted = 0  # (unstarted: killed at the deadline before finishing)
        wave = max(1, self.spec.budget.wave)
        self._pass_sims = 0
        done = False
        while heap and not done and self._budget_left():
            size = wave
            if self.spec.budget.evaluations is not None:
                size = min(size, self.spec.budget.evaluations - self._pass_sims)
            batch: list[Entry] = []
            while heap and len(batch) < size:
                if self.deadline.passed():  # (refining bounds takes time too)
                    break
                obj, _, i = heap[0]
                e = by_index[i]
                if not exhaustive and obj > best_obj:
                    done = True
                    break
                heapq.heappop(heap)
                if not e.full:
                    self.refine(e)
                    heapq.heappush(heap, (self.objective(e.cand, e.lb_ns), e.cand.key, i))
                    continue
                batch.append(e)
            if not batch:
                break
            rows = self._evaluate(batch)
            ran = sum(row is not None for row in rows)
            self.simulations += ran
            self._pass_sims += ran
            evaluated += ran
            for e, row in zip(batch, rows, strict=True):
                if row is None:  # killed at the deadline: not simulated, no proof
                    statuses[e.index] = STATUS_BUDGET
                    unstarted += 1
                    continue
                e.row = row
                ok = row.get("error") == "" and _valid_time(row.get("iteration_time_ns"))
                e.status = STATUS_EVALUATED if ok else STATUS_ERROR
                statuses[e.index] = e.status
                if ok:
                    obj = self.objective(e.cand, float(row["iteration_time_ns"]))
                    if (obj, e.cand.key) < (best_obj, best.cand.key if best else "~"):
                        best, best_obj = e, obj
            if self.progress:
                shown = "none" if best is None else f"{best_obj:.4g}"
                self.progress(len(batch), f"{label}: best {shown} after {evaluated} sims")
        unreached, cut = unstarted, 0
        for _, _, i in heap:
            e = by_index[i]
            if e.index in statuses:
                continue
            if exhaustive or self.objective(e.cand, e.lb_ns) <= best_obj:
                statuses[e.index] = STATUS_BUDGET
                unreached += 1
            else:
                statuses[e.index] = STATUS_BOUND
                cut += 1
        if self.progress and len(pool) > evaluated:
            self.progress(len(pool) - evaluated, f"{label}: done")
        # never analysed (no bound): no proof over the space, whichever subset this pass is
        proven = unreached == 0 and self.not_analysed == 0
        floor = 0.0 if self.not_analysed else min(
            [best_obj] + [self.objective(by_index[i].cand, by_index[i].lb_ns)
                          for i, st in statuses.items() if st == STATUS_BUDGET])
        return Outcome(label=label, best=best, considered=len(pool), evaluated=evaluated,
                       cut=cut, unreached=unreached, proven=proven, statuses=statuses,
                       not_analysed=self.not_analysed, floor=floor,
                       best_objective=best_obj if best is not None else math.nan)


def _valid_time(v: Any) -> bool:
    """An iteration time a simulation can give: a finite number of ns > 0 (a row read back
    for --resume is checked on reading; this keeps any other source from ranking first)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v) and v > 0
    except OverflowError:  # an int too large for a float
        return False


def prune_counts(entries: list[Entry], outcome: Outcome) -> dict[str, int]:
    """How many candidates of the space ended in each status after ``outcome`` (the main
    pass): phase-1 prunes, evaluated, errors, cut by the bound, not reached."""
    c: Counter[str] = Counter()
    for e in entries:
        c[outcome.statuses.get(e.index, e.status or STATUS_BOUND)] += 1
    if not_analysed(entries):  # phase 1 never reached them (only counted)
        c[STATUS_BUDGET] += not_analysed(entries)
    return dict(sorted(c.items()))


def entry_types(spec: SearchSpec, e: Entry) -> frozenset[str]:
    """The device types a candidate uses."""
    types = {g.name: g.type for g in spec.device_groups}
    return frozenset(types[g] for g in e.cand.groups_used)


def outcome_summary(o: Outcome, spec: SearchSpec) -> dict[str, Any]:
    """A JSON-able summary of one pass."""
    b = o.best
    return {
        "label": o.label,
        "considered": o.considered,
        "evaluated": o.evaluated,
        "cut_by_bound": o.cut,
        "not_reached": o.unreached,
        "not_analysed": o.not_analysed,
        "proven_optimal": o.proven,
        "best": None if b is None else b.cand.key,
        "best_iteration_time_ns": None if b is None or b.row is None
        else float(b.row["iteration_time_ns"]),
        "best_tokens_per_s": None if b is None or b.row is None
        else float(b.row["tokens_per_s"]),
        "best_global_batch": None if b is None else b.cand.choice.global_batch,
        # the space's proven lower bound on the objective over the best's (1.0: proven)
        "bound_over_best": _rounded(o.bound_over_best),
        # the best plan's own lower bound over its simulated time
        "best_bound_over_time": None if b is None or b.row is None
        else _rounded(b.lb_ns / float(b.row["iteration_time_ns"])),
    }


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
