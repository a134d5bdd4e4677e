"""Bad plans: each raises PlanError naming the YAML path, the expectation and the value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers import WORKLOADS
from helpers.plan import example

from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import load_plan, plan_from_dict

A100_STAGE0 = "replicas[1].stages[0]"
TYPES = (
    "A10, A100-40GB, A100-80GB, A100-80GB-PCIe, A30, B200, B300, GB200, GB300, GH200, "
    "GH200-141GB, H100-80GB, H100-PCIe, H200, L4, L40S, MI250X, MI300X, RTX-2080-Ti, RTX-3090, "
    "RTX-4090, T4, V100-16GB, V100-32GB"
)
MODELS = (
    "deepseek-v3, gpt-oss-120b, gpt-oss-20b, gpt3-1.3b, gpt3-175b, llama2-13b, llama2-70b, "
    "llama2-7b, llama3-70b, llama3-8b, mixtral-8x22b, mixtral-8x7b, qwen1.5-moe-a2.7b, tiny-gpt"
)


def _set(path: list[Any], value: Any) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        node = d
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


def _delete(path: list[Any]) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        node = d
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return mutate


def _shares(*shares: float) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        for rep, s in zip(d["replicas"], shares, strict=False):
            rep["batch_share"] = s

    return mutate


def _layers(replica: int, *ranges: list[int]) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        for stage, rng in zip(d["replicas"][replica]["stages"], ranges, strict=True):
            stage["layers"] = rng

    return mutate


def _no_tp_across_nodes(d: dict) -> None:
    d["network"]["scale_up"] = {"tp_across_nodes": False}
    d["device_groups"]["a100"] = {"type": "A100-40GB", "nodes": 2, "gpus_per_node": 4}
    d["replicas"][1]["stages"] = [{"group": "a100", "devices": [2, 6], "tp": 4, "layers": [0, 32]}]


def _reuse(d: dict) -> None:
    d["replicas"].append(
        {"stages": [{"group": "a100", "devices": [2, 6], "tp": 4, "layers": [0, 32]}]}
    )


CASES = [
    (
        "unknown key in training",
        _set(["training", "shedule"], "1f1b"),
        "training.shedule: unknown key (did you mean schedule?); expected one of global_batch, "
        "micro_batch, schedule, "
        "optimizer, zero_stage, recompute, sequence_parallel, causal_attention_halving, "
        "flash_attention, virtual_stages, overlap, fsdp, precision, dropout, grad_reduce_dtype, "
        "grad_accumulation_fusion",
    ),
    (
        "unknown gradient format",
        _set(["training", "grad_reduce_dtype"], "fp8"),
        "training.grad_reduce_dtype: expected one of auto, fp32, bf16, fp16 (got 'fp8')",
    ),
    (
        "sustained clock above the burst clock",
        _set(["device_types"], {"H100-80GB": {"sustained_clock_MHz": 2000}}),
        "device_types.H100-80GB.sustained_clock_MHz: must not exceed burst_clock_MHz (1980) "
        "(got 2000)",
    ),
    (
        "negative clock",
        _set(["device_types"], {"H100-80GB": {"burst_clock_MHz": -1}}),
        "device_types.H100-80GB.burst_clock_MHz: expected a number in [0, 100000] (got -1)",
    ),
    (
        "fp8 efficiency above 1",
        _set(["device_types"], {"H100-80GB": {"fp8_efficiency": 1.5}}),
        "device_types.H100-80GB.fp8_efficiency: expected a number in [0, 1] (got 1.5)",
    ),
    (
        "unknown key in a stage",
        _set(["replicas", 0, "stages", 0, "pipeline"], 2),
        "replicas[0].stages[0].pipeline: unknown key; expected one of group, devices, tp, layers, "
        "ep, cp, etp",
    ),
    (
        "unknown top-level key",
        _set(["optimizer"], "adam"),
        "optimizer: unknown key; expected one of name, seed, model, training, device_types, "
        "device_groups, network, replicas, collectives, perturb",
    ),
    (
        "word for a number",
        _set(["device_groups", "h100", "nodes"], "two"),
        "device_groups.h100.nodes: expected a positive integer (got 'two')",
    ),
    (
        "bool is not an int",
        _set(["device_groups", "a100", "gpus_per_node"], True),
        "device_groups.a100.gpus_per_node: expected a positive integer (got True)",
    ),
    (
        "zero nodes",
        _set(["device_groups", "a100", "nodes"], 0),
        "device_groups.a100.nodes: expected a positive integer (got 0)",
    ),
    (
        "bad schedule",
        _set(["training", "schedule"], "zb"),
        "training.schedule: expected one of gpipe, 1f1b, interleaved, zb_h1 (got 'zb')",
    ),
    (
        "zero stage out of range",
        _set(["training", "zero_stage"], 4),
        "training.zero_stage: expected an integer in 0..3 (got 4)",
    ),
    (
        "efficiency above 1",
        _set(["device_types"], {"H100-80GB": {"efficiency": 1.5}}),
        "device_types.H100-80GB.efficiency: expected a number in (0, 1] (got 1.5)",
    ),
    (
        "negative latency",
        _set(["network", "scale_out", "latency_us"], -1),
        "network.scale_out.latency_us: expected a number in [0, 1e+12] (got -1)",
    ),
    (
        "unknown model preset",
        _set(["model"], "llama9"),
        f"model: unknown model preset; expected one of {MODELS} (got 'llama9')",
    ),
    (
        "unknown device type",
        _set(["device_groups", "h100", "type"], "H100"),
        f"device_groups.h100.type: unknown device type; expected one of {TYPES} (got 'H100')",
    ),
    (
        "tp does not match the devices",
        _set(["replicas", 1, "stages", 0, "tp"], 2),
        "replicas[1].stages[0].tp: must equal the stage's 4 devices (got 2)",
    ),
    (
        "tp does not divide the FFN",
        _set(["model"], {"preset": "llama2-7b", "heads": 16, "kv_heads": 16, "ffn_hidden": 11004}),
        "replicas[0].stages[0].tp: must divide the model's 11004 ffn_hidden size (got 8)",
    ),
    (
        "tp does not divide the heads",
        _set(["model"], {"preset": "llama2-7b", "heads": 4, "kv_heads": 4}),
        "replicas[0].stages[0].tp: must divide the model's 4 attention heads (got 8)",
    ),
    (
        "devices out of range",
        _set(["replicas", 1, "stages", 1, "devices"], [4, 12]),
        "replicas[1].stages[1].devices: expected [start, stop) with 0 <= start < stop <= 8, "
        "the devices of group a100 (got [4, 12])",
    ),
    (
        "devices used twice",
        _reuse,
        "replicas[2].stages[0].devices: device 2 of group a100 is already used by "
        "replicas[1].stages[0] (got [2, 6])",
    ),
    (
        "overlapping layers",
        _layers(1, [0, 18], [16, 32]),
        "replicas[1].stages[1].layers: overlaps replicas[1].stages[0] (layers [0, 18)) "
        "(got [16, 32])",
    ),
    (
        "gap in layers",
        _layers(1, [0, 18], [20, 32]),
        "replicas[1].stages[1].layers: leaves layers [18, 20) unassigned after "
        "replicas[1].stages[0] (got [20, 32])",
    ),
    (
        "not starting at 0",
        _layers(1, [2, 18], [18, 32]),
        "replicas[1].stages[0].layers: the first stage must start at layer 0 (got [2, 18])",
    ),
    (
        "not ending at model.layers",
        _layers(1, [0, 18], [18, 30]),
        "replicas[1].stages[1].layers: the last stage must end at the model's 32 layers "
        "(got [18, 30])",
    ),
    (
        "empty layer range",
        _layers(1, [0, 18], [18, 18]),
        "replicas[1].stages[1].layers: expected a non-empty range [start, stop) (got [18, 18])",
    ),
    (
        "layers beyond the model",
        _layers(0, [0, 40]),
        "replicas[0].stages[0].layers: expected a range within the model's 32 layers (got [0, 40])",
    ),
    (
        "global batch not divisible",
        _set(["training", "micro_batch"], 3),
        "training.global_batch: must be divisible by training.micro_batch 3 (got 64)",
    ),
    (
        "fewer micro-batches than replicas",
        _set(["training"], {"global_batch": 4, "micro_batch": 4}),
        "training.global_batch: expected at least one micro-batch per replica: "
        "global_batch / micro_batch = 1 micro-batches for 2 replicas (got 4)",
    ),
    (
        "shares not summing to 1",
        _shares(0.5, 0.4),
        "replicas: expected batch_share values summing to 1 within 1e-6 (got 0.9)",
    ),
    (
        "share on one replica only",
        _shares(0.5),
        "replicas[1].batch_share: required because replicas[0] sets one (got nothing)",
    ),
    (
        "unknown stage group",
        _set(["replicas", 0, "stages", 0, "group"], "b200"),
        "replicas[0].stages[0].group: unknown device group; expected one of h100, a100 "
        "(got 'b200')",
    ),
    (
        "TP across servers when forbidden",
        _no_tp_across_nodes,
        "replicas[1].stages[0].devices: TP group spans servers 0..1 of group a100 (4 GPUs per "
        "server) but network.scale_up.tp_across_nodes is false (got [2, 6])",
    ),
    (
        "missing required key",
        _delete(["training", "global_batch"]),
        "training.global_batch: required key is missing",
    ),
    (
        "kv heads do not divide heads",
        _set(["model"], {"preset": "llama2-7b", "kv_heads": 5}),
        "model.kv_heads: must divide the 32 attention heads (got 5)",
    ),
    (
        "uniform that does not fit",
        _set(["replicas"], {"uniform": {"group": "h100", "tp": 4, "pp": 2, "dp": 2}}),
        "replicas.uniform.dp: dp 2 x pp 2 x tp 4 needs 16 devices but devices [0, 8) of group "
        "h100 hold 8 (got 2)",
    ),
    (
        "layers given with auto_layers",
        _set(["replicas", 1, "auto_layers"], "by_compute"),
        "replicas[1].stages[0].layers: must be omitted when replicas[1].auto_layers is "
        "by_compute (got [0, 18])",
    ),
    (
        "a degrade event needs a factor",
        _set(["network", "events"], [{"at_us": 5, "kind": "degrade", "src": "a", "dst": "b"}]),
        "network.events[0].factor: required key is missing",
    ),
    (
        "stages is not a list",
        _set(["replicas", 0, "stages"], {"group": "h100"}),
        "replicas[0].stages: expected a list (got {'group': 'h100'})",
    ),
]


@pytest.mark.parametrize(("mutate", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_plan_message(mutate, message):
    d = example()
    mutate(d)
    with pytest.raises(PlanError) as info:
        plan_from_dict(d)
    assert str(info.value) == message


def test_error_carries_path_and_is_a_value_error():
    d = example()
    d["replicas"][1]["stages"][0]["tp"] = 2
    with pytest.raises(ValueError) as info:
        plan_from_dict(d)
    assert isinstance(info.value, PlanError)
    assert info.value.path == "replicas[1].stages[0].tp"
    assert info.value.detail == "must equal the stage's 4 devices (got 2)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "name: x\nmodel: llama2-7b\ntraining: {global_batch: 8\n",
            "invalid YAML at line 4, column 1 in <text>: expected ',' or '}', but got "
            "'<stream end>'",
        ),
        (
            "name: x\ntraining:\n  global_batch: 8\n  global_batch: 16\n",
            "invalid YAML at line 4, column 3: duplicate key 'global_batch' (first at line 3)",
        ),
        (
            "",
            "the plan is empty: expected a mapping with keys name, model, training, "
            "device_groups, replicas (got nothing)",
        ),
        (
            "# only a comment\n",
            "the plan is empty: expected a mapping with keys name, model, "
            "training, device_groups, replicas (got nothing)",
        ),
        ("- a\n- b\n", "expected a mapping at the top level of the plan (got a list)"),
    ],
    ids=["syntax", "duplicate-key", "empty", "comment-only", "list"],
)
def test_yaml_level_errors(text, message):
    with pytest.raises(PlanError) as info:
        load_plan(text)
    assert str(info.value) == message


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(PlanError) as info:
        load_plan(tmp_path / "nope.yaml")
    assert str(info.value) == f"plan file not found: {tmp_path / 'nope.yaml'}"
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(PlanError, match=r"^the plan is empty: "):
        load_plan(empty)


def test_syntax_error_in_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: [llama\n")
    with pytest.raises(PlanError) as info:
        load_plan(bad)
    assert str(info.value).startswith(f"invalid YAML at line 3, column 1 in {bad}: ")


PROFILE_HEADER = "tp,micro_batch,seq_len,fwd_layer_us,bwd_layer_us\n"


def test_profile_is_resolved_and_checked(tmp_path):
    (tmp_path / "h100.csv").write_text(PROFILE_HEADER + "8,1,4096,210.5,421.0\n")
    d = example()
    d["device_types"] = {"H100-80GB": {"profile": "h100.csv"}}
    plan = plan_from_dict(d, base_dir=str(tmp_path))
    assert plan.device_types["H100-80GB"].profile == str(tmp_path / "h100.csv")
    assert plan.device_types["H100-80GB"].peak_tflops == 989.0  # the rest of the preset kept

    (tmp_path / "bad.csv").write_text("tp,micro_batch,seq_len,fwd_layer_us\n8,1,4096,2\n")
    d["device_types"] = {"H100-80GB": {"profile": "bad.csv"}}
    with pytest.raises(PlanError) as info:
        plan_from_dict(d, base_dir=str(tmp_path))
    assert str(info.value) == (
        "device_types.H100-80GB.profile: expected CSV columns tp, micro_batch, seq_len, "
        f"fwd_layer_us, bwd_layer_us in the header line of {tmp_path / 'bad.csv'}; missing "
        "bwd_layer_us"
    )  # the header found is not shown: a profile path may name any file

    (tmp_path / "neg.csv").write_text(PROFILE_HEADER + "8,1,4096,210.5,421.0\n8,2,4096,x,1\n")
    d["device_types"] = {"H100-80GB": {"profile": "neg.csv"}}
    with pytest.raises(PlanError) as info:
        plan_from_dict(d, base_dir=str(tmp_path))
    assert str(info.value) == (
        f"device_types.H100-80GB.profile: {tmp_path / 'neg.csv'}, line 3, column "
        "fwd_layer_us: expected a positive number <= 1e+12"
    )  # the cell is not shown: a profile path may name any file

    d["device_types"] = {"H100-80GB": {"profile": "missing.csv"}}
    with pytest.raises(PlanError) as info:
        plan_from_dict(d, base_dir=str(tmp_path))
    assert str(info.value) == (
        f"device_types.H100-80GB.profile: profile file not found at "
        f"{tmp_path / 'missing.csv'} (got 'missing.csv')"
    )


def test_new_device_type_needs_every_number():
    d = example()
    d["device_types"] = {"X1": {"peak_tflops": 100, "hbm_GB": 80}}
    with pytest.raises(PlanError) as info:
        plan_from_dict(d)
    assert str(info.value) == "device_types.X1.hbm_GBps: required key is missing"


def test_empty_optional_sections_mean_defaults():
    text = WORKLOADS / "hetero-dp-h100-a100.yaml"
    base = load_plan(text)
    yaml_text = text.read_text().replace(
        "network:\n  scale_out: {topology: leaf_spine, link_gbps: 400, latency_us: 1.0}\n",
        "network:\ncollectives:\ndevice_types:\n",
    )
    plan = load_plan(yaml_text)
    assert plan == base  # the example's network is the default one
    with pytest.raises(PlanError) as info:
        load_plan(yaml_text.replace("training:\n", "training:\n  x: 1\n"))
    assert str(info.value).startswith("training.x: unknown key; expected one of global_batch")
