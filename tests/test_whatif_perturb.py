"""Injected compute slowdowns and jitter (the plan's ``perturb:`` section)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from xsim_adapters import api
from xsim_adapters.errors import PlanError, XsimError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.trace.schema import KIND_COMPUTE, PHASE_INDEX
from xsim_adapters.workload.generate import plan_digest
from xsim_adapters.workload.perturb import jitter_factors

PLAN = {
    "name": "pipe4",
    "model": {"preset": "llama2-7b", "seq_len": 2048},
    "training": {"global_batch": 8, "micro_batch": 1, "schedule": "1f1b"},
    "device_groups": {
        "h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 4},
        "a100": {"type": "A100-80GB", "nodes": 2, "gpus_per_node": 2},
    },
    "replicas": [{"stages": [
        {"group": "h100", "devices": [i, i + 1], "tp": 1, "layers": [8 * i, 8 * i + 8]}
        for i in range(4)
    ]}],
}


def _with(perturb):
    d = copy.deepcopy(PLAN)
    d["perturb"] = perturb
    return d


@pytest.fixture(scope="module")
def base():
    plan = plan_from_dict(copy.deepcopy(PLAN))
    trace = api.generate(plan)
    return plan, trace, api.run(plan, trace=trace)


def _compute_ns(trace, rank, phases=("fwd", "bwd")):
    o = trace.ops
    sel = (o["kind"] == KIND_COMPUTE) & (o["rank"] == rank) & o["phase"].isin(
        [PHASE_INDEX[p] for p in phases])
    return int(o.loc[sel, "duration_ns"].sum()), int(sel.sum())


def _most_blamed(met):
    """The rank with the most compute on the critical path (the iteration waited on it)."""
    cp = met.summary["critical_path"]
    parts = cp["compute_ns"] + cp["comm_ns"] + cp["barrier_ns"] + cp["gap_ns"]
    assert abs(parts - cp["length_ns"]) <= len(met.critical) + 1
    assert cp["length_ns"] == met.summary["iteration_time_ns"]
    return cp["top_ranks"][0]["rank"]


def test_slow_bottleneck_stage_costs_exactly_its_extra_compute(base):
    """The last stage (it also runs the LM head) is the pipeline's bottleneck: every one of its
    forward and backward kernels is on the critical path, so making it 10% slower adds exactly
    10% of its fwd+bwd compute (its optimizer step runs off the critical path, in parallel with
    the drain of the earlier stages), up to 0.5 ns of rounding per kernel."""
    plan0, trace0, tl0 = base
    fb_ns, kernels = _compute_ns(trace0, 3)
    assert fb_ns > max(_compute_ns(trace0, r)[0] for r in range(3))  # rank 3 is the bottleneck
    plan = plan_from_dict(_with({"slow": [{"rank": 3, "factor": 1.1}]}))
    trace = api.generate(plan)
    tl = api.run(plan, trace=trace)
    delta = tl.makespan_ns - tl0.makespan_ns
    assert abs(delta - 0.1 * fb_ns) <= 0.5 * kernels + 1
    met = api.metrics(trace, tl)
    assert _most_blamed(met) == 3
    pert = met.summary["perturbation"]
    all_ns, _ = _compute_ns(trace0, 3, ("fwd", "bwd", "optim"))
    assert abs(pert["extra_compute_rank_ns"] - 0.1 * all_ns) <= 0.5 * (kernels + 1) + 1
    assert set(pert["extra_compute_ns_by_rank"]) == {"3"}


def test_slow_middle_stage_is_blamed(base):
    plan = plan_from_dict(_with({"slow": [{"rank": 1, "factor": 1.3}]}))
    trace = api.generate(plan)
    met = api.metrics(trace, api.run(plan, trace=trace))
    assert _most_blamed(met) == 1
    _, trace0, tl0 = base
    met0 = api.metrics(trace0, tl0)
    assert _most_blamed(met0) == 3  # before: the LM-head stage set the pace
    # ... and every forward and backward kernel of that bottleneck stage was on the path
    assert met0.summary["critical_path"]["top_ranks"][0]["compute_ns"] == _compute_ns(trace0, 3)[0]
    assert met.summary["iteration_time_ns"] > tl0.makespan_ns


def test_only_compute_durations_change(base):
    _, trace0, _ = base
    plan = plan_from_dict(_with({"slow": [{"group": "h100", "devices": [1, 3], "factor": 2}],
                                 "jitter": {"sigma": 0.1}}))
    trace = api.generate(plan)
    a, b = trace0.ops, trace.ops
    changed = (a["duration_ns"] != b["duration_ns"]).to_numpy()
    assert changed.any() and (a.loc[changed, "kind"] == KIND_COMPUTE).all()
    for col in a.columns:
        if col != "duration_ns":
            assert a[col].equals(b[col]), col
    assert trace0.deps.equals(trace.deps)


def test_no_perturb_keeps_trace_and_digest(base):
    plan0, trace0, _ = base
    plan = plan_from_dict(_with({}))
    assert plan_digest(plan) == plan_digest(plan0)
    trace = api.generate(plan)
    assert trace.ops.equals(trace0.ops) and "perturb" not in trace.manifest
    assert "perturb" not in plan_to_dict(plan)
    assert plan_digest(plan_from_dict(_with({"slow": [{"rank": 0, "factor": 1.5}]}))) != \
        plan_digest(plan0)


def test_targets_resolve_and_factors_multiply():
    plan = plan_from_dict(_with({"slow": [
        {"rank": 5, "factor": 2.0},
        {"group": "a100", "factor": 1.5},                  # ranks 4..7
        {"server": 2, "factor": 3.0},                      # a100 server 1: ranks 6, 7
        {"ranks": [0, 2], "factor": 0.5},
    ]}), feasibility=False)
    got = [(s.ranks, s.factor) for s in plan.perturb.slow]
    assert got == [((5,), 2.0), ((4, 5, 6, 7), 1.5), ((6, 7), 3.0), ((0, 2), 0.5)]
    from xsim_adapters.workload.perturb import rank_factors

    assert rank_factors(plan.perturb, 8).tolist() == [0.5, 1, 0.5, 1, 1.5, 3.0, 4.5, 4.5]
    again = plan_from_dict(plan_to_dict(plan), feasibility=False)
    assert again.perturb == plan.perturb


def test_jitter_is_mean_one_seeded_and_reproducible():
    n = 200_000
    f = jitter_factors(0.1, n, seed=7)
    assert abs(f.mean() - 1.0) < 4 * f.std() / np.sqrt(n)  # E[exp(sZ - s^2/2)] = 1
    assert abs(np.log(f).std() - 0.1) < 0.001
    assert np.array_equal(f, jitter_factors(0.1, n, seed=7))
    assert not np.array_equal(f, jitter_factors(0.1, n, seed=8))
    d = _with({"jitter": {"sigma": 0.05}})
    t1 = api.generate(plan_from_dict(d))
    t2 = api.generate(plan_from_dict(d))
    assert t1.ops["duration_ns"].equals(t2.ops["duration_ns"])
    d["seed"] = 1
    assert not t1.ops["duration_ns"].equals(api.generate(plan_from_dict(d)).ops["duration_ns"])


@pytest.mark.parametrize("perturb, where, what", [
    ({"slow": [{"rank": 1}]}, "perturb.slow[0].factor", "required key is missing"),
    ({"slow": [{"rank": 1, "group": "h100", "factor": 2}]}, "perturb.slow[0]",
     "expected exactly one of rank, ranks, group, server (got rank, group)"),
    ({"slow": [{"factor": 2}]}, "perturb.slow[0]", "(got none)"),
    ({"slow": [{"rank": 8, "factor": 2}]}, "perturb.slow[0].rank", "expected at most 7"),
    ({"slow": [{"rank": 1, "factor": 0}]}, "perturb.slow[0].factor", "[0.01, 100]"),
    ({"slow": [{"ranks": [1, True], "factor": 2}]}, "perturb.slow[0].ranks[1]",
     "expected a global rank in 0..7"),
    ({"slow": [{"ranks": [1, 1], "factor": 2}]}, "perturb.slow[0].ranks", "distinct"),
    ({"slow": [{"rank": 1, "devices": [0, 1], "factor": 2}]}, "perturb.slow[0].devices",
     "only with group"),
    ({"slow": [{"group": "a100", "devices": [2, 9], "factor": 2}]},
     "perturb.slow[0].devices", "group a100 has 4 devices"),
    ({"slow": [{"group": "v100", "factor": 2}]}, "perturb.slow[0].group",
     "unknown device group; expected one of h100, a100"),
    ({"slow": [{"server": 3, "factor": 2}]}, "perturb.slow[0].server", "at most 2"),
    ({"jitter": {"sigma": 2}}, "perturb.jitter.sigma", "[0, 1]"),
    ({"jitter": {"mu": 1}}, "perturb.jitter.mu", "unknown key"),
    ({"stragglers": []}, "perturb.stragglers", "unknown key; expected one of slow, jitter"),
])
def test_errors_name_the_place(perturb, where, what):
    with pytest.raises(PlanError) as e:
        plan_from_dict(_with(perturb))
    msg = str(e.value)
    assert where in msg and what in msg and "\n" not in msg


def test_perturbation_cost_against_baseline(base):
    _, _, tl0 = base
    plan = plan_from_dict(_with({"slow": [{"rank": 3, "factor": 1.1}]}))
    trace = api.generate(plan)
    met = api.metrics(trace, api.run(plan, trace=trace))
    block = api.add_perturbation_cost(met, plan)
    assert block["baseline_iteration_ns"] == int(tl0.makespan_ns)
    assert block["cost_ns"] == met.summary["iteration_time_ns"] - int(tl0.makespan_ns) > 0
    with pytest.raises(XsimError, match="no perturb"):
        api.add_perturbation_cost(met, base[0])
