"""Every shipped plan validates, is feasible and shows what its header comment says."""

from __future__ import annotations

import math

import pytest
import yaml
from helpers import WORKLOADS
from helpers.plan import EXAMPLE

from xsim_adapters.feasibility import load_plan, memory_report
from xsim_adapters.plan import device_presets, model_presets

SHIPPED = sorted(WORKLOADS.glob("*.yaml"))


def test_the_five_plans_are_shipped():
    assert {p.name for p in SHIPPED} >= {
        "homogeneous-h100.yaml",
        "hetero-dp-h100-a100.yaml",
        "hetero-pipeline-reshard.yaml",
        "uneven-layers.yaml",
        "llama2-70b-1024gpu.yaml",
    }


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_plan_validates_and_fits(path):
    assert path.read_text().startswith("# ")  # says what it demonstrates
    plan = load_plan(path)
    assert memory_report(plan)["fits"].all()
    if plan.num_ranks <= 16:  # replayed packet by packet in CI: keep it modest
        assert 8 <= plan.training.global_batch <= 64
        assert plan.model.seq_len <= 4096


def test_example_is_shipped_exactly():
    assert yaml.safe_load((WORKLOADS / "hetero-dp-h100-a100.yaml").read_text()) == EXAMPLE


def test_reshard_plan_changes_tp_and_device_type_across_servers():
    plan = load_plan(WORKLOADS / "hetero-pipeline-reshard.yaml")
    (rep,) = plan.replicas
    a, b = rep.stages
    assert a.tp != b.tp
    assert plan.group(a.group).type != plan.group(b.group).type
    servers = {plan.rank_info(r)[2] for s in (a, b) for r in plan.stage_ranks(s)}
    assert len(servers) == 2


def test_uneven_layers_needs_a_multi_ring():
    plan = load_plan(WORKLOADS / "uneven-layers.yaml")
    assert [[s.layers for s in r.stages] for r in plan.replicas] == [
        [(0, 20), (20, 32)],
        [(0, 18), (18, 32)],
    ]
    assert plan.num_ranks <= 16

    def owner_tp(rep, layer):
        return next(s.tp for s in rep.stages if s.layers[0] <= layer < s.layers[1])

    tps = {layer: {owner_tp(r, layer) for r in plan.replicas} for layer in range(plan.model.layers)}
    assert any(len(t) > 1 for t in tps.values())
    assert math.lcm(*tps[18]) == 4


def test_1024_gpu_plan():
    plan = load_plan(WORKLOADS / "llama2-70b-1024gpu.yaml")
    assert plan.num_ranks == 1024
    assert plan.model.name == "llama2-70b"
    assert len({g.type for g in plan.device_groups}) >= 2
    assert {r.pp for r in plan.replicas} == {4, 8}
    assert plan.collectives.granularity == "chunked" and plan.collectives.chunks == 2
    assert plan.network.scale_out.rail_optimized
    counts = [r.micro_batches for r in plan.replicas]
    assert sum(counts) == 192 and 6 <= min(counts) and max(counts) <= 10


def test_presets_are_complete_and_sourced():
    models = model_presets()
    assert {"llama2-7b", "llama2-13b", "llama2-70b", "gpt3-175b", "llama3-8b", "llama3-70b",
            "gpt3-1.3b", "tiny-gpt"} <= set(models)  # fmt: skip
    assert models["llama2-70b"].kv_heads == 8 and not models["gpt3-175b"].gated_mlp
    devices = device_presets()
    assert {"A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "L40S"} <= set(devices)
    assert all(d.source for d in devices.values())
    assert (devices["A100-40GB"].scaleup_GBps, devices["H100-80GB"].scaleup_GBps) == (300, 450)
    assert (devices["B200"].scaleup_GBps, devices["L40S"].scaleup_GBps) == (900, 31.5)
    assert (devices["A100-80GB"].nic_gbps, devices["H200"].nic_gbps) == (200, 400)
    assert devices["H100-80GB"].peak_tflops == 989
