"""The search spec: YAML -> a validated :class:`SearchSpec` (format: docs/search.md).

The cluster sections (``model``, ``training``, ``device_types``, ``device_groups``, ``network``,
``collectives``) are read by the plan's own section parsers, so they accept exactly what a plan
accepts and fail with the plan's messages; ``space``, ``prices_per_gpu_hour``, ``objective`` and
``budget`` are the search's own, read with the same field helpers (one line naming the YAML
path, what was expected and what was found).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast, get_args

from ..errors import PlanError
from ..plan import _fields as f
from ..plan import limits as lim
from ..plan.bounded_yaml import parse_yaml
from ..plan.kinds import SEARCH_SPEC, check_kind
from ..plan.loader import _parse_device_types, read_plan_file
from ..plan.model import (
    CollectivesSpec,
    DeviceGroup,
    DeviceType,
    ModelSpec,
    NetworkSpec,
    Recompute,
    Resharding,
    TrainingSpec,
)
from ..plan.network import parse_network
from ..plan.precision import settle_precision
from ..plan.presets import _device_presets, _model_presets
from ..plan.replicas import UNIFORM_ORDERS, parse_groups
from ..plan.sections import (
    parse_collectives,
    parse_model,
    parse_training,
)

TOP_KEYS = ("name", "seed", "model", "training", "device_types", "device_groups", "network",
            "collectives", "space", "prices_per_gpu_hour", "objective", "budget")
REQUIRED_KEYS = ("name", "model", "training", "device_groups")
SPACE_KEYS = ("tp", "pp_min", "pp_max", "schedules", "virtual_stages", "micro_batch", "recompute",
              "zero_stage", "sequence_parallel", "resharding", "mix_types", "idle_groups",
              "layer_split", "shapes_per_group", "order")
BUDGET_KEYS = ("evaluations", "seconds", "wave")
# Schedules the search offers (interleaved: m a multiple of pp and at least v layers per stage,
# which the micro-batch and layer splits respect; docs/search.md).
SEARCH_SCHEDULES = ("1f1b", "gpipe", "zb_h1", "interleaved")
MAX_SHAPES_PER_GROUP = 4  # distinct replica shapes on one group (the space grows fast)
LAYER_SPLITS = ("balanced", "even")
OBJECTIVES = ("throughput", "cost")
DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_WAVE = 4  # simulations per branch-and-bound round (fixed, so results ignore --jobs)


@dataclass(frozen=True)
class Space:
    """The choices the search enumerates (see docs/search.md#space)."""

    tp: Mapping[str, tuple[int, ...]]  # device type -> TP degrees allowed (within a server)
    pp_min: int = 1
    pp_max: int = 8
    schedules: tuple[str, ...] = ("1f1b",)
    virtual_stages: tuple[int, ...] = (2,)  # model chunks per stage, with interleaved
    micro_batch: tuple[int, ...] = (1,)
    recompute: tuple[Recompute, ...] = ("none",)
    zero_stage: tuple[int, ...] = (0,)
    sequence_parallel: tuple[bool, ...] = (False,)
    resharding: tuple[Resharding, ...] = ("lcm",)
    mix_types: bool = False  # replicas whose stages sit on two device types
    idle_groups: bool = True  # a device group may be left out of the plan
    layer_split: tuple[str, ...] = ("balanced",)
    shapes_per_group: int = 1  # distinct replica shapes a group may be split into
    # rank placement of a part's replicas (plan/replicas.py UNIFORM_ORDERS): tp-pp-dp puts a
    # replica's stages on neighbouring devices, tp-dp-pp the pipeline outermost (Megatron)
    order: tuple[str, ...] = ("tp-pp-dp",)


@dataclass(frozen=True)
class Budget:
    """When the search stops: after ``evaluations`` simulations or ``seconds`` of wall time
    (None: no limit). ``wave``: simulations started together per round."""

    evaluations: int | None = None
    seconds: float | None = None
    wave: int = DEFAULT_WAVE


@dataclass(frozen=True)
class SearchSpec:
    """A validated search spec. ``training.global_batch`` is the first of ``global_batches``."""

    name: str
    seed: int
    model: ModelSpec
    training: TrainingSpec
    global_batches: tuple[int, ...]
    device_types: dict[str, DeviceType]
    device_groups: tuple[DeviceGroup, ...]
    network: NetworkSpec
    collectives: CollectivesSpec
    space: Space
    prices_per_gpu_hour: dict[str, float] = field(default_factory=dict)
    objective: str = "throughput"
    budget: Budget = field(default_factory=Budget)
    raw: dict[str, Any] = field(default_factory=dict, compare=False)  # the YAML as read
    base_dir: str | None = None  # for relative profile paths


def load_search_spec(path_or_text: str | os.PathLike[str]) -> SearchSpec:
    """Read and validate a search spec from a ``.yaml`` file or YAML text."""
    text_in = str(path_or_text)
    if isinstance(path_or_text, os.PathLike) or ("\n" not in text_in and ":" not in text_in) \
            or text_in.endswith((".yaml", ".yml")):
        p = Path(path_or_text)
        data = parse_yaml(read_plan_file(p), str(p))
        return spec_from_dict(data, base_dir=str(p.resolve().parent), source=str(p))
    return spec_from_dict(parse_yaml(text_in))


def _item(v: Any, i: int) -> tuple[Mapping[str, Any], str]:
    """Item ``i`` of a YAML list as (mapping, key) for the field readers, whose messages
    then name it ``path[i]``."""
    return cast(Mapping[str, Any], {i: v}), cast(str, i)


T = TypeVar("T")


def _values(m: Mapping[str, Any], key: str, path: str, default: tuple[T, ...],
            read: Callable[[Mapping[str, Any], str, str], T], what: str, ordered: bool
            ) -> tuple[T, ...]:
    """One value (``read`` checks it) or a non-empty list of them, duplicates dropped: sorted,
    or in the order written (``ordered``). ``what`` names the values for the empty-list error."""
    if key not in m:
        return default
    v = m[key]
    if not isinstance(v, list):
        return (read(m, key, path),)
    where = f.join(path, key)
    if not v:
        raise PlanError(where, f"expected a non-empty list of {what} (got [])")
    got = [read(*_item(x, i), where) for i, x in enumerate(v)]
    return tuple(dict.fromkeys(got)) if ordered else tuple(sorted(set(got)))  # type: ignore[type-var]


def _int_list(m: Mapping[str, Any], key: str, path: str, default: tuple[int, ...],
              maximum: int = lim.MAX_BATCH) -> tuple[int, ...]:
    """A positive integer or a non-empty list of them (sorted, duplicates dropped)."""
    return _values(m, key, path, default,
                   lambda mm, k, p: f.get_int(mm, k, p, maximum=maximum),
                   "positive integers", ordered=False)


def _enum_list(m: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...],
               default: tuple[str, ...]) -> tuple[str, ...]:
    """One of ``choices`` or a non-empty list of them (order kept, duplicates dropped)."""
    return _values(m, key, path, default, lambda mm, k, p: f.get_enum(mm, k, p, choices),
                   ", ".join(choices), ordered=True)


