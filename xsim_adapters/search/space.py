"""The search space: which plans a spec allows, enumerated as :class:`Candidate` values.

A candidate is built in three levels (docs/search.md#space):

1. **structure**: every device group is idle, split into identical pure replicas of shape
   (tp, pp), or (``mix_types``) paired with a group of another type into identical mixed
   replicas whose first stages sit on one group and last stages on the other (both stage
   orders are candidates; memory-rich first is the order tried first);
2. **training choices**: global batch, micro-batch size, schedule, recompute, layer split
   rule and (only where consecutive stages differ in TP) resharding method;
3. **derived, not searched**: the layer split of each replica shape (``balanced``: the
   contiguous split minimising the slowest stage's compute per micro-batch under the compute
   model; ``even``: equal counts) and the micro-batch split over replicas (greedy on the
   estimated replica time), both in :mod:`.bound`.

Replicas of a part occupy consecutive device blocks of their group, TP groups never cross an
NVLink domain (tp divides the domain's GPUs: a server's, or an NVL rack's with
``nvlink_domain_gpus``), so the plans need no scale-up-across-nodes rule.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..plan.model import DeviceGroup
from .spec import SearchSpec, plan_base


@dataclass(frozen=True)
class Part:
    """Identical replicas: ``count`` pipelines whose stages run on ``groups`` in order, with
    ``pp[i]`` stages of TP ``tp[i]`` on ``groups[i]`` (one group: pure, two: mixed)."""

    groups: tuple[str, ...]
    tp: tuple[int, ...]
    pp: tuple[int, ...]
    count: int
    base: tuple[int, ...] = ()  # first device on each group (default 0: the group's start)

    def base_of(self, i: int) -> int:
        """First device of this part on ``groups[i]``."""
        return self.base[i] if self.base else 0

    def devices_on(self, i: int) -> int:
        """Devices this part uses on ``groups[i]``."""
        return self.tp[i] * self.pp[i] * self.count

    @property
    def depth(self) -> int:
        return sum(self.pp)

    def stage_shapes(self) -> tuple[tuple[str, int], ...]:
        """(group, tp) of each stage in pipeline order."""
        return tuple((g, t) for g, t, p in zip(self.groups, self.tp, self.pp, strict=True)
                     for _ in range(p))

    def label(self) -> str:
        return "+".join(f"{g}:tp{t}pp{p}" for g, t, p in zip(self.groups, self.tp, self.pp,
                                                            strict=True)) + f"x{self.count}"


Structure = tuple[Part, ...]


@dataclass(frozen=True)
class Choice:
    """The training choices of a candidate (level 2)."""

    global_batch: int
    micro_batch: int
    schedule: str
    recompute: str
    layer_split: str
    zero_stage: int = 0
    sequence_parallel: bool = False
    virtual_stages: int = 1  # model chunks per stage (``interleaved`` only)
    order: str = "tp-pp-dp"  # rank placement of each part's replicas (iter_replicas)

    @property
    def label(self) -> str:
        """The choice as the key's first words (axes at their defaults are left out)."""
        sched = self.schedule + (f"-v{self.virtual_stages}" if self.schedule == "interleaved"
                                 else "")
        extra = (f" z{self.zero_stage}" if self.zero_stage else "") + (
            " sp" if self.sequence_parallel else "") + (
            f" {self.order}" if self.order != "tp-pp-dp" else "")
        return (f"gb{self.global_batch} mb{self.micro_batch} {sched} rc-{self.recompute}"
                f"{extra} {self.layer_split}")


@dataclass(frozen=True)
class Candidate:
    """One complete plan of the space: structure, choices, derived layer and batch splits.

    ``layers[i]`` is the layer range of every stage of part i; ``micro_batches[i]`` the
    micro-batch count of each of part i's replicas.
    """

    choice: Choice
    parts: Structure
    resharding: str
    layers: tuple[tuple[tuple[int, int], ...], ...]
    micro_batches: tuple[tuple[int, ...], ...]

    @property
    def key(self) -> str:
        """A readable identity, also the tie-break order of equal objectives."""
        return candidate_key(self.choice.label, self.resharding, structure_label(self.parts))

    @property
    def groups_used(self) -> tuple[str, ...]:
        return tuple(g for p in self.parts for g in p.groups)

    @property
    def num_gpus(self) -> int:
        return sum(t * pp * p.count for p in self.parts for t, pp in zip(p.tp, p.pp,
                                                                         strict=True))

    @property
    def has_reshard(self) -> bool:
        return any(len(set(p.tp)) > 1 for p in self.parts)


