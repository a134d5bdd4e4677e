"""The scale plans (docs/scale.md) load, validate, fit the limits only through coarsening where
their full trace would not, and store a plan.yaml that reads back."""

from __future__ import annotations

import pytest
from helpers import WORKLOADS

from xsim_adapters.feasibility import load_plan, memory_report
from xsim_adapters.plan import plan_to_yaml
from xsim_adapters.plan.bounded_yaml import parse_yaml
from xsim_adapters.plan.limits import MAX_TRACE_OPS, MAX_YAML_NODES
from xsim_adapters.workload.coarsen import AUTO_MIN_OPS, decide, replica_classes
from xsim_adapters.workload.estimate import estimate_ops

MEGATRON = WORKLOADS / "megatron-1t-3072gpu.yaml"
LLAMA = WORKLOADS / "llama3-405b-16k-h100.yaml"
HETERO = WORKLOADS / "llama3-405b-16k-hetero.yaml"


def _params(plan) -> int:
    from xsim_adapters.workload.compute.costs import stage_params

    return stage_params(plan.model, (0, plan.model.layers))


def test_megatron_1t_is_the_sc21_row():
    plan = load_plan(MEGATRON)
    assert plan.num_ranks == 3072 and plan.dp == 6
    assert {(len(r.stages), r.stages[0].tp) for r in plan.replicas} == {(64, 8)}
    assert {plan.group(s.group).type for r in plan.replicas for s in r.stages} == {"A100-80GB"}
    # 1 trillion parameters: 128 x 12 h^2 (GPT layer, 4h FFN) + embeddings, h = 25,600
    assert 128 * 12 * 25_600**2 == pytest.approx(1.007e12, rel=1e-3)
    assert _params(plan) == pytest.approx(1.008e12, rel=2e-3)
    assert plan.training.global_batch == 3072
    assert [r.micro_batches for r in plan.replicas] == [512] * 6


def test_llama3_405b_is_the_published_layout():
    plan = load_plan(LLAMA)
    assert plan.num_ranks == 16_384 and plan.dp == 128
    assert {(len(r.stages), r.stages[0].tp) for r in plan.replicas} == {(16, 8)}
    assert _params(plan) == pytest.approx(405e9, rel=0.02)
    assert plan.training.global_batch * plan.model.seq_len == 2048 * 8192  # 16 M tokens


def test_hetero_variant_has_a_slice_of_a100():
    plan = load_plan(HETERO)
    assert plan.num_ranks == 16_384 and plan.dp == 128
    types = [plan.group(r.stages[0].group).type for r in plan.replicas]
    assert types.count("A100-80GB") == 16 and types.count("H100-80GB") == 112
    a100 = [r.micro_batches for r, t in zip(plan.replicas, types, strict=True) if t == "A100-80GB"]
    h100 = [r.micro_batches for r, t in zip(plan.replicas, types, strict=True) if t == "H100-80GB"]
    assert max(a100) < min(h100)  # the batch follows speed
    classes = replica_classes(plan)
    assert all(len({types[r] for r in c}) == 1 for c in classes)  # never mixed


@pytest.mark.parametrize("path", [MEGATRON, LLAMA, HETERO], ids=lambda p: p.stem)
def test_scale_plan_fits_only_coarsened(path):
    plan = load_plan(path)  # the loader's size check passed
    assert memory_report(plan)["fits"].all()
    full = estimate_ops(plan)
    co = decide(plan, "auto", full)
    assert co.used, co.reason
    coarse = estimate_ops(plan, set(co.representative))
    assert full > AUTO_MIN_OPS
    assert coarse <= MAX_TRACE_OPS
    assert coarse * 4 <= full  # the coarsening is what makes it tractable
    if path != HETERO:
        assert len(replica_classes(plan)) == 1
    # Megatron's 512 micro-batches over 64 stages: auto also merges the steady-state ones
    # (the 405B plans' 16-18 micro-batches over 16 stages leave nothing to merge)
    assert co.microbatches == (72 if path == MEGATRON else None), co.microbatch_reason


def test_full_trace_of_megatron_is_refused_with_the_limit(monkeypatch):
    """The full trace is 41.0 M ops (estimate_ops counts what the generator emits: its
    replica-coarsened, every-micro-batch trace of 6,839,296 ops is counted exactly); with the
    limit below that, ``off`` is refused before anything is built."""
    from xsim_adapters.errors import PlanError
    from xsim_adapters.plan import limits
    from xsim_adapters.workload import generate

    plan = load_plan(MEGATRON)
    assert estimate_ops(plan) == 41_005_056
    assert estimate_ops(plan, {0}) == 6_839_296  # bench_coarsen --microbatches, docs/scale.md
    monkeypatch.setattr(limits, "MAX_TRACE_OPS", 40_000_000)
    with pytest.raises(PlanError, match="about 41,005,056 ops, over the limit of 40,000,000"):
        generate(plan, "off")  # refused before anything is built


def test_stored_plan_yaml_reads_back():
    plan = load_plan(LLAMA)
    text = plan_to_yaml(plan)
    data = parse_yaml(text, stored=True)
    assert len(data["replicas"]) == 128
    again = load_plan(text, stored=True)
    assert again == plan
    assert MAX_YAML_NODES == 50_000  # user plans keep their bound


def test_a_stored_plan_yaml_path_reads_back_with_its_limits(tmp_path):
    """`xsim run OUT/trace/plan.yaml`: a plan.yaml inside an xsim trace output (beside its
    manifest, under an output stamp) is read with the stored limits; the same file elsewhere
    is a user plan and hits MAX_YAML_NODES. (A 4,096-stage plan spells out ~60,000 values.)"""
    from xsim_adapters.errors import PlanError
    from xsim_adapters.plan.loader import is_stored_plan

    text = "name: x\nstages:\n" + "- {group: h100, devices: [0, 1], tp: 1}\n" * 6_000
    d = tmp_path / "run" / "trace"
    d.mkdir(parents=True)
    (d / "plan.yaml").write_text(text)
    (d / "manifest.json").write_text("{}")
    (tmp_path / "run" / ".xsim-output").write_text("{}")
    assert is_stored_plan(d / "plan.yaml")
    with pytest.raises(PlanError) as stored:
        load_plan(d / "plan.yaml")
    assert "MAX_YAML_NODES" not in str(stored.value)  # parsed: refused as a plan, not a size
    other = tmp_path / "plan.yaml"
    other.write_text(text)
    assert not is_stored_plan(other)
    with pytest.raises(PlanError, match="MAX_YAML_NODES"):
        load_plan(other)
