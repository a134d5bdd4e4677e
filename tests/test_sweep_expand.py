"""The product of the axes and how overrides reach the plan."""

from __future__ import annotations

import pytest
from helpers.sweep import TINY_PLAN

from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan import parse_yaml
from xsim_adapters.sweep import OverrideError, apply_override, expand, parse_path, product


def tiny() -> dict:
    return parse_yaml(TINY_PLAN)


def test_product_has_every_combination_in_nested_loop_order():
    combos = product({"a": [1, 2], "b": ["x", "y", "z"], "c": [True]})
    assert len(combos) == 6
    assert [(c["a"], c["b"]) for c in combos] == [
        (1, "x"), (1, "y"), (1, "z"), (2, "x"), (2, "y"), (2, "z")]
    assert all(list(c) == ["a", "b", "c"] for c in combos)


def test_overrides_reach_the_plan_and_leave_the_base_alone():
    base = tiny()
    variants = expand(base, {"training.micro_batch": [1, 2],
                             "collectives.resharding": ["lcm", "direct"]})
    assert [v.index for v in variants] == [0, 1, 2, 3]
    assert [v.overrides for v in variants][1] == {"training.micro_batch": 1,
                                                  "collectives.resharding": "direct"}
    plans = [plan_from_dict(v.plan) for v in variants]
    assert [p.training.micro_batch for p in plans] == [1, 1, 2, 2]
    assert [p.collectives.resharding for p in plans] == ["lcm", "direct", "lcm", "direct"]
    # The uniform shorthand is kept, so the micro-batch count per replica is re-derived.
    assert [p.replicas[0].micro_batches for p in plans] == [4, 4, 2, 2]
    assert base == tiny()


def test_a_model_preset_opens_into_preset_plus_override():
    (v,) = expand(tiny(), {"model.layers": [6]})
    assert v.plan["model"] == {"preset": "tiny-gpt", "layers": 6}
    plan = plan_from_dict(v.plan)
    assert (plan.model.layers, plan.model.hidden) == (6, 1024)


def test_indexing_a_replica_expands_the_shorthand_to_explicit_stages():
    variants = expand(tiny(), {"replicas[1].stages[0].layers": [[0, 1], [0, 3]],
                               "replicas[1].stages[1].layers": [[1, 4], [3, 4]]})
    ok = [v for v in variants if v.overrides["replicas[1].stages[0].layers"][1]
          == v.overrides["replicas[1].stages[1].layers"][0]]
    assert len(ok) == 2
    for v in ok:
        plan = plan_from_dict(v.plan)
        assert [s.layers for s in plan.replicas[0].stages] == [(0, 2), (2, 4)]  # untouched
        assert [s.layers for s in plan.replicas[1].stages] == [
            tuple(v.overrides["replicas[1].stages[0].layers"]),
            tuple(v.overrides["replicas[1].stages[1].layers"])]


@pytest.mark.parametrize("path, message", [
    ("replicas[5].stages[0].tp", "replicas[5]: index out of range (the list has 2 entries)"),
    ("training.micro_batch.x", "training.micro_batch.x: cannot set key 'x' inside a value (1)"),
    ("training[0]", "training[0]: cannot index a mapping with [0]"),
    ("replicas[0].stages.tp", "replicas[0].stages.tp: cannot set key 'tp' inside a list"),
])
def test_a_bad_path_fails_its_variant_and_names_the_failing_prefix(path, message):
    variants = expand(tiny(), {path: [2], "collectives.resharding": ["lcm"]})
    (v,) = variants
    assert v.plan is None
    assert v.error == f"OverrideError: {message}"


def test_missing_sections_are_created_and_unknown_keys_left_to_the_validator():
    d = tiny()
    apply_override(d, parse_path("network.scale_out.link_gbps"), 100)
    assert plan_from_dict(d).network.scale_out.link_gbps == 100
    apply_override(d, parse_path("training.micro_bach"), 2)
    with pytest.raises(ValueError, match=r"^training\.micro_bach: unknown key"):
        plan_from_dict(d)
    with pytest.raises(OverrideError, match=r"^replicas: a shorthand"):
        apply_override(tiny(), parse_path("replicas[0].stages"), [])


def test_expanding_the_shorthand_keeps_the_plan_and_the_batch_split_derived():
    base_plan = plan_from_dict(tiny())
    variants = expand(tiny(), {"training.micro_batch": [1, 2],
                               "replicas[0].stages[0].tp": [2]})
    assert "micro_batches" not in variants[0].plan["replicas"][0]
    assert plan_from_dict(variants[0].plan) == base_plan  # tp 2 is the base's own value
    assert [r.micro_batches for r in plan_from_dict(variants[1].plan).replicas] == [2, 2]
    # A shorthand that sets the split itself keeps it explicit.
    d = tiny()
    d["replicas"]["uniform"]["micro_batches"] = 4
    (v,) = expand(d, {"replicas[0].stages[0].tp": [2]})
    assert [r["micro_batches"] for r in v.plan["replicas"]] == [4, 4]
