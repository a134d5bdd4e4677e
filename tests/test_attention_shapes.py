"""Attention shapes (explicit head width, biases, MLA, sliding windows, sinks) and the
DeepSeek-V3 / GPT-OSS presets against their published parameter counts."""

from __future__ import annotations

import pytest

from xsim_adapters.errors import PlanError
from xsim_adapters.plan import model_presets
from xsim_adapters.plan.attention import attention_params, is_window_layer, tp_gather_width
from xsim_adapters.plan.moe import routed_expert_params
from xsim_adapters.plan.params import (
    active_params,
    embedding_params,
    head_params,
    model_params,
    span_params,
)
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
    ({"window": 8}, r"model\.attention\.window: unknown key \(did you mean sliding_window\?\); "
                    r"expected one of head_dim"),
])
def test_attention_plan_errors(attention, msg):
    with pytest.raises(PlanError, match=msg):
        parse_model({**BASE, "attention": attention}, "model", {})


# ---- compute, communication and memory of the new shapes -----------------------------------

def _plan(attention, tp=1, cp=1, dp=1, layers=2, heads=8, kv=8, **training):
    from xsim_adapters.feasibility import plan_from_dict

    return plan_from_dict({
        "name": "attn-test",
        "model": {"layers": layers, "hidden": 1024, "ffn_hidden": 2048, "heads": heads,
                  "kv_heads": kv, "seq_len": 4096, "vocab": 32000, "attention": attention},
        "training": {"global_batch": 2 * dp // cp, "micro_batch": 1,
                     "sequence_parallel": tp > 1, **training},
        "device_groups": {"h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8}},
        "replicas": {"uniform": {"group": "h100", "tp": tp, "pp": 1, "dp": dp, "cp": cp}},
    })


MLA = {"mla": {"q_lora_rank": 384, "kv_lora_rank": 256, "qk_nope_head_dim": 64,
               "qk_rope_head_dim": 32, "v_head_dim": 64}}


def _core_ops(trace):
    from xsim_adapters.trace.schema import KIND_COMPUTE, PHASE_INDEX

    o = trace.ops
    return o[(o["kind"] == KIND_COMPUTE) & (o["phase"] == PHASE_INDEX["fwd"])
             & (o["layer_start"] >= 0) & (o["layer_start"] < 1000) & (o["microbatch"] == 0)]


def test_sliding_window_layers_count_window_keys_per_query():
    """Forward FLOPs of a layer: QKV + out + core + MLP; the core is 4 b s s_k hd hq with s_k =
    4096 (full) or 128 (window), on alternating layers (full_every 2)."""
    from xsim_adapters.api import generate

    att = {"head_dim": 64, "sliding_window": 128, "full_every": 2}
    trace = generate(_plan(att, layers=4, heads=16, kv=4))
    s, h, hq, hkv, hd, f = 4096, 1024, 16, 4, 64, 2048
    dense = 2 * s * h * (hq + 2 * hkv) * hd + 2 * s * hq * hd * h + 2 * s * h * f * 3
    per_layer = _core_ops(trace).groupby("layer_start")["flops"].sum()
    for layer in (0, 2):
        assert per_layer[layer] == pytest.approx(dense + 4 * s * 128 * hd * hq, rel=1e-12)
    for layer in (1, 3):
        assert per_layer[layer] == pytest.approx(dense + 4 * s * s * hd * hq, rel=1e-12)
    # the windowed layer's attention block is the faster one (layer 2 against layer 1: the
    # first block of a micro-batch also carries the framework's per-pass host overhead)
    o = _core_ops(trace)
    attn = o.drop_duplicates("layer_start", keep="first").set_index("layer_start")
    assert attn.loc[2, "duration_ns"] < attn.loc[1, "duration_ns"]


def test_mla_flops_and_the_latent_all_gather_under_sequence_parallel():
    """MLA, TP 2 with sequence parallelism: the all-gather ahead of each attention block moves
    the latents (384 + 256 + 32 values per token), the reduce-scatter after it the hidden state
    (1024), b s x width x 2 bytes each; the forward FLOPs follow the MLA terms."""
    from xsim_adapters.api import generate
    from xsim_adapters.trace.schema import PHASE_INDEX

    trace = generate(_plan(MLA, tp=2))
    s, h, heads = 4096, 1024, 8
    tp_colls = trace.collectives[trace.collectives["phase"] == PHASE_INDEX["tp"]]
    sizes = tp_colls.groupby("kind")["bytes"].agg(set)
    assert sizes["all_gather"] == {s * 1024 * 2, s * (384 + 256 + 32) * 2}
    assert sizes["reduce_scatter"] == {s * 1024 * 2, s * (384 + 256 + 32) * 2}
    # per micro-batch, the latent collectives are: the gathers after the embedding and after
    # MLP 0 (they feed attention blocks; MLP 1's feeds the head), and the reduce-scatter after
    # each attention block's backward
    latent = s * (384 + 256 + 32) * 2
    lat = tp_colls[tp_colls["bytes"] == latent].groupby(["kind", "layer_start"]).size()
    assert lat.to_dict() == {("all_gather", -2): 2, ("all_gather", 0): 2,
                             ("reduce_scatter", 0): 2, ("reduce_scatter", 1): 2}
    mla = 2 * s * (384 * (h + heads * 96) + h * (256 + 32) + 256 * heads * (64 + 64))
    proj = 2 * s * heads * 64 * h
    core = 4 * s * s * 0.5 * (96 + 64) * heads
    mlp = 2 * s * h * 2048 * 3
    per_layer = _core_ops(trace).groupby("layer_start")["flops"].sum()
    assert per_layer[0] == pytest.approx(mla + proj + core + mlp, rel=1e-12)  # both ranks


def test_cp_ring_carries_mla_keys_and_values():
    from xsim_adapters.api import generate
    from xsim_adapters.trace.schema import KIND_FLOW, PHASE_INDEX

    trace = generate(_plan(MLA, tp=1, cp=2, dp=2))
    o = trace.ops
    flows = o[(o["kind"] == KIND_FLOW) & (o["phase"] == PHASE_INDEX["cp"])]
    kv = (4096 // 2) * 8 * (96 + 64) * 2  # s/cp tokens, 8 heads of K (96) and V (64), bf16
    assert set(flows["bytes"]) == {kv, 2 * kv}  # forward K/V, backward K/V and dK/dV


def test_mla_activations_exceed_mha_and_window_with_cp_is_refused():
    from xsim_adapters.feasibility.memory import stage_memory

    mha = stage_memory(_plan(None, tp=2), 0, 0).activations
    mla = stage_memory(_plan(MLA, tp=2), 0, 0).activations
    # TP-split attention terms: 8 h per token for MHA; MLA's (8 x (96 + 96 + 64 + 64) + 672) x 2
    # = 6464 = 6.3125 h; everything else alike
    s = 4096
    assert mha - mla == pytest.approx(2 * s * (8 * 1024 - 6464) / 2, rel=1e-12)
    with pytest.raises(PlanError, match=r"cp: cannot be combined with model\.attention\."
                                        r"sliding_window"):
        _plan({"sliding_window": 128}, cp=2, dp=2)
