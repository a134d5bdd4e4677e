"""MoE model fields: presets against published parameter counts, layer layout, plan errors."""

from __future__ import annotations

import pytest
from helpers import WORKLOADS

from xsim_adapters.errors import PlanError
from xsim_adapters.plan import model_presets
from xsim_adapters.plan.moe import is_moe_layer, routed_expert_params
from xsim_adapters.plan.params import active_params, model_params, span_params
from xsim_adapters.plan.sections import parse_model

# (preset, published total, published active, decimals the publisher rounded to, source)
PUBLISHED = [
    # Mistral AI, "Mixtral of experts" (2023-12-11): 46.7B total, 12.9B used per token.
    ("mixtral-8x7b", 46.7e9, 12.9e9, 1e8),
    # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17): 141B, 39B active.
    ("mixtral-8x22b", 141e9, 39e9, 1e9),
    # Qwen team, Qwen1.5-MoE blog and HF card Qwen/Qwen1.5-MoE-A2.7B: 14.3B total, 2.7B activated.
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, 1e8),
]


@pytest.mark.parametrize(("name", "total", "active", "unit"), PUBLISHED)
def test_preset_parameter_counts_equal_published_totals(name, total, active, unit):
    m = model_presets()[name]
    # Published figures are rounded to ``unit``: the exact count must round to them.
    assert round(model_params(m) / unit) * unit == pytest.approx(total)
    assert round(active_params(m) / unit) * unit == pytest.approx(active)


def test_mixtral_count_by_hand():
    m = model_presets()["mixtral-8x7b"]
    h, f, kv, v = 4096, 14336, 8 * 128, 32000
    layer = 2 * h * h + 2 * h * kv + 8 * 3 * h * f + h * 8 + 2 * h  # attn, experts, router, norms
    assert model_params(m) == 32 * layer + 2 * v * h + h
    assert routed_expert_params(m, (0, 32)) == 32 * 8 * 3 * h * f


def test_dense_model_unchanged():
    m = model_presets()["llama2-7b"]
    assert active_params(m) == model_params(m) == 6_738_415_616  # Llama 2 7B's published 6.74B


def test_layer_layout_every_other_and_first_dense():
    base = {"layers": 8, "hidden": 256, "ffn_hidden": 512, "heads": 4, "seq_len": 128,
            "vocab": 1000}
    m = parse_model({**base, "moe": {"num_experts": 4, "top_k": 1, "expert_ffn_hidden": 128,
                                     "every": 2, "first_dense_layers": 1}}, "model", {})
    assert [x for x in range(8) if is_moe_layer(m, x)] == [1, 3, 5, 7]
    dense = parse_model(base, "model", {})
    # 4 MoE layers each swap a 3*256*512 MLP for a router and 4 experts of 3*256*128
    delta = 4 * (256 * 4 + 4 * 3 * 256 * 128 - 3 * 256 * 512)
    assert span_params(m, (0, 8)) - span_params(dense, (0, 8)) == delta


def test_moe_plan_errors():
    base = {"layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": 4, "seq_len": 128,
            "vocab": 1000}
    with pytest.raises(PlanError, match=r"model\.moe\.top_k: must be at most num_experts 4 "
                                        r"\(got 5\)"):
        parse_model({**base, "moe": {"num_experts": 4, "top_k": 5, "expert_ffn_hidden": 8}},
                    "model", {})
    with pytest.raises(PlanError, match=r"model\.moe\.expert_ffn_hidden: required"):
        parse_model({**base, "moe": {"num_experts": 4, "top_k": 1}}, "model", {})
    with pytest.raises(PlanError, match=r"model\.moe\.routing: expected one of balanced, zipf"):
        parse_model({**base, "moe": {"num_experts": 4, "top_k": 1, "expert_ffn_hidden": 8,
                                     "routing": "random"}}, "model", {})


def test_preset_override_keeps_experts():
    m = parse_model({"preset": "mixtral-8x7b", "layers": 4, "moe": {"routing": "zipf"}},
                    "model", model_presets())
    assert m.moe is not None and m.moe.num_experts == 8 and m.moe.routing == "zipf"


@pytest.mark.parametrize("name", ["moe-mixtral-8x7b-64xh100-ep8", "moe-hetero-h100-a100-by-speed",
                                  "long-context-128k-cp4"])
def test_moe_and_cp_plans_round_trip_through_yaml(name):

    import yaml

    from xsim_adapters.feasibility import load_plan, plan_from_dict
    from xsim_adapters.plan import plan_to_yaml

    plan = load_plan(WORKLOADS / f"{name}.yaml")
    again = plan_from_dict(yaml.safe_load(plan_to_yaml(plan)))
    assert again == plan
