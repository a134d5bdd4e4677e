"""Memory estimate against hand-computed numbers; feasibility errors with the numbers."""

from __future__ import annotations

import copy
import re

import pytest
from helpers import WORKLOADS
from helpers.plan import example

from xsim_adapters.errors import InfeasiblePlanError
from xsim_adapters.feasibility import load_plan, memory_report, plan_from_dict, stage_memory
from xsim_adapters.plan import (
    embedding_params,
    head_params,
    layer_params,
    model_params,
    model_presets,
)

# tiny-gpt (GPT style): 4 layers, h 1024, ffn 4096, 16 heads, seq 1024, vocab 32000.
# One replica of two TP-2 stages on 4 A100-40GB, micro_batch 2, 4 micro-batches, 1F1B.
TINY = {
    "name": "tiny-hand",
    "model": "tiny-gpt",
    "training": {"global_batch": 8, "micro_batch": 2, "flash_attention": False},
    "device_groups": {"g": {"type": "A100-40GB", "nodes": 1, "gpus_per_node": 4}},
    "replicas": [
        {
            "stages": [
                {"group": "g", "devices": [0, 2], "layers": [0, 2]},
                {"group": "g", "devices": [2, 4], "layers": [2, 4]},
            ]
        }
    ],
}

# Hand counts. Layer: QKVO 4h^2 = 4,194,304; MLP 2*h*ffn = 8,388,608; biases 3h + h + ffn + h
# = 9,216; two LayerNorms 4h = 4,096.
LAYER = 4_194_304 + 8_388_608 + 9_216 + 4_096  # 12,596,224
EMBED = 32_000 * 1024 + 1024 * 1024  # tokens + learned positions
HEAD = 32_000 * 1024 + 2 * 1024  # projection + final LayerNorm
SBH = 1024 * 2 * 1024  # s * b * h
PER_LAYER = SBH * (10 + 24 / 2) + 5 * 16 * 1024 * 1024 * 2 / 2  # Korthikanti, t = 2


def tiny(**training) -> dict:
    d = copy.deepcopy(TINY)
    d["training"].update(training)
    return d


def test_parameter_counts_match_released_models():
    presets = model_presets()
    # the exact counts Hugging Face reports for these checkpoints
    assert model_params(presets["llama2-7b"]) == 6_738_415_616
    assert model_params(presets["llama2-13b"]) == 13_015_864_320
    assert model_params(presets["llama2-70b"]) == 68_976_648_192
    assert model_params(presets["llama3-8b"]) == 8_030_261_248
    assert model_params(presets["llama3-70b"]) == 70_553_706_496
    t = presets["tiny-gpt"]
    assert (layer_params(t), embedding_params(t), head_params(t)) == (LAYER, EMBED, HEAD)


def test_hand_computed_stage_memory():
    plan = plan_from_dict(tiny())
    s0, s1 = stage_memory(plan, 0, 0), stage_memory(plan, 0, 1)
    p0 = (2 * LAYER + EMBED) / 2
    assert s0.params_per_device == p0 == 29_504_512
    # bf16 weights, fp32 gradients (Megatron's main_grad: grad_reduce_dtype auto), Adam 12 B
    assert (s0.weights, s0.gradients, s0.optimizer) == (2 * p0, 4 * p0, 12 * p0)
    assert s0.in_flight == 2  # 1F1B: min(pp - 0, m) = min(2, 4)
    assert s0.activations == 2 * 2 * PER_LAYER == 520_093_696
    assert s0.total == 992_165_888 + 2 * p0 == 1_051_174_912  # 18 B/param + activations

    p1 = (2 * LAYER + HEAD) / 2
    assert s1.params_per_device == p1
    assert s1.in_flight == 1
    head_acts = 4 * 1024 * 2 * (1024 + 32_000) / 2
    assert s1.activations == 2 * PER_LAYER + head_acts == 395_313_152
    assert s1.total == 859_013_120 + 2 * p1 == 916_975_616


