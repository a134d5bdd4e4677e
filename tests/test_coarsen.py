"""Coarsening of identical data-parallel replicas (workload/coarsen.py, docs/scale.md).

The coarsened run simulates one representative per class of identical replicas and keeps every
DP ring flow; the full run simulates everything. On a symmetric fabric both must give the same
iteration time within 1% (the rule ``auto`` relies on), the same fleet-wide metrics, and the
rule must never merge replicas that differ.
"""

from __future__ import annotations

import pytest
import yaml
from helpers import WORKLOADS

import xsim_adapters as xs
from xsim_adapters.errors import XsimError
from xsim_adapters.trace.schema import KIND_COMPUTE, KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload.coarsen import AUTO_MIN_OPS, decide, replica_classes
from xsim_adapters.workload.estimate import estimate_ops

FABRIC = {"topology": "leaf_spine", "rail_optimized": True, "link_gbps": 400,
          "latency_us": 1.0, "oversubscription": 1.0}


def _plan(replicas, groups, fabric=None, zero=1, batch=16):
    return xs.load_plan(yaml.safe_dump({
        "name": "coarsen-test",
        "model": {"preset": "tiny-gpt"},
        "training": {"global_batch": batch, "micro_batch": 1, "schedule": "1f1b",
                     "zero_stage": zero},
        "device_groups": groups,
        "network": {"scale_out": fabric or FABRIC},
        "replicas": replicas,
    }))


def homogeneous(**kw):
    """4 identical replicas of TP 4 x PP 2, one per server."""
    return _plan({"uniform": {"group": "h100", "tp": 4, "pp": 2, "dp": 4}},
                 {"h100": {"type": "H100-80GB", "nodes": 4, "gpus_per_node": 8}}, **kw)


def two_classes(**kw):
    """2 H100 replicas (TP 8) and 2 A100 replicas (TP 4 x PP 2): two classes of two."""
    return _plan([{"uniform": {"group": "h100", "tp": 8, "pp": 1, "dp": 2}},
                  {"uniform": {"group": "a100", "tp": 4, "pp": 2, "dp": 2}}],
                 {"h100": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 8},
                  "a100": {"type": "A100-80GB", "nodes": 2, "gpus_per_node": 8}}, **kw)


def _both(plan):
    topo = xs.build_topology(plan)
    out = {}
    for mode in ("off", "on"):
        trace = xs.generate(plan, mode)
        out[mode] = (trace, xs.metrics(trace, xs.run(trace, "flow", topo)))
    return out


@pytest.mark.parametrize("make", [homogeneous, two_classes], ids=["homogeneous", "two-classes"])
@pytest.mark.parametrize("zero", [0, 1])
def test_coarsened_iteration_time_within_1_percent_of_full(make, zero):
    runs = _both(make(zero=zero))
    (tf, mf), (tc, mc) = runs["off"], runs["on"]
    assert tc.manifest["coarsening"]["used"] and not tf.manifest["coarsening"]["used"]
    assert tc.num_ops < tf.num_ops
    full, coarse = mf.summary, mc.summary
    assert coarse["iteration_time_ns"] == pytest.approx(full["iteration_time_ns"], rel=0.01)
    # fleet-wide numbers: every mirrored rank counted through its representative
    assert coarse["ranks"] == full["ranks"]
    assert coarse["replicas"] == full["replicas"]
    assert coarse["flop_count"] == pytest.approx(full["flop_count"], rel=1e-9)
    assert coarse["mfu"] == pytest.approx(full["mfu"], rel=0.01)
    for phase in ("fwd", "bwd", "optim"):
        assert coarse["phases_rank_ns"][phase] == pytest.approx(
            full["phases_rank_ns"][phase], rel=0.01), phase
    assert mc.ranks["compute_ns"].sum() == pytest.approx(mf.ranks["compute_ns"].sum(), rel=0.01)
    assert (mc.ranks["compute_ns"] > 0).all()  # no mirrored rank left looking idle


def test_dp_collectives_are_kept_whole():
    """Every DP ring flow of the full trace is in the coarsened one: same count, same bytes,
    same (src, dst) pairs; only the mirrored replicas' compute, TP and PP ops are gone."""
    plan = homogeneous()
    full, coarse = xs.generate(plan, "off"), xs.generate(plan, "on")

    def dp_flows(t):
        ops = t.ops
        f = ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX["dp"])]
        return sorted(zip(f["rank"], f["dst"], f["bytes"], strict=True))

    assert dp_flows(coarse) == dp_flows(full)
    assert len(dp_flows(full)) > 0
    comp = coarse.ops[coarse.ops["kind"] == KIND_COMPUTE]
    assert set(comp["replica"].unique()) == {0}  # only the representative computes
    full_comp = full.ops[full.ops["kind"] == KIND_COMPUTE]
    assert len(comp) * plan.dp == len(full_comp)


