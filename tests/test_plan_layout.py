"""Batch split by speed and by share, layer split by compute, the uniform shorthand."""

from __future__ import annotations

import pytest
from helpers import WORKLOADS
from helpers.plan import example

from xsim_adapters.feasibility import load_plan, plan_from_dict
from xsim_adapters.plan import apportion, replica_speed, stage_speed
from xsim_adapters.plan.presets import device_presets


def test_apportion_rules():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]  # remainder to the earliest
    assert apportion(5, [100, 1, 1]) == [3, 1, 1]  # every part at least one
    assert apportion(7, [0.5, 0.25, 0.25]) == [3, 2, 2]  # 3.5, 1.75, 1.75: remainders .75 first
    assert apportion(6, [1, 2, 2, 1]) == [1, 2, 2, 1]
    assert apportion(5, [1, 2, 2, 1]) == [1, 2, 1, 1]  # .83, 1.67, 1.67, .83: tie -> earliest
    assert apportion(3, [1, 1, 1]) == [1, 1, 1]
    with pytest.raises(ValueError):
        apportion(2, [1, 1, 1])


def test_batch_split_by_speed_on_the_example():
    plan = plan_from_dict(example())
    # H100 replica: 8 * 989 * 0.803 TFLOP/s at its sustained 1768 of 1980 MHz over 32 layers;
    # A100: slowest stage 4*312*0.869 / 18 (preset efficiencies = measured best-GEMM fractions;
    # the A100 has no clock measurement, so no derating; presets/devices.yaml)
    fast, slow = 8 * 989 * 0.803 * 1768 / 1980 / 32, 4 * 312 * 0.869 / 18
    assert replica_speed(plan, 0) == pytest.approx(fast)
    assert replica_speed(plan, plan.replicas[1]) == pytest.approx(slow)
    # 64 * fast / (fast + slow) = 47.77 -> 47; 16.23 -> 16; the largest remainder -> 48 / 16
    assert [r.micro_batches for r in plan.replicas] == [48, 16]
    assert all(r.batch_share is None for r in plan.replicas)


def test_efficiency_override_moves_the_split():
    d = example()
    d["device_types"] = {"H100-80GB": {"efficiency": 0.2}}
    plan = plan_from_dict(d)
    # 8*989*0.2*1768/1980/32 = 44.15 vs 60.25: 64 * 44.15 / 104.40 = 27.07 -> 27, 36.93 -> 37
    assert [r.micro_batches for r in plan.replicas] == [27, 37]
    assert plan.device_types["H100-80GB"].efficiency == 0.2
    assert plan.device_types["H100-80GB"].hbm_GB == 85.52  # preset fields the override leaves alone


@pytest.mark.parametrize(
    ("shares", "expected"),
    [((0.25, 0.75), [16, 48]), ((1 / 3, 2 / 3), [21, 43]), ((0.5, 0.5), [32, 32])],
)
def test_batch_split_by_share(shares, expected):
    d = example()
    for rep, s in zip(d["replicas"], shares, strict=True):
        rep["batch_share"] = s
    plan = plan_from_dict(d)
    assert [r.micro_batches for r in plan.replicas] == expected
    assert [r.batch_share for r in plan.replicas] == list(shares)


def test_explicit_micro_batch_counts():
    d = example()
    d["replicas"][0]["micro_batches"] = 60
    d["replicas"][1]["micro_batches"] = 4
    assert [r.micro_batches for r in plan_from_dict(d).replicas] == [60, 4]
    d["replicas"][1]["micro_batches"] = 5
    with pytest.raises(
        ValueError,
        match=r"^replicas: expected micro_batches summing to "
        r"global_batch / micro_batch = 64 \(got 65\)$",
    ):
        plan_from_dict(d)


def test_every_replica_gets_at_least_one_micro_batch():
    d = example()
    d["training"]["global_batch"] = 2
    assert [r.micro_batches for r in plan_from_dict(d).replicas] == [1, 1]


def test_auto_layers_by_compute():
    plan = load_plan(WORKLOADS / "hetero-pipeline-reshard.yaml")
    # speeds 8*989*0.803*1768/1980 = 5673.1 and 4*312*0.869 = 1084.5 TFLOP/s: 32 layers ->
    # 26.86 / 5.14 -> 27 / 5
    assert [s.layers for s in plan.replicas[0].stages] == [(0, 27), (27, 32)]
    types = device_presets()
    assert stage_speed(types["H100-80GB"], 8) == pytest.approx(8 * 989 * 0.803 * 1768 / 1980)


