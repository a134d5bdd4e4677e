"""plan -> dict -> YAML -> plan gives an equal Plan (Hypothesis), and invariants of valid plans."""

from __future__ import annotations

import yaml
from helpers.plan import example, plan_dicts
from hypothesis import HealthCheck, given, settings

from xsim_adapters.feasibility import load_plan, plan_from_dict
from xsim_adapters.plan import plan_to_dict, plan_to_yaml, save_plan

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(plan_dicts())
def test_round_trip_through_yaml_is_equal(d):
    plan = plan_from_dict(d)
    text = yaml.safe_dump(plan_to_dict(plan), sort_keys=False)
    again = load_plan(text)
    assert again == plan
    # and the explicit form is a fixed point: dumping the reloaded plan gives the same text
    assert plan_to_yaml(again) == plan_to_yaml(plan)


@SETTINGS
@given(plan_dicts())
def test_valid_plans_tile_layers_and_split_every_micro_batch(d):
    plan = plan_from_dict(d)
    assert sum(r.micro_batches for r in plan.replicas) == plan.training.total_micro_batches
    assert all(r.micro_batches >= 1 for r in plan.replicas)
    used: set[int] = set()
    for rep in plan.replicas:
        assert rep.stages[0].layers[0] == 0
        assert rep.stages[-1].layers[1] == plan.model.layers
        for a, b in zip(rep.stages, rep.stages[1:], strict=False):
            assert a.layers[1] == b.layers[0]
        for s in rep.stages:
            assert s.num_layers >= 1
            assert s.tp == s.devices[1] - s.devices[0]
            ranks = set(plan.stage_ranks(s))
            assert not ranks & used
            used |= ranks


def test_example_round_trip_via_file(tmp_path):
    plan = plan_from_dict(example())
    path = tmp_path / "plan.yaml"
    save_plan(plan, path)
    assert load_plan(path) == plan
    assert load_plan(str(path)) == plan
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]  # no temporary left behind


def test_plan_to_dict_is_explicit():
    d = plan_to_dict(plan_from_dict(example()))
    assert d["model"]["layers"] == 32 and d["model"]["name"] == "llama2-7b"
    assert set(d["device_types"]) == {"H100-80GB", "A100-40GB"}
    assert d["device_types"]["H100-80GB"]["peak_tflops"] == 989.0
    # 64 split by replica speed (layout.replica_speed): H100 8 x 989 x 0.803 x 1768/1980 / 32
    # layers = 177.3, A100 4 x 312 x 0.869 / 18 layers (its slower stage) = 60.25: 47.77 / 16.23,
    # largest remainder -> 48 / 16
    assert [r["micro_batches"] for r in d["replicas"]] == [48, 16]
    assert d["replicas"][1]["stages"][1] == {
        "group": "a100",
        "devices": [4, 8],
        "tp": 4,
        "layers": [18, 32],
    }