def test_classes_never_merge_replicas_that_differ():
    plan = two_classes()
    assert replica_classes(plan) == [[0, 1], [2, 3]]
    co = decide(plan, "on")
    assert co.representative == (0, 0, 2, 2)
    hetero = xs.load_plan(WORKLOADS / "hetero-dp-h100-a100.yaml")  # H100 TP 8 vs A100 TP 4 x 2
    assert replica_classes(hetero) == [[0], [1]]
    co = decide(hetero, "on")
    assert not co.used and co.reason == "no two replicas are identical"


def test_classes_split_on_micro_batches_and_place():
    # the same pipeline on the same device type, but a different local GPU offset: not merged
    plan = _plan({"uniform": {"group": "h100", "tp": 4, "pp": 1, "dp": 4}},
                 {"h100": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 8}})
    assert replica_classes(plan) == [[0, 2], [1, 3]]
    # uneven micro-batches: 18 over 4 replicas is 5, 5, 4, 4
    plan = homogeneous(batch=18)
    assert [r.micro_batches for r in plan.replicas] == [5, 5, 4, 4]
    assert replica_classes(plan) == [[0, 1], [2, 3]]


def test_auto_refuses_on_an_asymmetric_fabric_and_small_plans():
    blocking = dict(FABRIC, oversubscription=2.0)
    plan = homogeneous(fabric=blocking)
    co = decide(plan, "auto", full_ops=10 * AUTO_MIN_OPS)
    assert not co.used and "oversubscription" in co.reason
    co = decide(homogeneous(), "auto")
    assert not co.used and "small" in co.reason
    co = decide(homogeneous(), "auto", full_ops=AUTO_MIN_OPS + 1)
    assert co.used and co.representative == (0, 0, 0, 0)
    fat = dict(FABRIC, topology="fat_tree", rail_optimized=False)
    co = decide(homogeneous(fabric=fat), "auto", full_ops=10 * AUTO_MIN_OPS)
    assert not co.used and "fat_tree" in co.reason
    with pytest.raises(XsimError, match="coarsen: expected one of auto, on, off"):
        decide(plan, "sometimes")


def test_perturbed_plans_are_never_coarsened():
    from dataclasses import replace

    from xsim_adapters.plan.perturb import PerturbSpec

    plan = replace(homogeneous(), perturb=PerturbSpec(jitter_sigma=0.05))
    for mode in ("on", "auto"):
        co = decide(plan, mode, full_ops=10 * AUTO_MIN_OPS)
        assert not co.used and co.reason.startswith("perturb:")


def test_summary_says_when_coarsening_was_used(tmp_path):
    plan = homogeneous()
    topo = xs.build_topology(plan)
    for mode, used in (("on", True), ("off", False), ("auto", False)):
        trace = xs.generate(plan, mode)
        met = xs.metrics(trace, xs.run(trace, "flow", topo))
        co = met.summary["coarsening"]
        assert co["mode"] == mode and co["used"] is used
        assert co["method"] == ("dp_replica_classes" if used else "none")
        if used:
            assert co["classes"] == [{"representative": 0, "replicas": 4}]
            assert co["simulated_replicas"] == [0]
    out = xs.write_report(met, tmp_path / "run", plots=False)
    import json

    summary = json.loads(next(p for p in out if p.name == "summary.json").read_text())
    assert summary["coarsening"]["reason"].startswith("the full trace is small")


def test_estimate_counts_only_simulated_replicas():
    plan = homogeneous()
    full, one = estimate_ops(plan), estimate_ops(plan, {0})
    assert one < full
    assert xs.generate(plan, "on").num_ops <= one


def test_cli_coarsen_option(tmp_path):
    import json

    from xsim_adapters import cli

    plan = tmp_path / "plan.yaml"
    plan.write_text((WORKLOADS / "homogeneous-h100.yaml").read_text())
    assert cli.main(["trace", str(plan), "--coarsen", "on", "-o", str(tmp_path / "t")]) == 0
    man = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert man["coarsening"]["used"] and man["coarsening"]["mode"] == "on"
    assert cli.main(["trace", str(plan), "-o", str(tmp_path / "u")]) == 0
    man = json.loads((tmp_path / "u" / "manifest.json").read_text())
    assert man["coarsening"]["mode"] == "auto" and not man["coarsening"]["used"]
    # a coarsened trace directory replays as stored
    assert cli.main(["run", str(tmp_path / "t"), "--no-plots", "-o", str(tmp_path / "r")]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["coarsening"]["used"] and summary["ranks"] == 16