def _bool_list(m: Mapping[str, Any], key: str, path: str, default: tuple[bool, ...]
               ) -> tuple[bool, ...]:
    """``true``, ``false`` or a non-empty list of them (order kept, duplicates dropped)."""
    return _values(m, key, path, default, f.get_bool, "true / false", ordered=True)


def _zero_list(m: Mapping[str, Any], key: str, path: str, default: tuple[int, ...]
               ) -> tuple[int, ...]:
    """A ZeRO stage 0..3 or a non-empty list of them (sorted, duplicates dropped)."""
    return _values(m, key, path, default,
                   lambda mm, k, p: f.get_int_in(mm, k, p, range(4), None),
                   "ZeRO stages 0..3", ordered=False)


def _parse_space(value: Any, path: str, training_raw: Mapping[str, Any],
                 training: TrainingSpec, groups: tuple[DeviceGroup, ...], layers: int) -> Space:
    m = f.expect_mapping(value if value is not None else {}, path)
    f.check_keys(m, path, SPACE_KEYS)
    types = sorted({g.type for g in groups})
    tp: dict[str, tuple[int, ...]] = {}
    tpv = m.get("tp", list(DEFAULT_TP))
    if isinstance(tpv, Mapping):
        f.check_keys(tpv, f.join(path, "tp"), types)
        for t in types:
            tp[t] = _int_list(tpv, t, f.join(path, "tp"), DEFAULT_TP, maximum=lim.MAX_DEVICES)
    else:
        one = _int_list(m, "tp", path, DEFAULT_TP, maximum=lim.MAX_DEVICES)
        tp = {t: one for t in types}
    pp_min = f.get_int(m, "pp_min", path, 1, maximum=layers, limit="the model's layers")
    pp_max = f.get_int(m, "pp_max", path, min(8, layers), maximum=layers,
                       limit="the model's layers")
    if pp_max < pp_min:
        raise PlanError(f.join(path, "pp_max"), f"expected at least pp_min = {pp_min} "
                                                f"(got {pp_max})")

    def from_training(key: str) -> Any:  # a single value written under training
        return (training_raw[key],) if key in training_raw else None

    sched_default = from_training("schedule") or ("1f1b",)
    for s in sched_default:
        if s not in SEARCH_SCHEDULES:
            raise PlanError("training.schedule", f"expected one of {', '.join(SEARCH_SCHEDULES)} "
                                                 f"in a search spec (got {f.got(s)})")
    rec_default = from_training("recompute") or ("none",)
    rec_default = tuple("full" if r is True else "none" if r is False else r
                        for r in rec_default)  # older plans write recompute: true / false
    mb_default = from_training("micro_batch") or (1,)
    v_default = (training.virtual_stages,) if training.virtual_stages > 1 else (2,)
    virtual = _int_list(m, "virtual_stages", path, v_default, maximum=layers)
    if min(virtual) < 2:
        raise PlanError(f.join(path, "virtual_stages"),
                        f"expected model chunks per stage of at least 2 (got {list(virtual)})")
    kinds = f.get_int(m, "shapes_per_group", path, 1, maximum=MAX_SHAPES_PER_GROUP,
                      limit="the shapes one group may mix")
    return Space(
        tp=tp,
        pp_min=pp_min,
        pp_max=pp_max,
        schedules=_enum_list(m, "schedules", path, SEARCH_SCHEDULES, sched_default),
        virtual_stages=virtual,
        micro_batch=_int_list(m, "micro_batch", path, mb_default),
        recompute=_enum_list(m, "recompute", path, get_args(Recompute),
                             rec_default),  # type: ignore[arg-type]
        zero_stage=_zero_list(m, "zero_stage", path, (training.zero_stage,)),
        sequence_parallel=_bool_list(m, "sequence_parallel", path,
                                     (training.sequence_parallel,)),
        resharding=_enum_list(m, "resharding", path, get_args(Resharding),
                              ("lcm",)),  # type: ignore[arg-type]
        mix_types=f.get_bool(m, "mix_types", path, False),
        idle_groups=f.get_bool(m, "idle_groups", path, True),
        layer_split=_enum_list(m, "layer_split", path, LAYER_SPLITS, ("balanced",)),
        shapes_per_group=kinds,
        order=_enum_list(m, "order", path, UNIFORM_ORDERS, ("tp-pp-dp",)),
    )


