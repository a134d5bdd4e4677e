"""The plan JSON Schema: generated from the loader, committed, valid for every shipped plan, and
rejecting what the loader rejects (for the errors a schema can express)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from helpers import REPO

from xsim_adapters import cli
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan import parse_yaml
from xsim_adapters.plan.loader import REQUIRED_TOP_KEYS, TOP_KEYS
from xsim_adapters.plan.model import TrainingSpec
from xsim_adapters.plan.schema import EXEMPLARS, plan_schema, schema_text

jsonschema = pytest.importorskip("jsonschema")

COMMITTED = REPO / "docs" / "plan.schema.json"
SHIPPED = sorted((REPO / "workloads").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator():
    schema = plan_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_committed_schema_is_the_generated_one():
    assert COMMITTED.read_text() == schema_text(), (
        "docs/plan.schema.json is stale: run `xsim schema -o docs/plan.schema.json`")


def test_xsim_schema_prints_it(capsys):
    assert cli.main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == plan_schema()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_plan_validates(validator, path):
    errors = [e.message for e in validator.iter_errors(parse_yaml(path.read_text()))]
    assert errors == []


def test_the_exemplars_validate(validator):
    for plan in EXEMPLARS:
        assert list(validator.iter_errors(json.loads(json.dumps(plan)))) == []


def test_every_key_the_loader_allows_is_described():
    s = plan_schema()
    assert list(s["properties"]) == list(TOP_KEYS)  # perturb appeared here by itself
    assert s["required"] == list(REQUIRED_TOP_KEYS)
    # training's keys come from the TrainingSpec dataclass: a new field appears by itself
    training = s["properties"]["training"]
    assert list(training["properties"]) == [x.name for x in dataclasses.fields(TrainingSpec)]
    assert training["additionalProperties"] is False

    def unconstrained(node, path=""):
        if node == {}:
            yield path
        if isinstance(node, dict):
            for k, v in node.get("properties", {}).items():
                yield from unconstrained(v, f"{path}.{k}")
            for key in ("items", "additionalProperties"):
                if isinstance(node.get(key), dict):
                    yield from unconstrained(node[key], f"{path}.{key}")
            for alt in node.get("anyOf", []):
                yield from unconstrained(alt, path)

    # The profile CSV (a file the exemplars do not ship) has no recorded type. The sections
    # added in stop 18 by parsers that do not report to the recorder yet (server wiring, the
    # measured matrix, collectives.algorithm's two forms, the MoE block, the device types'
    # NCCL fields) are accepted unconstrained until they do: a known gap (docs/plan.md),
    # listed here so that any other key without a type still fails this test.
    assert sorted(set(unconstrained(s))) == [
        ".collectives.algorithm",
        ".device_groups.additionalProperties.server",
        ".device_types.additionalProperties.compute_capability",
        ".device_types.additionalProperties.nvls",
        ".device_types.additionalProperties.profile",
        ".device_types.additionalProperties.server",
        ".network.measured",
    ]


def test_defaults_are_the_loaders(validator):
    p = plan_schema()["properties"]
    assert p["training"]["properties"]["schedule"]["default"] == TrainingSpec(1, 1).schedule
    assert p["seed"]["default"] == 0
    stage_tp = p["replicas"]["anyOf"][1]["items"]["anyOf"][0]["properties"]["stages"]
    assert "default" not in stage_tp["items"]["properties"]["tp"]  # the stage's devices: varies


BASE = (REPO / "workloads" / "hetero-pipeline-reshard.yaml").read_text()


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["training"].update(micro_batchs=2), "training.micro_batchs"),
    (lambda d: d["training"].update(global_batch="64"), "training.global_batch"),
    (lambda d: d["training"].update(schedule="2f2b"), "training.schedule"),
    (lambda d: d["training"].update(recompute="some"), "training.recompute"),
    (lambda d: d.update(model="llama9-1t"), "model"),
    (lambda d: d["network"].setdefault("scale_out", {}).update(link_gbps=-5),
     "network.scale_out.link_gbps"),
    (lambda d: d.update(device_groups={"bad/name": {"type": "H100-80GB", "nodes": 1,
                                                    "gpus_per_node": 8}}),
     "device_groups.bad/name"),
    (lambda d: d["replicas"][0]["stages"][0].update(devices=[0]),
     "replicas[0].stages[0].devices"),
    (lambda d: d.pop("replicas"), "replicas"),
    (lambda d: d.update(seed=True), "seed"),
])
def test_invalid_plans_are_rejected_by_the_schema_and_the_loader(validator, edit, where):
    d = parse_yaml(BASE)
    d.setdefault("network", {})
    assert list(validator.iter_errors(copy.deepcopy(d))) == []
    edit(d)
    assert list(validator.iter_errors(copy.deepcopy(d))), f"the schema accepted {where}"
    with pytest.raises(PlanError) as e:
        plan_from_dict(d, feasibility=False)
    assert str(e.value).startswith(where)


def test_plan_md_names_the_schema_for_editors():
    text = (REPO / "docs" / "plan.md").read_text()
    assert "# yaml-language-server: $schema=" in text and "plan.schema.json" in text