def test_options_change_activations_as_the_paper_says():
    sp = stage_memory(plan_from_dict(tiny(sequence_parallel=True)), 0, 0)
    assert sp.activations == 2 * 2 * (SBH * 34 / 2 + 5 * 16 * 1024 * 1024 * 2 / 2)
    flash = stage_memory(plan_from_dict(tiny(flash_attention=True)), 0, 0)
    assert flash.activations == 2 * 2 * SBH * 22
    rc = stage_memory(plan_from_dict(tiny(recompute=True)), 0, 0)
    assert rc.activations == 2 * 2 * 2 * SBH + PER_LAYER  # inputs kept + one layer recomputed
    gp = stage_memory(plan_from_dict(tiny(schedule="gpipe")), 0, 1)
    assert gp.in_flight == 4


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_shards_over_replicas(zero):
    d = tiny(zero_stage=zero)
    d["device_groups"]["g"]["gpus_per_node"] = 8
    d["replicas"].append(copy.deepcopy(d["replicas"][0]))
    for st in d["replicas"][1]["stages"]:
        st["devices"] = [st["devices"][0] + 4, st["devices"][1] + 4]
    sm = stage_memory(plan_from_dict(d), 1, 0)
    p = (2 * LAYER + EMBED) / 2
    assert sm.optimizer == 12 * p / (2 if zero >= 1 else 1)
    assert sm.gradients == 4 * p / (2 if zero >= 2 else 1)  # fp32 gradients
    # ZeRO-3 (FSDP): the bf16 shard plus the units held gathered at the peak, the one computing
    # and fsdp.prefetch (1) more: here both of the stage's two one-layer units, TP-split (Zhao
    # et al. 2023, sec. 3.2)
    assert sm.weights == 2 * p / (2 if zero >= 3 else 1) + (2 * p if zero >= 3 else 0)


def test_infeasible_message_has_the_numbers():
    d = tiny()
    d["device_types"] = {"A100-40GB": {"hbm_GB": 1.0}}
    with pytest.raises(InfeasiblePlanError) as info:
        plan_from_dict(d)
    # stage 0: 1,051,174,912 bytes; stage 1 (916,975,616) fits in 1.0 GB
    assert str(info.value) == (
        "replicas[0].stages[0]: needs 1.1 GB per device (weights 0.1, gradients 0.1, "
        "optimizer 0.4, activations 0.5) but A100-40GB has 1.0 GB"
    )
    d["device_types"] = {"A100-40GB": {"hbm_GB": 0.8}}
    with pytest.raises(InfeasiblePlanError) as info:
        plan_from_dict(d)
    assert str(info.value).split("; ")[1] == (
        "replicas[0].stages[1]: needs 0.9 GB per device (weights 0.1, gradients 0.1, "
        "optimizer 0.3, activations 0.4) but A100-40GB has 0.8 GB"
    )
    # the same plan can still be built for inspection
    plan = plan_from_dict(d, feasibility=False)
    assert memory_report(plan)["fits"].tolist() == [False, False]


def test_example_without_flash_attention_does_not_fit_on_a100_40gb():
    d = example()
    d["training"]["flash_attention"] = False
    with pytest.raises(InfeasiblePlanError) as info:
        plan_from_dict(d)
    msg = str(info.value)
    assert re.fullmatch(
        r"replicas\[1\]\.stages\[0\]: needs (\d+\.\d) GB per device \(weights 1\.9, gradients "
        r"3\.8, optimizer 11\.3, activations (\d+\.\d)\) but A100-40GB has 43\.0 GB",
        msg,
    ), msg
    # s=4096, b=1, h=4096, a=32, t=4: per layer sbh*(10 + 6) + 5*a*s^2/4; 18 layers x 2 in flight
    sbh = 4096 * 4096
    acts = 18 * 2 * (sbh * 16 + 5 * 32 * 4096 * 4096 / 4)
    assert f"activations {acts / 1e9:.1f})" in msg


def test_memory_report_columns_and_units():
    df = memory_report(load_plan(WORKLOADS / "hetero-dp-h100-a100.yaml"))
    assert list(df.columns) == [
        "replica", "stage", "group", "device_type", "tp", "layer_start", "layer_stop",
        "in_flight", "params_per_device", "weights_GB", "gradients_GB", "optimizer_GB",
        "activations_GB", "total_GB", "capacity_GB", "headroom_GB", "fits",
    ]  # fmt: skip
    # the driver-reported capacities (NVML, MiB x 2^20 / 1e9): 81,559 and 40,960 MiB
    assert df["capacity_GB"].tolist() == [85.52, 42.95, 42.95]
    assert df["capacity_GB"].tolist() == pytest.approx(
        [81_559 * 2**20 / 1e9, 40_960 * 2**20 / 1e9, 40_960 * 2**20 / 1e9], abs=0.005)
    assert df["fits"].all()
    row = df.iloc[1]
    assert row["total_GB"] == pytest.approx(
        row["weights_GB"] + row["gradients_GB"] + row["optimizer_GB"] + row["activations_GB"]
    )
    assert row["params_per_device"] == (18 * 202_383_360 + 32_000 * 4096) / 4