def _parse_budget(value: Any, path: str) -> Budget:
    m = f.expect_mapping(value if value is not None else {}, path)
    f.check_keys(m, path, BUDGET_KEYS)
    ev = f.get_int(m, "evaluations", path) if "evaluations" in m else None
    sec = f.get_number(m, "seconds", path) if "seconds" in m else None
    return Budget(evaluations=ev, seconds=sec,
                  wave=f.get_int(m, "wave", path, DEFAULT_WAVE, maximum=1024, limit="a round"))


def _parse_prices(value: Any, path: str, groups: tuple[DeviceGroup, ...]) -> dict[str, float]:
    if value is None:
        return {}
    m = f.expect_mapping(value, path)
    types = sorted({g.type for g in groups})
    f.check_keys(m, path, types)
    if m:
        for t in types:
            if t not in m:
                first = next(iter(m))
                raise PlanError(f.join(path, t), f"required because {first} has a price "
                                                 "(got nothing)")
    return {t: f.get_number(m, t, path) for t in types if t in m}


def _check_micro_batches(mbs: tuple[int, ...], gbs: tuple[int, ...], path: str) -> None:
    """Every micro-batch size divides some global batch, and every global batch has a size
    that divides it (docs/search.md): else a value searches nothing (PlanError at ``path``)."""
    for mb in mbs:
        if not any(gb % mb == 0 for gb in gbs):
            raise PlanError(path, f"each size must divide a global batch "
                                  f"({', '.join(map(str, gbs))}); {mb} divides none")
    for gb in gbs:
        if not any(gb % mb == 0 for mb in mbs):
            raise PlanError("training.global_batch", f"{gb}: no micro-batch size of {path} "
                            f"({', '.join(map(str, mbs))}) divides it")


