"""The shipped plans through the real downstream stages: generator and topology builder."""

from __future__ import annotations

import pytest
from helpers import WORKLOADS

from xsim_adapters.feasibility import load_plan

SMALL = ["homogeneous-h100", "hetero-pipeline-reshard", "uneven-layers"]


@pytest.mark.parametrize("name", SMALL)
def test_generator_sees_the_plan_as_validated(name):
    workload = pytest.importorskip("xsim_adapters.workload")
    topology = pytest.importorskip("xsim_adapters.topology")
    plan = load_plan(WORKLOADS / f"{name}.yaml")
    trace = workload.generate(plan)
    reps = trace.manifest["workload"]["replicas"]
    assert [r["micro_batches"] for r in reps] == [r.micro_batches for r in plan.replicas]
    assert [[tuple(x) for x in r["layers"]] for r in reps] == [
        [s.layers for s in r.stages] for r in plan.replicas
    ]
    assert [r["tp"] for r in reps] == [[s.tp for s in r.stages] for r in plan.replicas]
    assert trace.manifest["workload"]["global_batch"] == plan.training.global_batch
    assert topology.build_topology(plan).num_ranks == plan.num_ranks
