"""Invariants of the metrics on real traces: shipped plans through the generator and flow."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REPO

import xsim_adapters as xs
from xsim_adapters.metrics.ranks import BREAKDOWN_COLUMNS
from xsim_adapters.trace.schema import KIND_COMPUTE, KIND_FLOW

SMALL_PLANS = ("homogeneous-h100", "uneven-layers", "hetero-pipeline-reshard")
EPS = 1e-6  # ns; float sums of ns-scale values


@pytest.fixture(scope="module", params=SMALL_PLANS)
def run(request):
    plan = xs.load_plan(REPO / "workloads" / f"{request.param}.yaml")
    trace = xs.generate(plan)
    tl = xs.run(trace, "flow", xs.build_topology(plan))
    return plan, trace, tl, xs.metrics(trace, tl)


def test_rank_time_invariants(run) -> None:
    plan, trace, tl, m = run
    r = m.ranks
    assert len(r) == plan.num_ranks
    it = r["iteration_time_ns"]
    assert it.max() == pytest.approx(tl.makespan_ns)
    assert (r["compute_ns"] <= it + EPS).all()
    assert (r["comm_ns"] <= it + EPS).all()
    assert (r["exposed_comm_ns"] <= r["comm_ns"] + EPS).all()
    assert (r["exposed_comm_ns"] >= -EPS).all()
    assert (r["bubble_ns"] >= -EPS).all()
    assert (r["bubble_ns"] <= r["non_compute_ns"] + EPS).all()
    assert (r["straggler_wait_ns"] <= r["non_compute_ns"] + EPS).all()
    assert (r["idle_ns"] == r["non_compute_ns"] - r["exposed_comm_ns"]).all()
    # caused_wait_ns is rounded per rank to integer ns: sums agree within 1 ns per rank
    assert abs(r["caused_wait_ns"].sum() - r["straggler_wait_ns"].sum()) <= len(r)
    parts = r[list(BREAKDOWN_COLUMNS)]
    assert (parts.to_numpy() >= 0).all()
    assert (parts.sum(axis=1) == it).all()
    ns_cols = [c for c in r.columns if c.endswith("_ns")]
    assert all(str(r[c].dtype) == "int64" for c in ns_cols)
    for p in ("tp", "pp", "reshard", "dp"):
        assert (r[f"comm_{p}_ns"] <= r["comm_ns"] + EPS).all()
    # A rank's compute ops are chained: its compute union equals the sum of its durations.
    comp = trace.ops[trace.ops["kind"] == KIND_COMPUTE]
    dur = comp.groupby("rank")["duration_ns"].sum().reindex(r["rank"], fill_value=0)
    np.testing.assert_allclose(r["compute_ns"].to_numpy(), dur.to_numpy(), rtol=1e-12)


def test_every_rank_communicates_and_is_in_a_stage(run) -> None:
    plan, trace, _, m = run
    flows = trace.ops[trace.ops["kind"] == KIND_FLOW]
    talking = set(flows["rank"]) | set(flows["dst"])
    assert set(m.ranks.loc[m.ranks["comm_ns"] > 0, "rank"]) == talking
    for i, rep in enumerate(plan.replicas):
        for s, st in enumerate(rep.stages):
            got = m.ranks.loc[list(plan.stage_ranks(st)), ["replica", "stage"]]
            assert (got["replica"] == i).all() and (got["stage"] == s).all()


def test_summary_consistency(run) -> None:
    plan, trace, tl, m = run
    s = m.summary
    assert s["ranks"] == plan.num_ranks and s["replicas"] == plan.dp
    tokens = plan.training.global_batch * plan.model.seq_len
    assert s["tokens_per_iteration"] == tokens
    assert s["tokens_per_s"] == pytest.approx(tokens / (tl.makespan_ns * 1e-9))
    for t, d in s["device_types"].items():
        peak = plan.device_types[t].peak_tflops
        assert d["peak_tflops"] == peak
        assert d["mfu"] == pytest.approx(d["achieved_tflops_per_gpu"] / peak)
        assert 0 < d["mfu"] < plan.device_types[t].efficiency + 1e-9  # never above the model
    assert s["flop_count"] == pytest.approx(float(trace.ops["flops"].sum()))
    assert sum(m.replicas["ranks"]) == plan.num_ranks
    assert list(m.replicas["micro_batches"]) == [rep.micro_batches for rep in plan.replicas]


def test_stragglers_reference_real_ops(run) -> None:
    _, trace, _, m = run
    st = m.stragglers
    assert (st["wait_ns"] >= 0).all()
    assert np.allclose(st["wait_ns"], st["last_ready_ns"] - st["ready_ns"])
    ops = trace.ops.set_index("op_id")
    kinds = ops.loc[st["op_id"], "kind"].to_numpy()
    assert (kinds == KIND_FLOW).all()
    waiting = st[st["wait_ns"] > 0]
    assert (waiting["culprit"] != waiting["waiter"]).all()
