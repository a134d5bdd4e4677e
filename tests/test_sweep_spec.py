"""Axis paths, --set values and sweep files."""

from __future__ import annotations

import pytest
from helpers.sweep import write_tiny_plan

from xsim_adapters.errors import PlanError
from xsim_adapters.sweep import (
    SweepError,
    format_path,
    load_sweep_file,
    parse_path,
    parse_set,
    parse_values,
)


@pytest.mark.parametrize("text, parts", [
    ("training.micro_batch", ("training", "micro_batch")),
    ("replicas[1].stages[0].layers", ("replicas", 1, "stages", 0, "layers")),
    ("replicas[-1].stages[0].tp", ("replicas", -1, "stages", 0, "tp")),
    ("device_groups.a100.nodes", ("device_groups", "a100", "nodes")),
    ("x[2][3].y", ("x", 2, 3, "y")),
])
def test_paths_round_trip(text, parts):
    assert parse_path(text) == parts
    assert format_path(parts) == text


@pytest.mark.parametrize("text, message", [
    ("a..b", "axis path 'a..b': cannot read it at character 3"),
    ("a[x]", "axis path 'a[x]': cannot read it at character 2"),
    ("a[1]b", "axis path 'a[1]b': cannot read it at character 5"),
    ("a.", "axis path 'a.': cannot read it at character 3"),
    ("[0].a", "axis path '[0].a': must start with a section name"),
    ("", "axis path '': must start with a section name"),
])
def test_bad_path_syntax_names_the_path_and_position(text, message):
    with pytest.raises(SweepError) as e:
        parse_path(text)
    assert str(e.value).startswith(message)


def test_set_values_are_a_yaml_flow_list():
    assert parse_set("training.micro_batch=1,2") == ("training.micro_batch", [1, 2])
    assert parse_set("collectives.resharding=lcm,direct,gather_p2p_scatter") == (
        "collectives.resharding", ["lcm", "direct", "gather_p2p_scatter"])
    assert parse_set(" replicas[0].stages[0].layers =[0,16],[0,20]") == (
        "replicas[0].stages[0].layers", [[0, 16], [0, 20]])
    assert parse_set("training.recompute=true,false")[1] == [True, False]
    assert parse_values("0.5", "x") == [0.5]


def test_bad_set_arguments_say_what_is_expected():
    with pytest.raises(SweepError, match=r"^--set 'training.micro_batch': expected PATH=VALUES"):
        parse_set("training.micro_batch")
    with pytest.raises(SweepError, match=r"^--set training.micro_batch: no values"):
        parse_set("training.micro_batch=")
    with pytest.raises(SweepError, match=r"^--set training.micro_batch: the values are not "
                                         r"valid YAML"):
        parse_set("training.micro_batch=[1,")


def test_sweep_file_base_is_relative_to_the_file(tmp_path):
    plans = tmp_path / "plans"
    plans.mkdir()
    write_tiny_plan(plans)
    f = tmp_path / "s.yaml"
    f.write_text("base: plans/tiny.yaml\naxes:\n  training.micro_batch: [1, 2]\n"
                 "  collectives.resharding: direct\nbackend: flow\noptions: {seed: 3}\n")
    spec = load_sweep_file(f)
    assert spec.base["name"] == "tiny-sweep"
    assert spec.axes == {"training.micro_batch": [1, 2], "collectives.resharding": ["direct"]}
    assert spec.options == {"seed": 3}
    assert spec.base_dir == str(plans.resolve())
    assert spec.base_path == str((plans / "tiny.yaml").resolve())
    # The resolved sweep written beside the results reads back to the same sweep.
    again = tmp_path / "again.yaml"
    again.write_text(spec.to_yaml())
    assert load_sweep_file(again).axes == spec.axes


def test_sweep_file_errors_name_the_file_and_key(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("base: nope.yaml\naxes: {training.micro_batch: [1]}\n")
    with pytest.raises(PlanError, match=r"plan file not found: .*nope\.yaml"):
        load_sweep_file(f)
    f.write_text("base: x.yaml\naxis: {}\n")
    with pytest.raises(SweepError, match=r"s\.yaml: unknown key 'axis' \(expected one of base, "
                                         r"axes, backend, options, jobs, placement\)"):
        load_sweep_file(f)
    f.write_text("base: {name: x}\naxes: {training.micro_batch: []}\n")
    with pytest.raises(SweepError, match=r"^axes: training.micro_batch has no values$"):
        load_sweep_file(f)
    f.write_text("axes: {training.micro_batch: [1]}\n")
    with pytest.raises(SweepError, match=r"s\.yaml: missing key 'base'"):
        load_sweep_file(f)


def test_spec_for_accepts_a_plan_a_dict_yaml_text_or_a_path(tmp_path):
    from helpers.sweep import TINY_PLAN

    from xsim_adapters.feasibility import load_plan
    from xsim_adapters.plan import parse_yaml, plan_to_dict
    from xsim_adapters.sweep import spec_for

    path = write_tiny_plan(tmp_path)
    by_path = spec_for(path, {"training.micro_batch": 2})
    assert by_path.base == parse_yaml(TINY_PLAN)
    assert (by_path.base_dir, by_path.source) == (str(tmp_path.resolve()), str(path))
    assert by_path.axes == {"training.micro_batch": [2]}
    assert spec_for(TINY_PLAN, {}).base == parse_yaml(TINY_PLAN)
    assert spec_for(parse_yaml(TINY_PLAN), {}).source == "<plan dict>"
    plan = load_plan(path)
    assert spec_for(plan, {}).base == plan_to_dict(plan)  # explicit: shorthands expanded
