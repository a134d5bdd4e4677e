"""Mixture-of-experts: the ``model.moe`` section, which layers are MoE, and parameter counts.

Parameter counts follow the released checkpoints (Mixtral, Qwen-MoE: Llama conventions, no
biases): per MoE layer the router ``h x E``, ``E`` routed experts and the shared experts, each
expert an MLP of ``3 h f_e`` (gated) or ``2 h f_e`` parameters. Counts are exact functions of
the shape, so the presets' totals can be checked against the published ones
(tests/test_moe_model.py).
"""

from __future__ import annotations

from typing import Any, get_args

from ..errors import PlanError
from . import _fields as f
from .model import AllToAll, ExpertPlacement, ModelSpec, MoESpec, Router, Routing

MOE_KEYS = (
    "num_experts", "top_k", "expert_ffn_hidden", "shared_experts", "shared_ffn_hidden", "every",
    "first_dense_layers", "router", "capacity_factor", "routing", "zipf_exponent", "placement",
    "alltoall", "router_bias",
)
MAX_EXPERTS = 4096  # far above any published model (DeepSeek-V3: 256); bounds the trace's loops


def parse_moe(value: Any, path: str, base: MoESpec | None, layers: int) -> MoESpec | None:
    """``model.moe`` -> MoESpec (``null``: a dense model). ``base``: a preset's spec to override."""
    if value is None:
        return None
    m = f.expect_mapping(value, path)
    required = () if base is not None else ("num_experts", "top_k", "expert_ffn_hidden")
    f.check_keys(m, path, MOE_KEYS, required)
    d = base or MoESpec(num_experts=1, top_k=1, expert_ffn_hidden=1)
    cap = d.capacity_factor
    if "capacity_factor" in m:
        cap = None if m["capacity_factor"] is None else f.get_number(m, "capacity_factor", path)
    spec = MoESpec(
        num_experts=f.get_int(m, "num_experts", path, d.num_experts, maximum=MAX_EXPERTS,
                              limit="MAX_EXPERTS"),
        top_k=f.get_int(m, "top_k", path, d.top_k),
        expert_ffn_hidden=f.get_int(m, "expert_ffn_hidden", path, d.expert_ffn_hidden),
        shared_experts=f.get_int(m, "shared_experts", path, d.shared_experts, minimum=0),
        shared_ffn_hidden=f.get_int(m, "shared_ffn_hidden", path, d.shared_ffn_hidden, minimum=0),
        every=f.get_int(m, "every", path, d.every),
        first_dense_layers=f.get_int(m, "first_dense_layers", path, d.first_dense_layers,
                                     minimum=0),
        router=f.get_enum(m, "router", path, get_args(Router), d.router),  # type: ignore[arg-type]
        capacity_factor=cap,
        routing=f.get_enum(m, "routing", path, get_args(Routing), d.routing),  # type: ignore[arg-type]
        zipf_exponent=f.get_number(m, "zipf_exponent", path, d.zipf_exponent, positive=False),
        placement=f.get_enum(m, "placement", path, get_args(ExpertPlacement), d.placement),  # type: ignore[arg-type]
        alltoall=f.get_enum(m, "alltoall", path, get_args(AllToAll), d.alltoall),  # type: ignore[arg-type]
        router_bias=f.get_bool(m, "router_bias", path, d.router_bias),
    )
    if spec.top_k > spec.num_experts:
        raise PlanError(
            f.join(path, "top_k"),
            f"must be at most num_experts {spec.num_experts} (got {spec.top_k})",
        )
    if spec.first_dense_layers >= layers:
        raise PlanError(
            f.join(path, "first_dense_layers"),
            f"must leave at least one MoE layer of the model's {layers} (got "
            f"{spec.first_dense_layers})",
        )
    if spec.capacity_factor is not None and spec.capacity_factor * spec.top_k < 1:
        raise PlanError(
            f.join(path, "capacity_factor"),
            f"must give each expert room for its balanced share, at least 1 / top_k = "
            f"{1 / spec.top_k:g} (got {spec.capacity_factor:g})",
        )
    return spec


def is_moe_layer(model: ModelSpec, layer: int) -> bool:
    """True if transformer layer ``layer`` (0-based) has an MoE FFN."""
    e = model.moe
    if e is None or layer < e.first_dense_layers:
        return False
    return (layer - e.first_dense_layers) % e.every == 0


def moe_layers_in(model: ModelSpec, layers: tuple[int, int]) -> int:
    """How many of the layers ``[a, b)`` are MoE layers."""
    return sum(is_moe_layer(model, x) for x in range(*layers))


def _mlp(model: ModelSpec, ffn: int) -> int:
    """Weights of one MLP of width ``ffn`` (gated: 3 matrices, with ``model.mlp_bias`` biases on
    gate, up and down; else 2 plus biases, GPT style)."""
    h = model.hidden
    if model.gated_mlp:
        return 3 * h * ffn + (2 * ffn + h if model.mlp_bias else 0)
    return 2 * h * ffn + ffn + h


def router_params(model: ModelSpec) -> int:
    """Parameters of one MoE layer's router: ``h x E``, plus ``E`` with ``router_bias``."""
    e = model.moe
    assert e is not None
    return model.hidden * e.num_experts + (e.num_experts if e.router_bias else 0)


def dense_mlp_params(model: ModelSpec) -> int:
    """Parameters of the dense MLP of a non-MoE layer (as :func:`.memory.layer_params` counts)."""
    return _mlp(model, model.ffn_hidden)


def expert_params(model: ModelSpec, etp: int = 1) -> int:
    """Parameters of one routed expert (0 for a dense model); with expert TP ``etp`` the share
    of one ETP rank (the width split, the output bias replicated as Megatron-Core keeps it)."""
    return 0 if model.moe is None else _mlp(model, model.moe.expert_ffn_hidden // etp)


def routed_expert_params(model: ModelSpec, layers: tuple[int, int]) -> int:
    """Parameters of all routed experts of the layers ``[a, b)`` (what EP spreads)."""
    if model.moe is None:
        return 0
    return moe_layers_in(model, layers) * model.moe.num_experts * expert_params(model)


def moe_ffn_delta(model: ModelSpec) -> int:
    """Parameters an MoE layer has beyond a dense layer: router + experts - the dense MLP."""
    e = model.moe
    assert e is not None
    router = router_params(model)
    shared = e.shared_experts * _mlp(model, e.shared_ffn)
    return router + e.num_experts * expert_params(model) + shared - _mlp(model, model.ffn_hidden)


def active_ffn_params(model: ModelSpec, layer: int) -> int:
    """FFN parameters one token uses in ``layer``: the dense MLP, or router + top-k + shared."""
    e = model.moe
    if e is None or not is_moe_layer(model, layer):
        return _mlp(model, model.ffn_hidden)
    return (router_params(model) + e.top_k * expert_params(model)
            + e.shared_experts * _mlp(model, e.shared_ffn))