def test_auto_layers_gives_every_stage_a_layer():
    d = example()
    d["model"] = "tiny-gpt"  # 4 layers
    d["device_groups"]["a100"]["type"] = "L40S"
    d["replicas"] = [
        {
            "auto_layers": "by_compute",
            "stages": [
                {"group": "h100", "devices": [0, 8]},
                {"group": "a100", "devices": [0, 1]},
                {"group": "a100", "devices": [1, 2]},
            ],
        }
    ]
    plan = plan_from_dict(d)
    assert [s.layers for s in plan.replicas[0].stages] == [(0, 2), (2, 3), (3, 4)]
    d["replicas"][0]["stages"] += [{"group": "a100", "devices": [i, i + 1]} for i in (2, 3)]
    with pytest.raises(ValueError) as info:
        plan_from_dict(d)
    assert str(info.value) == (
        "replicas[0].auto_layers: needs at least one layer per stage, but 5 stages share the "
        "model's 4 layers (got 'by_compute')"
    )


def test_uniform_shorthand_expands_to_contiguous_slices():
    plan = load_plan(WORKLOADS / "homogeneous-h100.yaml")
    assert [[(s.devices, s.layers, s.tp) for s in r.stages] for r in plan.replicas] == [
        [((0, 4), (0, 16), 4), ((4, 8), (16, 32), 4)],
        [((8, 12), (0, 16), 4), ((12, 16), (16, 32), 4)],
    ]
    assert [r.micro_batches for r in plan.replicas] == [8, 8]


def test_uniform_order_tp_dp_pp_puts_the_pipeline_outermost():
    """Megatron-Core's rank order: stage s of replica r at devices (s*dp + r)*tp, so a stage's
    EP block (ep consecutive replicas) sits on one server and the pipeline crosses servers."""
    d = example()
    d["device_groups"] = {"h100": {"type": "H100-80GB", "nodes": 4, "gpus_per_node": 8}}
    d["model"] = "mixtral-8x7b"
    d["training"] = {"global_batch": 32, "micro_batch": 1}
    d["replicas"] = {"uniform": {"group": "h100", "tp": 1, "pp": 4, "dp": 8, "ep": 8,
                                 "order": "tp-dp-pp"}}
    plan = plan_from_dict(d, feasibility=False)
    devices = [[s.devices for s in r.stages] for r in plan.replicas]
    assert devices[0] == [(0, 1), (8, 9), (16, 17), (24, 25)]
    assert devices[7] == [(7, 8), (15, 16), (23, 24), (31, 32)]
    # each stage's 8 EP peers (the 8 replicas) on one 8-GPU server; the default order spreads
    # them over 4 servers (replica r on devices 4r..4r+3)
    for s in range(4):
        assert {plan.replicas[r].stages[s].devices[0] // 8 for r in range(8)} == {s}
    d["replicas"]["uniform"]["order"] = "tp-pp-dp"
    default = plan_from_dict(d, feasibility=False)
    assert {default.replicas[r].stages[0].devices[0] // 8 for r in range(8)} == {0, 1, 2, 3}
    d["replicas"]["uniform"]["order"] = "pp-dp-tp"
    with pytest.raises(ValueError) as info:
        plan_from_dict(d, feasibility=False)
    assert str(info.value) == (
        "replicas.uniform.order: expected one of tp-pp-dp, tp-dp-pp (got 'pp-dp-tp')")


def test_uniform_remainder_goes_to_the_earliest_stages_and_dp_defaults_to_fill():
    d = example()
    d["replicas"] = [
        {"uniform": {"group": "h100", "tp": 2, "pp": 3, "devices": [0, 6]}},
        {"uniform": {"group": "a100", "tp": 4, "pp": 2}},
    ]
    plan = plan_from_dict(d)
    assert plan.dp == 1 + 1
    assert [s.layers for s in plan.replicas[0].stages] == [(0, 11), (11, 22), (22, 32)]
    assert [s.devices for s in plan.replicas[0].stages] == [(0, 2), (2, 4), (4, 6)]
    assert [s.devices for s in plan.replicas[1].stages] == [(0, 4), (4, 8)]


def test_tp_across_nodes_allowed_by_default():
    d = example()
    d["device_groups"]["a100"] = {"type": "A100-40GB", "nodes": 2, "gpus_per_node": 4}
    d["replicas"][1]["stages"] = [{"group": "a100", "devices": [2, 6], "layers": [0, 32]}]
    plan = plan_from_dict(d)
    assert plan.stage_ranks(plan.replicas[1].stages[0]) == (10, 11, 12, 13)
