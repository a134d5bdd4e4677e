"""Parsers for self-contained plan sections: model, training, device types, collectives (the
network section: :mod:`.network`).

Each ``parse_*`` takes the raw YAML value and its path and returns the section's dataclass, or
raises :class:`PlanError` naming the first field that is wrong. Cross-section checks (stages
against groups, layers against the model) live in :mod:`.replicas`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import warnings
from collections.abc import Mapping
from typing import Any, get_args

from ..errors import PlanError, PlanWarning
from . import _fields as f
from . import limits as lim
from .attention import parse_attention
from .model import (
    DTYPE_BYTES,
    Algorithm,
    AttentionSpec,
    CollectiveAlgorithms,
    CollectivesSpec,
    DeviceType,
    FSDPSpec,
    GradDtype,
    Granularity,
    MLASpec,
    ModelSpec,
    MoESpec,
    OverlapSpec,
    Precision,
    ProfileRow,
    Recompute,
    Resharding,
    RingOrder,
    Schedule,
    TrainingSpec,
)
from .moe import parse_moe
from .server import parse_server

MODEL_SHAPE_KEYS = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "seq_len", "vocab")
MODEL_KEYS = ("preset", "name", *MODEL_SHAPE_KEYS, "dtype", "gated_mlp", "moe", "attention",
              "mlp_bias")
DEVICE_NUMBER_KEYS = ("peak_tflops", "hbm_GB", "hbm_GBps", "scaleup_GBps", "nic_gbps")
# Optional per-precision peaks (TFLOP/s, 0 = the part has no such unit) and model constants.
DEVICE_PEAK_KEYS = ("fp32_tflops", "tf32_tflops", "fp8_tflops", "fp4_tflops")
DEVICE_KEYS = (
    *DEVICE_NUMBER_KEYS,
    *DEVICE_PEAK_KEYS,
    "efficiency",
    "hbm_efficiency",
    "fp8_efficiency",
    "bf16",
    "sm_count",
    "compute_capability",
    "nvls",
    "pcie_p2p",
    "burst_clock_MHz",
    "sustained_clock_MHz",
    "profile",
    "source",
    "server",
)
PROFILE_COLUMNS = ("tp", "micro_batch", "seq_len", "fwd_layer_us", "bwd_layer_us")
TRAINING_KEYS = tuple(x.name for x in dataclasses.fields(TrainingSpec))
OPTIMIZERS = ("adam",)
# Upper bounds of the model's integers, with the reason shown when one is exceeded.
MODEL_MAXIMA = {
    "layers": (lim.MAX_LAYERS, "the trace's int16 layer columns"),
    "hidden": (lim.MAX_HIDDEN, "MAX_HIDDEN, docs/plan.md#limits"),
    "ffn_hidden": (lim.MAX_FFN_HIDDEN, "MAX_FFN_HIDDEN, docs/plan.md#limits"),
    "heads": (lim.MAX_HIDDEN, "MAX_HIDDEN, docs/plan.md#limits"),
    "kv_heads": (lim.MAX_HIDDEN, "MAX_HIDDEN, docs/plan.md#limits"),
    "seq_len": (lim.MAX_SEQ_LEN, "MAX_SEQ_LEN, docs/plan.md#limits"),
    "vocab": (lim.MAX_VOCAB, "MAX_VOCAB, docs/plan.md#limits"),
}
_BATCH = "MAX_BATCH, docs/plan.md#limits"


# ---------------------------------------------------------------- model


def parse_model(
    value: Any, path: str, presets: Mapping[str, ModelSpec], extra_keys: tuple[str, ...] = ()
) -> ModelSpec:
    """A preset name, or a mapping (optionally ``preset:`` plus overrides) -> ModelSpec."""
    if isinstance(value, str):
        return _model_preset(value, path, presets)
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, (*MODEL_KEYS, *extra_keys))
    if "preset" in m:
        base = _model_preset(m["preset"], f.join(path, "preset"), presets)
        values: dict[str, Any] = dataclasses.asdict(base)
        required: tuple[str, ...] = ()
    else:
        values = {"name": "custom", "dtype": "bf16", "gated_mlp": True}
        required = tuple(k for k in MODEL_SHAPE_KEYS if k != "kv_heads")
    f.check_keys(m, path, (*MODEL_KEYS, *extra_keys), required)
    if "name" in m:
        values["name"] = f.get_str(m, "name", path)
    for key in MODEL_SHAPE_KEYS:
        if key in m:
            values[key] = f.get_int(m, key, path, maximum=MODEL_MAXIMA[key][0],
                                    limit=MODEL_MAXIMA[key][1])
    values.setdefault("kv_heads", values["heads"])  # no GQA unless asked for
    if "dtype" in m:
        values["dtype"] = f.get_enum(m, "dtype", path, DTYPE_BYTES)
    if "gated_mlp" in m:
        values["gated_mlp"] = f.get_bool(m, "gated_mlp", path)
    base_moe = values.get("moe")
    if isinstance(base_moe, dict):  # asdict() of a preset flattened it
        base_moe = MoESpec(**base_moe)
    values["moe"] = (
        parse_moe(m["moe"], f.join(path, "moe"), base_moe, values["layers"])
        if "moe" in m else base_moe
    )
    if "mlp_bias" in m:
        values["mlp_bias"] = f.get_bool(m, "mlp_bias", path)
    base_attn = values.get("attention")
    if isinstance(base_attn, dict):  # asdict() of a preset flattened it
        mla = base_attn.get("mla")
        base_attn = AttentionSpec(**{**base_attn, "mla": MLASpec(**mla) if mla else None})
    values["attention"] = (
        parse_attention(m["attention"], f.join(path, "attention"), base_attn, values["seq_len"])
        if "attention" in m else base_attn
    )
    own_width = values["attention"] is not None and (
        values["attention"].head_dim or values["attention"].mla is not None)
    if values["hidden"] % values["heads"] and not own_width:
        raise PlanError(
            f.join(path, "heads"),
            f"must divide the hidden size {values['hidden']} (got {values['heads']})",
        )
    if values["heads"] % values["kv_heads"]:
        raise PlanError(
            f.join(path, "kv_heads"),
            f"must divide the {values['heads']} attention heads (got {values['kv_heads']})",
        )
    return ModelSpec(**values)


def _model_preset(name: Any, path: str, presets: Mapping[str, ModelSpec]) -> ModelSpec:
    f.note(path, {"enum": sorted(presets)})
    if not isinstance(name, str) or name not in presets:
        raise PlanError(
            path,
            f"unknown model preset; expected one of {', '.join(sorted(presets))} "
            f"(got {f.got(name)})",
        )
    return presets[name]


# ---------------------------------------------------------------- training


def parse_training(value: Any, path: str) -> TrainingSpec:
    """The ``training:`` section -> TrainingSpec (batch divisibility and schedule checked here)."""
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, TRAINING_KEYS, ("global_batch", "micro_batch"))
    d = TrainingSpec(global_batch=1, micro_batch=1)  # defaults
    schedule = f.get_enum(m, "schedule", path, get_args(Schedule), d.schedule)
    spec = TrainingSpec(
        global_batch=f.get_int(m, "global_batch", path, maximum=lim.MAX_BATCH, limit=_BATCH),
        micro_batch=f.get_int(m, "micro_batch", path, maximum=lim.MAX_BATCH, limit=_BATCH),
        schedule=schedule,  # type: ignore[arg-type]
        optimizer=f.get_enum(m, "optimizer", path, OPTIMIZERS, d.optimizer),
        zero_stage=f.get_int_in(m, "zero_stage", path, range(4), d.zero_stage),
        recompute=_recompute(m, path, d.recompute),
        sequence_parallel=f.get_bool(m, "sequence_parallel", path, d.sequence_parallel),
        causal_attention_halving=f.get_bool(
            m, "causal_attention_halving", path, d.causal_attention_halving
        ),
        flash_attention=f.get_bool(m, "flash_attention", path, d.flash_attention),
        virtual_stages=_virtual_stages(m, path, schedule),
        overlap=_parse_overlap(m.get("overlap", {}), f.join(path, "overlap")),
        fsdp=_parse_fsdp(m, path),
        precision=f.get_enum(m, "precision", path, get_args(Precision), d.precision),  # type: ignore[arg-type]
        dropout=f.get_bool(m, "dropout", path, d.dropout),
        grad_reduce_dtype=f.get_enum(  # type: ignore[arg-type]
            m, "grad_reduce_dtype", path, get_args(GradDtype), d.grad_reduce_dtype),
        grad_accumulation_fusion=f.get_bool(
            m, "grad_accumulation_fusion", path, d.grad_accumulation_fusion),
    )
    if spec.global_batch % spec.micro_batch:
        raise PlanError(
            f.join(path, "global_batch"),
            f"must be divisible by training.micro_batch {spec.micro_batch} "
            f"(got {spec.global_batch})",
        )
    if spec.overlap.tp_comm and not spec.sequence_parallel:
        raise PlanError(
            f.join(f.join(path, "overlap"), "tp_comm"),
            "needs training.sequence_parallel: true (Megatron-Core overlaps only the "
            "sequence-parallel all-gather / reduce-scatter with the GEMMs) (got true)",
        )
    return spec


def _recompute(m: Mapping[str, Any], path: str, default: Recompute) -> Recompute:
    """``recompute``: none | selective | full; the booleans of older plans mean full / none."""
    if "recompute" not in m:
        return default
    f.note(f.join(path, "recompute"), {"type": "boolean"})  # older plans: true / false
    v = m["recompute"]
    if isinstance(v, bool):
        return "full" if v else "none"
    return f.get_enum(m, "recompute", path, get_args(Recompute))  # type: ignore[return-value]


def _virtual_stages(m: Mapping[str, Any], path: str, schedule: str) -> int:
    """Model chunks per stage: required (>= 2) with ``interleaved``, else absent or 1."""
    key = f.join(path, "virtual_stages")
    if schedule == "interleaved":
        if "virtual_stages" not in m:
            raise PlanError(key, "required with training.schedule interleaved (got nothing)")
        v = f.get_int(m, "virtual_stages", path)
        if v < 2:
            raise PlanError(
                key, f"must be at least 2 with training.schedule interleaved (got {v})"
            )
        return v
    v = f.get_int(m, "virtual_stages", path, 1)
    if v != 1:
        raise PlanError(
            key,
            f"must be 1 unless training.schedule is interleaved (schedule {schedule}) (got {v})",
        )
    return v


# FSDP prefetch beyond a few units only holds more gathered units in memory (FSDP2 and
# DeepSpeed default to 1); the bound keeps the dependency chains short
MAX_FSDP_PREFETCH = 8


def _parse_fsdp(m: Mapping[str, Any], path: str) -> FSDPSpec:
    """``training.fsdp`` (only with ``zero_stage: 3``). A ZeRO-3 plan without it gets one
    warning: stage 3 traced as stage 1 before (docs/plan.md#zero-and-fsdp)."""
    zero = m.get("zero_stage", 0)
    if "fsdp" not in m:
        if zero == 3:
            warnings.warn(PlanWarning(
                f"{f.join(path, 'zero_stage')}: 3 now gathers every unit's parameters before "
                "its forward and backward and reduce-scatters its gradients (FSDP); it traced "
                "as ZeRO-1 before (docs/plan.md#zero-and-fsdp)"), stacklevel=1)
        return FSDPSpec()
    fp = f.join(path, "fsdp")
    if zero != 3:
        raise PlanError(fp, f"needs training.zero_stage: 3 (got zero_stage {zero})")
    fm = f.expect_mapping(m["fsdp"], fp)
    d = FSDPSpec()
    f.check_keys(fm, fp, [x.name for x in dataclasses.fields(FSDPSpec)])
    return FSDPSpec(
        reshard_after_forward=f.get_bool(fm, "reshard_after_forward", fp,
                                         d.reshard_after_forward),
        prefetch=f.get_int(fm, "prefetch", fp, d.prefetch, maximum=MAX_FSDP_PREFETCH),
        hsdp_shard=f.get_int(fm, "hsdp_shard", fp, d.hsdp_shard, minimum=0,
                             maximum=lim.MAX_REPLICAS),
    )


def _parse_overlap(value: Any, path: str) -> OverlapSpec:
    om = f.expect_mapping(value, path)
    d = OverlapSpec()
    f.check_keys(om, path, [x.name for x in dataclasses.fields(OverlapSpec)])
    return OverlapSpec(
        tp_comm=f.get_bool(om, "tp_comm", path, d.tp_comm),
        dp_grad_reduce=f.get_bool(om, "dp_grad_reduce", path, d.dp_grad_reduce),
        param_gather=f.get_bool(om, "param_gather", path, d.param_gather),
    )


# ---------------------------------------------------------------- device types


def parse_device_type(
    value: Any, path: str, name: str, base: DeviceType | None, base_dir: str | None
) -> DeviceType:
    """One ``device_types`` entry: a full definition, or a partial override of ``base``."""
    m = f.expect_mapping(value, path)
    f.check_keys(m, path, DEVICE_KEYS, () if base else DEVICE_NUMBER_KEYS)
    values: dict[str, Any] = dataclasses.asdict(base) if base else {"name": name}
    if base:
        values["server"] = base.server  # asdict turned the nested spec into a dict
    if "server" in m:
        values["server"] = parse_server(m["server"], f.join(path, "server"))
    for key in DEVICE_NUMBER_KEYS:
        if key in m:
            values[key] = f.get_number(
                m, key, path, at_least=lim.MIN_RATE, at_most=lim.MAX_RATE
            )
    for key in DEVICE_PEAK_KEYS:  # 0: the part has no such unit
        if key in m:
            values[key] = f.get_number(m, key, path, positive=False, at_most=lim.MAX_RATE)
    for key in ("efficiency", "hbm_efficiency"):
        if key in m:
            values[key] = f.get_number(m, key, path, at_most=1.0)
    if "fp8_efficiency" in m:  # 0: not measured, fp8 GEMMs at `efficiency`
        values["fp8_efficiency"] = f.get_number(m, "fp8_efficiency", path, positive=False,
                                                at_most=1.0)
    if "bf16" in m:
        values["bf16"] = f.get_bool(m, "bf16", path)
    if "sm_count" in m:
        values["sm_count"] = f.get_int(m, "sm_count", path, minimum=0)
    if "compute_capability" in m:
        values["compute_capability"] = f.get_int(m, "compute_capability", path, minimum=0,
                                                 maximum=1000, limit="CUDA compute capability x 10")
    for key in ("nvls", "pcie_p2p"):
        if key in m:
            values[key] = f.get_bool(m, key, path)
    for key in ("burst_clock_MHz", "sustained_clock_MHz"):  # 0: unmeasured
        if key in m:
            values[key] = f.get_number(m, key, path, positive=False, at_most=lim.MAX_CLOCK_MHZ)
    if 0 < values.get("burst_clock_MHz", 0) < values.get("sustained_clock_MHz", 0):
        raise PlanError(f.join(path, "sustained_clock_MHz"),
                        f"must not exceed burst_clock_MHz ({values['burst_clock_MHz']:g}) "
                        f"(got {values['sustained_clock_MHz']:g})")
    if "source" in m:
        values["source"] = f.get_str(m, "source", path)
    if "profile" in m:
        values["profile"], values["profile_rows"] = read_profile(
            f.get_str(m, "profile", path), f.join(path, "profile"), base_dir
        )
    return DeviceType(**values)


MAX_PROFILE_BYTES = 1 << 20  # a profile CSV is a few hundred rows at most
# Upper bounds of profile cells: tp and micro_batch as in a plan, times as plan times.
_PROFILE_MAXIMA = {
    "tp": lim.MAX_DEVICES,
    "micro_batch": lim.MAX_BATCH,
    "seq_len": lim.MAX_SEQ_LEN,
    "fwd_layer_us": lim.MAX_TIME_US,
    "bwd_layer_us": lim.MAX_TIME_US,
}


def read_profile(
    given: str, path: str, base_dir: str | None
) -> tuple[str, tuple[ProfileRow, ...]]:
    """Resolve a profile CSV against ``base_dir``, check and parse it: (absolute path, rows).

    This is the one place a profile file is read; the generator uses the parsed rows.

    Errors name the file, the line and the column, never the file's content (a profile path
    may point at any readable file).
    """
    resolved = os.path.abspath(os.path.join(base_dir or os.getcwd(), given))
    if not os.path.isfile(resolved):
        what = "is a directory, not a CSV file" if os.path.isdir(resolved) else "not found"
        raise PlanError(path, f"profile file {what} at {f.text(resolved)} (got {f.got(given)})")
    text = read_text_file(resolved, path, "profile CSV", MAX_PROFILE_BYTES)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in PROFILE_COLUMNS if c not in header]
        if missing:
            raise PlanError(
                path,
                f"expected CSV columns {', '.join(PROFILE_COLUMNS)} in the header line of "
                f"{resolved}; missing {', '.join(missing)}",
            )
        rows: list[ProfileRow] = []
        for row in reader:
            tp, mb, seq, fwd, bwd = (
                _check_profile_cell(row, col, reader.line_num, path, resolved)
                for col in PROFILE_COLUMNS
            )
            rows.append((int(tp), int(mb), int(seq), float(fwd), float(bwd)))
    except csv.Error as e:
        raise PlanError(path, f"{resolved}: not a readable CSV file ({e})") from None
    if not rows:
        raise PlanError(path, f"expected at least one row of measurements in {resolved} (got none)")
    return resolved, tuple(rows)


