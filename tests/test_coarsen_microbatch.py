"""Merged steady-state micro-batches (workload/coarsen.py, metrics/steady.py, docs/scale.md).

A 1F1B replica of m micro-batches is simulated with p + STEADY_EXTRA of them and the left-out
periods are added back. Against the run of every micro-batch it must give the same iteration
time and per-rank metrics (up to the rounding of one ns per period), and the rule must refuse
what does not repeat.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

import xsim_adapters as xs
from xsim_adapters.errors import XsimError
from xsim_adapters.trace.schema import KIND_COMPUTE, PHASE_INDEX
from xsim_adapters.workload.coarsen import STEADY_EXTRA, decide, steady_microbatches

FABRIC = {"topology": "leaf_spine", "rail_optimized": True, "link_gbps": 400,
          "latency_us": 1.0, "oversubscription": 1.0}


def _plan(pp=4, dp=2, m=24, schedule="1f1b", fabric=None, ecmp="flow", **training):
    return xs.load_plan(yaml.safe_dump({
        "name": "steady-test",
        "model": {"preset": "tiny-gpt"},
        "training": {"global_batch": dp * m, "micro_batch": 1, "schedule": schedule,
                     **training},
        "device_groups": {"h100": {"type": "H100-80GB", "nodes": dp, "gpus_per_node": 8}},
        "network": {"scale_out": fabric or FABRIC, "ecmp": ecmp},
        "replicas": {"uniform": {"group": "h100", "tp": 2, "pp": pp, "dp": dp}},
    }))


def _runs(plan):
    co = decide(plan, "on")
    assert co.microbatches == plan.replicas[0].pp + STEADY_EXTRA
    topo = xs.build_topology(plan)
    out = {}
    for name, c in (("merged", co), ("full", dataclasses.replace(co, microbatches=None))):
        trace = xs.generate(plan, c)
        out[name] = (trace, xs.metrics(trace, xs.run(trace, "flow", topo)))
    return out


@pytest.mark.parametrize("training", [{}, {"zero_stage": 1}, {"recompute": "full"}])
def test_merged_microbatches_give_the_full_runs_metrics(training) -> None:
    plan = _plan(**training)
    runs = _runs(plan)
    (tm, mm), (tf, mf) = runs["merged"], runs["full"]
    m, sim = 24, plan.replicas[0].pp + STEADY_EXTRA
    # the merged trace simulates sim of m micro-batches (and nothing else is left out)
    assert set(tm.ops.loc[tm.ops["microbatch"] >= 0, "microbatch"]) == set(range(sim))
    assert tm.num_ops < tf.num_ops
    periods = m - sim
    # one ns of rounding per period and window edge, at most
    assert abs(mm.summary["iteration_time_ns"] - mf.summary["iteration_time_ns"]) <= periods
    cols = [c for c in mf.ranks.columns if c.endswith("_ns")]
    diff = (mm.ranks[cols] - mf.ranks[cols]).abs().to_numpy().max()
    assert diff <= 2 * periods
    assert np.allclose(mm.ranks["flop_count"], mf.ranks["flop_count"], rtol=1e-12)
    for k in ("tokens_per_s", "mfu"):
        assert mm.summary[k] == pytest.approx(mf.summary[k], rel=1e-6)
    assert mm.summary["tokens_per_iteration"] == mf.summary["tokens_per_iteration"]
    for p, v in mf.summary["phases_rank_ns"].items():
        assert abs(mm.summary["phases_rank_ns"][p] - v) <= 2 * periods * plan.num_ranks, p
    cp_m, cp_f = mm.summary["critical_path"], mf.summary["critical_path"]
    assert cp_m["length_ns"] == mm.summary["iteration_time_ns"]
    for k in ("compute_ns", "comm_ns", "barrier_ns"):
        assert abs(cp_m[k] - cp_f[k]) <= 4 * periods, k
    # the breakdown still sums to each rank's iteration time
    bd = [c for c in cols if c.startswith("breakdown_")]
    assert (mm.ranks[bd].sum(axis=1) - mm.ranks["iteration_time_ns"]).abs().max() <= 5
    rec = mm.summary["coarsening"]["microbatches"]
    assert rec["used"] and rec["simulated"] == sim and rec["micro_batches"] == m
    assert rec["periods_added"] == periods and rec["period_ns"] > 0
    assert "steady_state_microbatches" in mm.summary["coarsening"]["method"]


def test_the_period_is_the_slowest_stages_cycle() -> None:
    # independent check: with equal stages, free-ish pipeline sends and no DP overlap, one
    # period is one micro-batch's forward and backward on a stage plus its TP collectives:
    # the spacing of a middle stage's forwards in the full run
    runs = _runs(_plan(dp=1))
    tf, mf = runs["full"]
    o = tf.ops
    st = mf.timeline["start_ns"].to_numpy()
    sel = ((o["kind"] == KIND_COMPUTE) & (o["phase"] == PHASE_INDEX["fwd"])
           & (o["rank"] == 4)).to_numpy()
    first = {}
    for b, x in zip(o["microbatch"].to_numpy()[sel], st[sel], strict=True):
        first.setdefault(int(b), float(x))
    gaps = np.diff([first[b] for b in sorted(first)])
    steady = gaps[8:-8]  # after the fill, before the drain
    period = runs["merged"][1].summary["coarsening"]["microbatches"]["period_ns"]
    assert np.allclose(steady, period, atol=2.0)


def test_rules_say_why_not() -> None:
    for plan, why in (
        (_plan(schedule="gpipe"), "training.schedule: gpipe"),
        (_plan(m=12), "12 micro-batches per replica <= pipeline depth 4 + 8"),
    ):
        co = decide(plan, "on")
        assert co.microbatches is None and co.microbatch_reason.startswith(why)
    co = decide(_plan(), "auto")  # a small trace: auto leaves it whole
    assert co.microbatches is None and "small" in co.microbatch_reason
    co = decide(_plan(), "off")
    assert co.microbatches is None and not co.any_used
    assert steady_microbatches(4) == [4 + STEADY_EXTRA - 4, 4 + STEADY_EXTRA - 3]


def test_a_run_that_does_not_repeat_is_refused() -> None:
    plan = _plan(dp=1)
    trace = xs.generate(plan, "on")
    i2 = trace.manifest["coarsening"]["microbatches"]["steady"][1]
    o = trace.ops
    # one micro-batch of the steady state runs slower on one rank: no period repeats
    hit = np.flatnonzero(((o["kind"] == KIND_COMPUTE) & (o["microbatch"] == i2)
                          & (o["rank"] == 6)).to_numpy())[0]
    o.loc[hit, "duration_ns"] = int(o.loc[hit, "duration_ns"]) * 3
    tl = xs.run(trace, "flow", xs.build_topology(plan))
    with pytest.raises(XsimError, match=r"steady-state micro-batches: .*rerun with --coarsen "
                                        r"off"):
        xs.metrics(trace, tl)


def test_the_trace_directory_round_trips(tmp_path) -> None:
    plan = _plan(dp=1)
    trace = xs.generate(plan, "on")
    xs.write_trace(trace, tmp_path / "t", plan)
    from xsim_adapters.api import load_trace_and_plan

    again, stored = load_trace_and_plan(tmp_path / "t")
    assert again.manifest["coarsening"]["microbatches"]["simulated"] == 12
    tl = xs.run(again, "flow", xs.build_topology(stored))
    assert xs.metrics(again, tl).summary["coarsening"]["microbatches"]["periods_added"] == 12


def test_routes_that_depend_on_op_ids_keep_every_microbatch() -> None:
    # one server per leaf and two spines: the DP ring between the servers has two equal-cost
    # paths, picked per flow by a hash of its op id; merged micro-batches shift the sync's op
    # ids, so the sync would meet other collisions than in the full run: not merged
    fabric = dict(FABRIC, rail_optimized=False, nodes_per_leaf=1, spines=2)
    plan = _plan(fabric=fabric)
    assert decide(plan, "on").microbatches == 12  # allowed by the plan alone
    trace = xs.generate(plan, "on")
    rec = trace.manifest["coarsening"]["microbatches"]
    assert not rec["used"] and rec["simulated"] is None
    assert "several equal-cost paths (ECMP hashes each flow's op id)" in rec["reason"]
    assert set(trace.ops.loc[trace.ops["microbatch"] >= 0, "microbatch"]) == set(range(24))


def test_routes_that_follow_connections_merge_microbatches() -> None:
    # the fabric above with network.ecmp: connection: each DP ring connection keeps one of the
    # two spine paths for the whole run, so every micro-batch meets the same collisions and
    # merging gives the full run's iteration (one ns of rounding per period at most)
    fabric = dict(FABRIC, rail_optimized=False, nodes_per_leaf=1, spines=2)
    plan = _plan(fabric=fabric, ecmp="connection")
    runs = _runs(plan)
    (tm, mm), (tf, mf) = runs["merged"], runs["full"]
    assert mm.summary["coarsening"]["microbatches"]["used"] and tm.num_ops < tf.num_ops
    periods = 24 - (plan.replicas[0].pp + STEADY_EXTRA)
    assert abs(mm.summary["iteration_time_ns"] - mf.summary["iteration_time_ns"]) <= periods