def spec_from_dict(d: Any, base_dir: str | None = None, source: str | None = None) -> SearchSpec:
    """A search spec as plain data -> SearchSpec (every error names its YAML path; ``source``:
    the file, named when it is a plan or another kind of file)."""
    if d is None:
        raise PlanError("", "the search spec is empty: expected a mapping with keys "
                            f"{', '.join(REQUIRED_KEYS)} (got nothing)")
    check_kind(d, SEARCH_SPEC, source)
    m = f.expect_mapping(d, "")
    f.check_keys(m, "", TOP_KEYS, REQUIRED_KEYS)
    m = {k: ({} if v is None and k in ("device_types", "network", "collectives", "space",
                                       "budget") else v) for k, v in m.items()}
    name = f.check_name(m["name"], "name", "search name")
    seed = f.get_int(m, "seed", "", 0, minimum=0)
    model = parse_model(m["model"], "model", _model_presets())
    traw = dict(f.expect_mapping(m["training"], "training"))
    gbs = _int_list(traw, "global_batch", "training", ())
    if not gbs:
        raise PlanError("training.global_batch", "required key is missing")
    probe = {k: v for k, v in traw.items() if k not in ("global_batch", "micro_batch")}
    if probe.get("schedule") == "interleaved" and "virtual_stages" not in probe:
        probe["virtual_stages"] = 2  # the space's default; space.virtual_stages may say more
    training = parse_training({**probe, "global_batch": gbs[0], "micro_batch": 1}, "training")
    defined = _parse_device_types(m.get("device_types", {}), base_dir)
    known = {**_device_presets(), **defined}
    groups = parse_groups(m["device_groups"], "device_groups", known)
    network = parse_network(m.get("network", {}), "network")
    collectives = parse_collectives(m.get("collectives", {}), "collectives")
    used = {g.type: known[g.type] for g in groups}
    training = settle_precision(traw, training, model, used)
    space = _parse_space(m.get("space"), "space", traw, training, groups, model.layers)
    _check_micro_batches(space.micro_batch, gbs,
                         "space.micro_batch" if "micro_batch" in (m.get("space") or {})
                         else "training.micro_batch")
    for t, tps in space.tp.items():
        gpn = max(g.domain_gpus for g in groups if g.type == t)  # a server or an NVL rack
        unit = ("server" if all(g.domain_nodes == 1 for g in groups if g.type == t)
                else "NVLink domain")
        if not any(gpn % x == 0 for x in tps):
            per_type = isinstance((m.get("space") or {}).get("tp"), Mapping)
            raise PlanError(f"space.tp.{t}" if per_type else "space.tp",
                            f"expected a TP degree dividing the {gpn} GPUs of one {t} {unit} "
                            f"(got {list(tps)})")
    prices = _parse_prices(m.get("prices_per_gpu_hour"), "prices_per_gpu_hour", groups)
    objective = f.get_enum(m, "objective", "", OBJECTIVES, "throughput")
    if objective == "cost" and not prices:
        raise PlanError("objective", "expected prices_per_gpu_hour for objective cost "
                                     "(got no prices)")
    return SearchSpec(
        name=name, seed=seed, model=model, training=training, global_batches=gbs,
        device_types=used, device_groups=groups, network=network, collectives=collectives,
        space=space, prices_per_gpu_hour=prices, objective=objective,
        budget=_parse_budget(m.get("budget"), "budget"), raw=dict(d), base_dir=base_dir,
    )


def plan_base(spec: SearchSpec) -> dict[str, Any]:
    """The plan sections every candidate shares, as plain data (what a plan YAML holds)."""
    raw = spec.raw
    out: dict[str, Any] = {"model": raw["model"], "training": dict(raw["training"])}
    for key in ("device_types", "device_groups", "network", "collectives"):
        if raw.get(key):
            out[key] = raw[key]
    return out


def with_training(spec: SearchSpec, **changes: Any) -> TrainingSpec:
    """``spec.training`` with ``changes`` (global_batch, micro_batch, schedule, recompute)."""
    return dataclasses.replace(spec.training, **changes)