def read_text_file(file: str, path: str, what: str, max_bytes: int) -> str:
    """The UTF-8 text of ``file``, at most ``max_bytes``; PlanError at ``path`` otherwise.

    A file that is not UTF-8 (e.g. UTF-16, or binary) gets one line naming the file and the
    offset of the first byte that does not decode.
    """
    try:
        with open(file, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as e:
        raise PlanError(path, f"cannot read {what} {file}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise PlanError(path, f"{what} {file} is larger than the {max_bytes:,}-byte limit")
    return decode_utf8(data, file, path, what)


def decode_utf8(data: bytes, file: str, path: str, what: str) -> str:
    """``data`` decoded as UTF-8 (a BOM is dropped); PlanError naming the bad byte offset."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise PlanError(
            path, f"{what} {file} is UTF-16 (byte-order mark at byte offset 0); save it as UTF-8"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PlanError(
            path,
            f"{what} {file} is not UTF-8 text: byte offset {e.start} (0x{data[e.start]:02x}) "
            "does not decode; save it as UTF-8",
        ) from None


def _check_profile_cell(
    row: Mapping[str, str | None], col: str, line: int, path: str, file: str
) -> float:
    """The cell's value (int for tp, micro_batch, seq_len), checked against its range."""
    raw = row.get(col)
    raw = raw.strip() if isinstance(raw, str) else ""
    integer = col in ("tp", "micro_batch", "seq_len")
    try:
        v = int(raw) if integer else float(raw)
        ok = 0 < v <= _PROFILE_MAXIMA[col]
    except (ValueError, OverflowError):
        ok = False
    if not ok:
        what = "a positive integer" if integer else "a positive number"
        raise PlanError(
            path,
            f"{file}, line {line}, column {col}: expected {what} <= {_PROFILE_MAXIMA[col]:g}",
        )
    return v


# ---------------------------------------------------------------- network


def parse_collectives(value: Any, path: str) -> CollectivesSpec:
    """The ``collectives:`` section -> CollectivesSpec."""
    m = f.expect_mapping(value, path)
    d = CollectivesSpec()
    f.check_keys(m, path, [x.name for x in dataclasses.fields(CollectivesSpec)])
    return CollectivesSpec(
        resharding=f.get_enum(m, "resharding", path, get_args(Resharding), d.resharding),  # type: ignore[arg-type]
        channels=parse_channels(m, path),
        granularity=f.get_enum(m, "granularity", path, get_args(Granularity), d.granularity),  # type: ignore[arg-type]
        chunks=f.get_int(m, "chunks", path, d.chunks, maximum=lim.MAX_CHUNKS,
                         limit="MAX_CHUNKS, docs/plan.md#limits"),
        ring_order=f.get_enum(m, "ring_order", path, get_args(RingOrder), d.ring_order),  # type: ignore[arg-type]
        dp_bucket_layers=f.get_int(m, "dp_bucket_layers", path, d.dp_bucket_layers,
                                   maximum=lim.MAX_LAYERS, limit="the model's layers at most"),
        nccl_cost=f.get_bool(m, "nccl_cost", path, d.nccl_cost),
        algorithm=parse_algorithms(m.get("algorithm", "auto"), f.join(path, "algorithm")),
    )


def parse_channels(m: Mapping[str, Any], path: str) -> int:
    """``collectives.channels``: ``auto`` (the default, stored as 0: one ring per NIC the
    members of a server use, as NCCL opens them) or a positive ring count."""
    where = f.join(path, "channels")
    f.note(where, {"anyOf": [{"const": "auto"},
                             {"type": "integer", "minimum": 1, "maximum": lim.MAX_CHANNELS}]},
           "auto")
    v = m.get("channels", "auto")
    if v == "auto":
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PlanError(where, f"expected 'auto' or a positive integer (got {f.got(v)})")
    if v > lim.MAX_CHANNELS:
        raise PlanError(where, f"expected at most {lim.MAX_CHANNELS} (MAX_CHANNELS, "
                               f"docs/plan.md#limits) (got {f.got(v)})")
    return int(v)


def parse_algorithms(value: Any, path: str) -> CollectiveAlgorithms:
    """``collectives.algorithm``: one algorithm for every kind, or a mapping per kind."""
    choices = get_args(Algorithm)
    if isinstance(value, str):
        if value not in choices:
            raise PlanError(path, f"expected one of {', '.join(choices)} or a mapping per "
                                  f"collective kind (got {value!r})")
        return CollectiveAlgorithms(value, value, value)  # type: ignore[arg-type]
    m = f.expect_mapping(value, path)
    kinds = [x.name for x in dataclasses.fields(CollectiveAlgorithms)]
    f.check_keys(m, path, kinds)
    return CollectiveAlgorithms(**{k: f.get_enum(m, k, path, choices, "auto") for k in kinds})  # type: ignore[arg-type]