def structure_label(parts: Structure) -> str:
    """The replicas of a structure as text (``h100:tp8pp2x1 a100:tp4pp1x2``)."""
    return " ".join(p.label() for p in parts)


def candidate_key(choice_label: str, resharding: str, structure: str) -> str:
    """:attr:`Candidate.key` from its parts' labels (so a table of many candidates can
    reuse the label of a structure they share)."""
    return f"{choice_label} {resharding} | {structure}"


def _tp_choices(spec: SearchSpec, g: DeviceGroup) -> list[int]:
    return [t for t in spec.space.tp[g.type] if g.domain_gpus % t == 0]


def pure_shapes(spec: SearchSpec, g: DeviceGroup) -> list[tuple[int, int]]:
    """Every (tp, pp) a pure replica on group ``g`` may have, largest first."""
    sp = spec.space
    return sorted(((tp, pp) for tp in _tp_choices(spec, g)
                   for pp in range(sp.pp_min, sp.pp_max + 1) if tp * pp <= g.num_devices),
                  reverse=True)


def fills(spec: SearchSpec, g: DeviceGroup, devices: int, start: int, kinds: int
          ) -> list[tuple[Part, ...]]:
    """Every way to fill ``devices`` devices of group ``g`` from device ``start`` with pure
    replicas of at most ``kinds`` distinct (tp, pp) shapes (each used at least once).

    Symmetry breaking: a fill is a set of (shape, count), written once, its parts laid out
    from ``start`` in decreasing (tp, pp). Every part of a fill of several parts covers whole
    servers (its devices a multiple of ``gpus_per_node``): servers are never shared between
    shapes, so every TP group stays aligned inside a server and two fills differ by more than
    the place of a replica."""
    if devices == 0:
        return [()]
    shapes = pure_shapes(spec, g)
    found: list[tuple[tuple[int, int, int], ...]] = []

    def rec(i: int, left: int, chosen: tuple[tuple[int, int, int], ...]) -> None:
        if left == 0:
            found.append(chosen)
            return
        if len(chosen) == kinds:
            return
        for k in range(i, len(shapes)):
            tp, pp = shapes[k]
            size = tp * pp
            for count in range(left // size, 0, -1):
                if count * size != devices and (count * size) % g.gpus_per_node:
                    continue  # a part of a mixed fill covers whole servers
                rec(k + 1, left - count * size, (*chosen, (tp, pp, count)))

    rec(0, devices, ())
    out = []
    for chosen in found:
        base, parts = start, []
        for tp, pp, count in chosen:
            if base % tp or g.domain_gpus % tp:
                break
            parts.append(Part((g.name,), (tp,), (pp,), count, (base,)))
            base += tp * pp * count
        else:
            out.append(tuple(parts))
    return out


def mixed_shapes(spec: SearchSpec, a: DeviceGroup, b: DeviceGroup, whole: bool) -> list[Part]:
    """Mixed replicas over groups ``a`` then ``b`` (a's stages first) from device 0 of both:
    ``whole``: using both groups fully (one count per shape), else every count that fits."""
    sp, out = spec.space, []
    for ta in _tp_choices(spec, a):
        for tb in _tp_choices(spec, b):
            for pa in range(1, sp.pp_max):
                for pb in range(1, sp.pp_max - pa + 1):
                    if pa + pb < sp.pp_min:
                        continue
                    most = min(a.num_devices // (ta * pa), b.num_devices // (tb * pb))
                    if whole:
                        if a.num_devices % (ta * pa) or b.num_devices % (tb * pb):
                            continue
                        n = a.num_devices // (ta * pa)
                        if n == b.num_devices // (tb * pb):
                            out.append(Part((a.name, b.name), (ta, tb), (pa, pb), n, (0, 0)))
                        continue
                    for n in range(most, 0, -1):  # whole servers on both groups
                        if (n * ta * pa) % a.gpus_per_node or (n * tb * pb) % b.gpus_per_node:
                            continue
                        out.append(Part((a.name, b.name), (ta, tb), (pa, pb), n, (0, 0)))
    return out


def structures(spec: SearchSpec) -> list[Structure]:
    """Every level-1 structure, in a fixed order (at least one group busy).

    Each group is idle, filled with pure replicas of at most ``space.shapes_per_group``
    distinct shapes (:func:`fills`), or (``mix_types``) shares one mixed part with a group of
    another type; with one shape per group the mixed part uses both groups fully, with more it
    may use part of each and pure replicas (one shape fewer) fill the rest."""
    groups = list(spec.device_groups)
    types = {g.name: spec.device_types[g.type] for g in groups}
    kinds = spec.space.shapes_per_group
    whole = kinds == 1
    full = {g.name: fills(spec, g, g.num_devices, 0, kinds) for g in groups}
    out: list[Structure] = []

    def rec(i: int, taken: frozenset[str], acc: tuple[Part, ...]) -> None:
        while i < len(groups) and groups[i].name in taken:
            i += 1
        if i == len(groups):
            if acc:
                out.append(tuple(sorted(acc, key=lambda p: (p.groups, p.base))))
            return
        g = groups[i]
        for parts in full[g.name]:
            rec(i + 1, taken, acc + parts)
        if spec.space.mix_types:
            for h in groups[i + 1:]:
                if h.name in taken or h.type == g.type:
                    continue
                # memory-rich first (absorbs the early stages' activations), then the reverse
                rich = sorted((g, h), key=lambda x: (-types[x.name].hbm_GB, x.name))
                for first, second in (rich, rich[::-1]):
                    for part in mixed_shapes(spec, first, second, whole):
                        rest = [fills(spec, grp, grp.num_devices - part.devices_on(k),
                                      part.devices_on(k), kinds - 1)
                                for k, grp in enumerate((first, second))]
                        for ra in rest[0]:
                            for rb in rest[1]:
                                rec(i + 1, taken | {h.name}, acc + (part, *ra, *rb))
        if spec.space.idle_groups:
            rec(i + 1, taken, acc)

    rec(0, frozenset(), ())
    return out


def choices(spec: SearchSpec) -> list[Choice]:
    """Every level-2 choice except resharding, in a fixed order."""
    sp = spec.space
    return [Choice(gb, mb, s, r, ls, z, sq, v if s == "interleaved" else 1, o)
            for gb in spec.global_batches for mb in sp.micro_batch
            if gb % mb == 0 for s in sp.schedules
            for v in (sp.virtual_stages if s == "interleaved" else (1,))
            for r in sp.recompute for z in sp.zero_stage for sq in sp.sequence_parallel
            for ls in sp.layer_split for o in sp.order]


def iter_replicas(c: Candidate) -> Iterator[tuple[int, int, list[dict[str, Any]]]]:
    """(part index, micro-batches, stages as plan dicts) of every replica, in plan order.

    On each group a part's stage k of replica j starts at the part's base plus
    ``(j * pp + k) * tp`` (``tp-pp-dp``: a replica's stages side by side) or
    ``(k * count + j) * tp`` (``tp-dp-pp``: the DP peers of a stage side by side), as the
    plan's uniform shorthand places them (plan/replicas.py)."""
    outer = c.choice.order == "tp-dp-pp"
    for i, part in enumerate(c.parts):
        for j in range(part.count):
            stages = []
            s = 0
            for gi, (g, tp, pp) in enumerate(zip(part.groups, part.tp, part.pp, strict=True)):
                for k in range(pp):
                    slot = k * part.count + j if outer else j * pp + k
                    lo = part.base_of(gi) + slot * tp
                    stages.append({"group": g, "devices": [lo, lo + tp], "tp": tp,
                                   "layers": list(c.layers[i][s])})
                    s += 1
            yield i, c.micro_batches[i][j], stages


def plan_dict(spec: SearchSpec, c: Candidate, name: str | None = None) -> dict[str, Any]:
    """The candidate as a plan (plain data, the YAML form ``xsim run`` reads).

    Idle device groups are left out of ``device_groups`` (a plan may not hold unused groups'
    ranks silently).
    """
    base = plan_base(spec)
    used = set(c.groups_used)
    base["device_groups"] = {k: v for k, v in base["device_groups"].items() if k in used}
    ch = c.choice
    training = {k: v for k, v in base["training"].items()}
    training.update(global_batch=ch.global_batch, micro_batch=ch.micro_batch,
                    schedule=ch.schedule, recompute=ch.recompute)
    for key, value in (("zero_stage", ch.zero_stage), ("sequence_parallel",
                                                       ch.sequence_parallel)):
        if value or key in training:  # axes at their defaults stay out of the plan
            training[key] = value
    training.pop("virtual_stages", None)
    if ch.schedule == "interleaved":
        training["virtual_stages"] = ch.virtual_stages
    base["training"] = training
    coll = dict(base.get("collectives") or {})
    if c.has_reshard or "resharding" in coll:
        coll["resharding"] = c.resharding
    if coll:
        base["collectives"] = coll
    replicas = [{"stages": st, "micro_batches": m} for _, m, st in iter_replicas(c)]
    return {"name": name or spec.name, "seed": spec.seed, **base, "replicas": replicas}
