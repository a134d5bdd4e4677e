"""Attention shapes (explicit head width, biases, MLA, sliding windows, sinks) and the
DeepSeek-V3 / GPT-OSS presets against their published parameter counts."""

from __future__ import annotations

import pytest

from xsim_adapters.errors import PlanError
from xsim_adapters.plan import model_presets
from xsim_adapters.plan.attention import attention_params, is_window_layer, tp_gather_width
from xsim_adapters.plan.memory import (
    active_params,
    embedding_params,
    head_params,
    model_params,
    span_params,
)
from xsim_adapters.plan.moe import routed_expert_params
from xsim_adapters.plan.sections import parse_model

# (preset, published total, published active, rounding unit, does the card count the input
# embedding among the active parameters, source)
PUBLISHED = [
    # DeepSeek-AI 2024, DeepSeek-V3 Technical Report (arXiv:2412.19437): "671B total
    # parameters with 37B activated for each token" (the embedding lookup not counted: with it
    # the count is 37.55B, which would round to 38B).
    ("deepseek-v3", 671e9, 37e9, 1e9, False),
    # OpenAI 2025, gpt-oss model card (arXiv:2508.10925), Table 1: 116.83B total, 5.13B active.
    ("gpt-oss-120b", 116.83e9, 5.13e9, 1e7, False),
    # Same table: 20.91B total, 3.61B active.
    ("gpt-oss-20b", 20.91e9, 3.61e9, 1e7, False),
]


@pytest.mark.parametrize(("name", "total", "active", "unit", "embedding"), PUBLISHED)
def test_presets_equal_the_published_totals(name, total, active, unit, embedding):
    m = model_presets()[name]
    assert round(model_params(m) / unit) * unit == pytest.approx(total)
    assert round(active_params(m, embedding=embedding) / unit) * unit == pytest.approx(active)


def test_gpt_oss_components_equal_the_model_card_table():
    """Table 1 of the gpt-oss card splits the total: MLP 114.71B / 19.12B (router, experts with
    their biases), attention 0.96B / 0.64B (Q/K/V/O with biases, sinks), embedding +
    unembedding 1.16B; by hand from the HF configs (hidden 2880, 64 x 64 query and 8 x 64 KV
    heads, 128 / 32 experts of 2880, vocab 201088)."""
    h, f, q, kv, v = 2880, 2880, 64 * 64, 8 * 64, 201088
    attn = h * q + q + 2 * (h * kv + kv) + q * h + h + 64  # Q, K, V, O with biases, 64 sinks
    expert = 3 * h * f + 2 * f + h  # gate+up and down, with biases
    for name, layers, experts, mlp_b, attn_b in (("gpt-oss-120b", 36, 128, 114.71, 0.96),
                                                 ("gpt-oss-20b", 24, 32, 19.12, 0.64)):
        m = model_presets()[name]
        assert attention_params(m) == attn == 26_550_144
        mlp = layers * (experts * expert + h * experts + experts)
        assert round(mlp / 1e7) / 100 == mlp_b and round(layers * attn / 1e7) / 100 == attn_b
        assert routed_expert_params(m, (0, layers)) == layers * experts * expert
        assert embedding_params(m) + head_params(m) - h == 2 * v * h  # + final norm
        norms = 2 * h * layers + h
        assert model_params(m) == layers * attn + mlp + 2 * v * h + norms
        assert [is_window_layer(m, x) for x in range(4)] == [True, False, True, False]


def test_deepseek_v3_count_by_hand():
    """MLA per layer (HF config): q_a 7168 x 1536 + norm 1536 + q_b 1536 x 128 x 192, kv_a
    7168 x 576 + norm 512 + kv_b 512 x 128 x 256, o 128 x 128 x 7168; 3 dense MLPs of 18432;
    58 MoE layers of a router (256 x 7168 + 256 bias), 256 routed and 1 shared expert of 2048."""
    m = model_presets()["deepseek-v3"]
    h = 7168
    mla = (h * 1536 + 1536 + 1536 * 128 * 192 + h * 576 + 512 + 512 * 128 * 256
           + 128 * 128 * h)
    assert attention_params(m) == mla == 187_107_328
    expert = 3 * h * 2048
    moe_layer = 256 * h + 256 + 257 * expert
    layers = 61 * (mla + 2 * h) + 3 * 3 * h * 18432 + 58 * moe_layer
    assert span_params(m, (0, 61)) == layers
    assert model_params(m) == layers + 2 * 129280 * h + h == 671_026_419_200
    # one token: all attention, the dense MLPs, per MoE layer the router, 8 routed + 1 shared
    active = 61 * (mla + 2 * h) + 3 * 3 * h * 18432 + 58 * (256 * h + 256 + 9 * expert)
    assert active_params(m, embedding=False) == active + 129280 * h + h
    # Megatron-Core gathers the latents, not the hidden state, ahead of the attention block
    assert tp_gather_width(m) == 1536 + 512 + 64


def test_standard_models_keep_their_counts():
    assert model_params(model_presets()["llama2-7b"]) == 6_738_415_616
    assert model_params(model_presets()["mixtral-8x7b"]) == 46_702_792_704


BASE = {"layers": 4, "hidden": 256, "ffn_hidden": 512, "heads": 4, "seq_len": 128,
        "vocab": 1000}


@pytest.mark.parametrize(("attention", "msg"), [
    ({"mla": {"kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
              "v_head_dim": 8}, "head_dim": 32},
     r"model\.attention\.head_dim: must be 0 with mla"),
    ({"sliding_window": 256}, r"model\.attention\.sliding_window: must be at most model\.seq_len "
                              r"128 \(got 256\)"),
    ({"full_every": 2}, r"model\.attention\.full_every: needs a sliding_window \(got 2\)"),
    ({"mla": {"kv_lora_rank": 8}}, r"model\.attention\.mla\.qk_nope_head_dim: required"),
    ({"window": 8}, r"model\.attention\.window: unknown key; expected one of head_dim"),
])
def test_attention_plan_errors(attention, msg):
    with pytest.raises(PlanError, match=msg):
        parse_model({**BASE, "attention": attention}, "model", {})
