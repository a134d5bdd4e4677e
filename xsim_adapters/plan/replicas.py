"""Device groups and the replica/stage mapping: shorthands, placement checks, layers, batch split.

The ``replicas:`` section is first read into raw stages (each remembering the YAML path it came
from, so every later error can name it), then checked in this order: group and device range,
TP degree, TP against the model and the scale-up domain, devices used twice, layer ranges
(after ``auto_layers`` resolution), and finally the micro-batch split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import PlanError
from . import _fields as f
from . import limits as lim
from .layout import apportion, even_split, ranges_from_counts, stage_speed
from .model import DeviceGroup, DeviceType, ModelSpec, Replica, ScaleUp, Stage, TrainingSpec
from .parallel import check_cp_uniform, check_groups, check_stage_ep_cp
from .server import check_nvlink_domain, check_server, parse_server

GROUP_KEYS = ("type", "nodes", "gpus_per_node")
GROUP_OPTIONAL_KEYS = ("nic_gbps", "server", "nvlink_domain_gpus")
STAGE_KEYS = ("group", "devices", "tp", "layers", "ep", "cp", "etp")
REPLICA_KEYS = ("stages", "auto_layers", "batch_share", "micro_batches")
UNIFORM_KEYS = ("group", "tp", "pp", "dp", "devices", "batch_share", "micro_batches", "ep", "cp",
                "etp", "order")
# Device order of the uniform shorthand, innermost first: "tp-pp-dp" puts a replica's stages on
# neighbouring devices (the default); "tp-dp-pp" puts the pipeline outermost, as Megatron-Core's
# default rank order "tp-cp-ep-dp-pp" does (parallel_state.RankGenerator): a stage's DP, CP and
# EP peers are neighbours (one server when they fit) and the pipeline crosses servers.
UNIFORM_ORDERS = ("tp-pp-dp", "tp-dp-pp")
AUTO_LAYERS = ("by_compute",)
SHARE_TOLERANCE = 1e-6


def parse_groups(
    value: Any, path: str, known_types: Mapping[str, DeviceType]
) -> tuple[DeviceGroup, ...]:
    """The ``device_groups:`` mapping (YAML order kept) -> DeviceGroups."""
    m = f.expect_mapping(value, path)
    if not m:
        raise PlanError(path, "expected at least one device group (got {})")
    groups = []
    folded: dict[str, str] = {}  # lower-case name -> name: group files must differ on any disk
    devices = 0
    for name, entry in m.items():
        gpath = f.join(path, name)
        f.check_name(name, gpath, "device group name")
        if name.lower() in folded:
            raise PlanError(
                gpath,
                f"expected a group name that differs from {folded[name.lower()]} in more than "
                f"letter case (each group is one file, and some file systems ignore case) "
                f"(got {f.got(name)})",
            )
        folded[name.lower()] = name
        g = f.expect_mapping(entry, gpath)
        f.check_keys(g, gpath, GROUP_KEYS + GROUP_OPTIONAL_KEYS, GROUP_KEYS)
        f.note(f.join(gpath, "type"), {"type": "string"})  # a preset or device_types name
        typ = g["type"]
        if not isinstance(typ, str) or typ not in known_types:
            raise PlanError(
                f.join(gpath, "type"),
                f"unknown device type; expected one of {', '.join(sorted(known_types))} "
                f"(got {f.got(typ)})",
            )
        limit = "MAX_DEVICES, docs/plan.md#limits"
        group = DeviceGroup(
            name=name,
            type=typ,
            nodes=f.get_int(g, "nodes", gpath, maximum=lim.MAX_DEVICES, limit=limit),
            gpus_per_node=f.get_int(g, "gpus_per_node", gpath, maximum=lim.MAX_DEVICES,
                                    limit=limit),
            nic_gbps=(f.get_number(g, "nic_gbps", gpath) if "nic_gbps" in g else None),
            server=(parse_server(g["server"], f.join(gpath, "server"))
                    if g.get("server") is not None else None),
            nvlink_domain_gpus=(f.get_int(g, "nvlink_domain_gpus", gpath, maximum=lim.MAX_DEVICES,
                                          limit=limit) if "nvlink_domain_gpus" in g else 0),
        )
        spec = group.server if group.server is not None else known_types[typ].server
        if group.server is not None:
            check_server(group.server, group.gpus_per_node, f.join(gpath, "server"), name)
        else:
            check_server(known_types[typ].server, group.gpus_per_node,
                         f.join(f.join("device_types", typ), "server"), name)
        if group.nvlink_domain_gpus:
            check_nvlink_domain(group.nvlink_domain_gpus, group.gpus_per_node, spec,
                                f.join(gpath, "nvlink_domain_gpus"))
        devices += group.num_devices
        if devices > lim.MAX_DEVICES:
            raise PlanError(
                gpath,
                f"expected at most {lim.MAX_DEVICES:,} devices in all groups together "
                f"(MAX_DEVICES, docs/plan.md#limits); this group brings the total to "
                f"{devices:,} (got nodes {group.nodes} x gpus_per_node {group.gpus_per_node})",
            )
        groups.append(group)
    return tuple(groups)


@dataclass
class _Stage:
    group: str
    devices: tuple[int, int]
    tp: int
    layers: tuple[int, int] | None
    path: str
    field_paths: dict[str, str] = field(default_factory=dict)
    ep: int = 1
    cp: int = 1
    etp: int = 1

    def fp(self, name: str) -> str:
        return self.field_paths.get(name, f.join(self.path, name))


@dataclass
class _Replica:
    stages: list[_Stage]
    path: str
    auto_layers: str | None = None
    batch_share: float | None = None
    micro_batches: int | None = None


@dataclass
class _Context:
    model: ModelSpec
    training: TrainingSpec
    groups: dict[str, DeviceGroup]
    types: Mapping[str, DeviceType]
    scale_up: ScaleUp


def parse_replicas(
    value: Any,
    path: str,
    model: ModelSpec,
    training: TrainingSpec,
    groups: Sequence[DeviceGroup],
    types: Mapping[str, DeviceType],
    scale_up: ScaleUp,
) -> tuple[Replica, ...]:
    """The ``replicas:`` section -> validated Replicas with layers and micro-batches resolved."""
    ctx = _Context(model, training, {g.name: g for g in groups}, types, scale_up)
    raw: list[_Replica] = []
    if isinstance(value, Mapping):
        f.check_keys(value, path, ("uniform",), ("uniform",))
        raw.extend(_expand_uniform(value["uniform"], f.join(path, "uniform"), ctx))
    else:
        items = f.expect_list(value, path)
        if not items:
            raise PlanError(path, "expected at least one replica (got [])")
        for i, item in enumerate(items):
            ipath = f.join(path, i)
            im = f.expect_mapping(item, ipath)
            if "uniform" in im:
                f.check_keys(im, ipath, ("uniform",))
                raw.extend(_expand_uniform(im["uniform"], f.join(ipath, "uniform"), ctx))
            else:
                raw.append(_parse_replica(im, ipath, ctx))
    _check_devices_unique(raw, ctx)
    for rep in raw:
        if rep.auto_layers:
            _auto_layers(rep, ctx)
        _check_layers(rep, ctx.model)
    cp = check_cp_uniform(raw)
    if cp > 1:  # a CP group's replicas split each sequence: they share micro-batches
        reps = raw[::cp]
        counts = [n for n in _split_batch(reps, ctx, path) for _ in range(cp)]
    else:
        counts = _split_batch(raw, ctx, path)
    check_groups(raw, counts)
    if training.schedule == "interleaved":
        _check_interleaving(raw, counts, training.virtual_stages)
    return tuple(
        Replica(
            stages=tuple(Stage(s.group, s.devices, s.tp, s.layers, s.ep, s.cp, s.etp)  # type: ignore[arg-type]
                         for s in rep.stages),
            micro_batches=n,
            batch_share=rep.batch_share,
        )
        for rep, n in zip(raw, counts, strict=True)
    )


def _parse_replica(m: Mapping[str, Any], path: str, ctx: _Context) -> _Replica:
    f.check_keys(m, path, REPLICA_KEYS, ("stages",))
    auto = f.get_enum(m, "auto_layers", path, AUTO_LAYERS, None) if "auto_layers" in m else None
    stages_v = f.expect_list(m["stages"], f.join(path, "stages"))
    if not stages_v:
        raise PlanError(f.join(path, "stages"), "expected at least one stage (got [])")
    stages = []
    for j, sv in enumerate(stages_v):
        spath = f.join(f.join(path, "stages"), j)
        sm = f.expect_mapping(sv, spath)
        f.check_keys(sm, spath, STAGE_KEYS, ("group", "devices"))
        group = _group_of(sm["group"], f.join(spath, "group"), ctx)
        devices = _device_range(sm, spath, group)
        count = devices[1] - devices[0]
        tp = f.get_int(sm, "tp", spath, count)
        if tp != count:
            raise PlanError(
                f.join(spath, "tp"), f"must equal the stage's {count} devices (got {tp})"
            )
        layers = None
        if auto is not None:
            if "layers" in sm:
                raise PlanError(
                    f.join(spath, "layers"),
                    f"must be omitted when {f.join(path, 'auto_layers')} is {auto} "
                    f"(got {f.got(sm['layers'])})",
                )
        else:
            if "layers" not in sm:
                raise PlanError(f.join(spath, "layers"), "required key is missing")
            layers = f.get_range(sm, "layers", spath)
        st = _Stage(group.name, devices, tp, layers, spath, ep=f.get_int(sm, "ep", spath, 1),
                    cp=f.get_int(sm, "cp", spath, 1), etp=f.get_int(sm, "etp", spath, 1))
        _check_tp(st, ctx)
        stages.append(st)
    share, mbs = _replica_batch_fields(m, path)
    return _Replica(stages, path, auto, share, mbs)


def _replica_batch_fields(m: Mapping[str, Any], path: str) -> tuple[float | None, int | None]:
    if "batch_share" in m and "micro_batches" in m:
        raise PlanError(
            f.join(path, "micro_batches"),
            "expected either batch_share or micro_batches, not both "
            f"(got {f.got(m['micro_batches'])})",
        )
    share = f.get_number(m, "batch_share", path, at_most=1.0) if "batch_share" in m else None
    mbs = (
        f.get_int(m, "micro_batches", path, maximum=lim.MAX_BATCH, limit="MAX_BATCH")
        if "micro_batches" in m
        else None
    )
    return share, mbs


def _group_of(name: Any, path: str, ctx: _Context) -> DeviceGroup:
    f.note(path, {"type": "string"})  # a device_groups name
    if not isinstance(name, str) or name not in ctx.groups:
        raise PlanError(
            path,
            f"unknown device group; expected one of {', '.join(ctx.groups)} (got {f.got(name)})",
        )
    return ctx.groups[name]


def _device_range(m: Mapping[str, Any], path: str, group: DeviceGroup) -> tuple[int, int]:
    a, b = f.get_range(m, "devices", path)
    n = group.num_devices
    if not a < b <= n:
        raise PlanError(
            f.join(path, "devices"),
            f"expected [start, stop) with 0 <= start < stop <= {n}, the devices of group "
            f"{group.name} (got [{a}, {b}])",
        )
    return a, b


def _check_tp(st: _Stage, ctx: _Context) -> None:
    """TP must split the heads and the FFN evenly, and stay in one server if so required."""
    for what, n in (
        ("attention heads", ctx.model.heads),
        ("ffn_hidden size", ctx.model.ffn_hidden),
    ):
        if n % st.tp:
            raise PlanError(st.fp("tp"), f"must divide the model's {n} {what} (got {st.tp})")
    if ctx.model.vocab < st.tp:  # the output layer gives each TP rank vocab / tp logits
        raise PlanError(st.fp("tp"), f"must be at most the model's vocabulary of "
                                     f"{ctx.model.vocab} (each TP rank holds a slice of it) "
                                     f"(got {st.tp})")
    check_stage_ep_cp(st, ctx.model, ctx.training)
    g = ctx.groups[st.group]
    # the NVLink domain: a server, or the trays of an NVL rack (nvlink_domain_gpus)
    per = g.domain_gpus
    first, last = st.devices[0] // per, (st.devices[1] - 1) // per
    if first != last and not ctx.scale_up.tp_across_nodes:
        where = "servers" if per == g.gpus_per_node else "NVLink domains"
        raise PlanError(
            st.fp("devices"),
            f"TP group spans {where} {first}..{last} of group {g.name} ({per} GPUs "
            f"per {where[:-1]}) but network.scale_up.tp_across_nodes is false "
            f"(got [{st.devices[0]}, {st.devices[1]}])",
        )


def _expand_uniform(value: Any, path: str, ctx: _Context) -> list[_Replica]:
    """``{group, tp, pp, dp, devices, order}`` -> dp identical replicas.

    ``order: tp-pp-dp`` (default): replica r takes devices ``[start + r*pp*tp, start +
    (r+1)*pp*tp)``, its stage s the ``tp`` devices ``s*tp`` on from there. ``order: tp-dp-pp``
    (Megatron-Core's order): stage s of replica r takes the ``tp`` devices from ``start +
    (s*dp + r)*tp``. Layers are split evenly, the remainder to the earliest stages.
    """
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, UNIFORM_KEYS, ("group",))
    group = _group_of(m["group"], f.join(path, "group"), ctx)
    a, b = _device_range(m, path, group) if "devices" in m else (0, group.num_devices)
    tp = f.get_int(m, "tp", path, 1)
    pp = f.get_int(m, "pp", path, 1)
    if pp > ctx.model.layers:
        raise PlanError(
            f.join(path, "pp"),
            f"expected at most the model's {ctx.model.layers} layers (got {pp})",
        )
    if tp * pp > b - a:
        raise PlanError(
            f.join(path, "pp"),
            f"tp {tp} x pp {pp} needs {tp * pp} devices but devices [{a}, {b}) of group "
            f"{group.name} hold {b - a} (got {pp})",
        )
    dp = f.get_int(m, "dp", path, (b - a) // (tp * pp))
    if dp * pp * tp > b - a:
        raise PlanError(
            f.join(path, "dp"),
            f"dp {dp} x pp {pp} x tp {tp} needs {dp * pp * tp} devices but devices [{a}, {b}) "
            f"of group {group.name} hold {b - a} (got {dp})",
        )
    share, mbs = _replica_batch_fields(m, path)
    ep, cp = f.get_int(m, "ep", path, 1), f.get_int(m, "cp", path, 1)
    etp = f.get_int(m, "etp", path, 1)
    pipeline_outermost = f.get_enum(m, "order", path, UNIFORM_ORDERS, "tp-pp-dp") == "tp-dp-pp"
    layer_ranges = ranges_from_counts(even_split(ctx.model.layers, pp))
    paths = {"tp": f.join(path, "tp"), "devices": path, "layers": f.join(path, "pp"),
             "ep": f.join(path, "ep"), "cp": f.join(path, "cp"), "etp": f.join(path, "etp")}
    out = []
    for r in range(dp):
        stages = []
        for s in range(pp):
            lo = a + ((s * dp + r) if pipeline_outermost else (r * pp + s)) * tp
            st = _Stage(group.name, (lo, lo + tp), tp, layer_ranges[s], path, dict(paths), ep, cp,
                        etp)
            _check_tp(st, ctx)
            stages.append(st)
        out.append(_Replica(stages, path, None, share, mbs))
    return out


def _check_devices_unique(raw: Sequence[_Replica], ctx: _Context) -> None:
    owner: dict[tuple[str, int], str] = {}
    for rep in raw:
        for st in rep.stages:
            for d in range(*st.devices):
                prev = owner.get((st.group, d))
                if prev is not None:
                    raise PlanError(
                        st.fp("devices"),
                        f"device {d} of group {st.group} is already used by {prev} "
                        f"(got [{st.devices[0]}, {st.devices[1]}])",
                    )
                owner[(st.group, d)] = st.path


def _auto_layers(rep: _Replica, ctx: _Context) -> None:
    """Split the model's layers over the stages in proportion to tp * peak * efficiency."""
    n = ctx.model.layers
    if len(rep.stages) > n:
        raise PlanError(
            f.join(rep.path, "auto_layers"),
            f"needs at least one layer per stage, but {len(rep.stages)} stages share the "
            f"model's {n} layers (got {f.got(rep.auto_layers)})",
        )
    speeds = [stage_speed(ctx.types[ctx.groups[s.group].type], s.tp) for s in rep.stages]
    for st, rng in zip(rep.stages, ranges_from_counts(apportion(n, speeds)), strict=True):
        st.layers = rng


def _check_layers(rep: _Replica, model: ModelSpec) -> None:
    """Stage layer ranges must tile [0, model.layers) in order, each non-empty."""
    prev: _Stage | None = None
    for st in rep.stages:
        assert st.layers is not None
        a, b = st.layers
        here, shown = st.fp("layers"), f"(got [{a}, {b}])"
        if a >= b:
            raise PlanError(here, f"expected a non-empty range [start, stop) {shown}")
        if b > model.layers:
            raise PlanError(
                here, f"expected a range within the model's {model.layers} layers {shown}"
            )
        if prev is None:
            if a != 0:
                raise PlanError(here, f"the first stage must start at layer 0 {shown}")
        else:
            pa, pb = prev.layers  # type: ignore[misc]
            if a < pb:
                raise PlanError(here, f"overlaps {prev.path} (layers [{pa}, {pb})) {shown}")
            if a > pb:
                raise PlanError(
                    here, f"leaves layers [{pb}, {a}) unassigned after {prev.path} {shown}"
                )
        prev = st
    assert prev is not None and prev.layers is not None
    if prev.layers[1] != model.layers:
        raise PlanError(
            prev.fp("layers"),
            f"the last stage must end at the model's {model.layers} layers "
            f"(got [{prev.layers[0]}, {prev.layers[1]}])",
        )


def _check_interleaving(raw: Sequence[_Replica], counts: Sequence[int], v: int) -> None:
    """Megatron's interleaved schedule: m a multiple of pp, at least v layers per stage.

    Replicas of one stage have no pipeline to interleave and run as plain 1F1B.
    """
    for rep, m in zip(raw, counts, strict=True):
        pp = len(rep.stages)
        if pp < 2:
            continue
        if m % pp:
            explicit = rep.micro_batches is not None
            where = f.join(rep.path, "micro_batches") if explicit else rep.path
            how = "" if explicit else "the batch split gave it "
            raise PlanError(
                where,
                f"expected micro-batches a multiple of the replica's {pp} pipeline stages with "
                f"training.schedule interleaved (Megatron requires it) (got {how}{m})",
            )
        for st in rep.stages:
            assert st.layers is not None
            n = st.layers[1] - st.layers[0]
            if n < v:
                raise PlanError(
                    st.fp("layers"),
                    f"expected at least training.virtual_stages = {v} layers per stage, one per "
                    f"model chunk (got {n} in [{st.layers[0]}, {st.layers[1]}))",
                )


def _split_batch(raw: Sequence[_Replica], ctx: _Context, path: str) -> list[int]:
    """Micro-batches per replica: explicit counts, shares, or in proportion to replica speed."""
    t = ctx.training
    total = t.total_micro_batches
    if total < len(raw):
        raise PlanError(
            "training.global_batch",
            f"expected at least one micro-batch per replica: global_batch / micro_batch = "
            f"{total} micro-batches for {len(raw)} replicas (got {t.global_batch})",
        )
    for key in ("batch_share", "micro_batches"):
        setters = [r for r in raw if getattr(r, key) is not None]
        if setters and len(setters) != len(raw):
            missing = next(r for r in raw if getattr(r, key) is None)
            raise PlanError(
                f.join(missing.path, key),
                f"required because {setters[0].path} sets one (got nothing)",
            )
    if raw[0].micro_batches is not None:
        counts = [r.micro_batches for r in raw]
        if sum(counts) != total:  # type: ignore[arg-type]
            raise PlanError(
                path,
                f"expected micro_batches summing to global_batch / micro_batch = {total} "
                f"(got {sum(counts)})",  # type: ignore[arg-type]
            )
        return counts  # type: ignore[return-value]
    if raw[0].batch_share is not None:
        shares = [r.batch_share for r in raw]
        s = sum(shares)  # type: ignore[arg-type]
        if abs(s - 1.0) > SHARE_TOLERANCE:
            raise PlanError(
                path, f"expected batch_share values summing to 1 within 1e-6 (got {round(s, 9)!r})"
            )
        return apportion(total, shares)  # type: ignore[arg-type]
    speeds = []
    for r in raw:
        speeds.append(
            1.0
            / max(
                (s.layers[1] - s.layers[0])  # type: ignore[index]
                / stage_speed(ctx.types[ctx.groups[s.group].type], s.tp)
                for s in r.stages
            )
        )
    return apportion(total, speeds)
