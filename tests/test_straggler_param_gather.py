"""ZeRO parameter all-gathers chained from t = 0 are not straggler wait; a slow GPU still is.

Issue 31: on the 1,024-GPU plan a rank whose first gather bucket had no predecessor was "ready
at 0" and "waited" for a peer that was only gathering its earlier buckets (docs/metrics.md).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
from helpers.gen import make_plan

import xsim_adapters as xs
from xsim_adapters import api
from xsim_adapters.trace.schema import KIND_COMPUTE, KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload import generate

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"


def _run(plan):
    trace = generate(plan)
    return trace, xs.metrics(trace, xs.run(trace, "flow", topology=xs.build_topology(plan)))


def _gathers(trace) -> set[int]:
    """DP collectives that feed a forward: the parameter all-gathers at the iteration's start."""
    ops = trace.ops
    dp = ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX["dp"])]
    fwd = ops[(ops["kind"] == KIND_COMPUTE) & (ops["phase"] == PHASE_INDEX["fwd"])]["op_id"]
    d = trace.deps[trace.deps["succ"].isin(fwd) & trace.deps["pred"].isin(dp["op_id"])]
    return set(dp.set_index("op_id").loc[d["pred"].unique(), "collective"].tolist())


def test_chained_parameter_gathers_have_no_straggler_wait() -> None:
    # replica 0: all 4 layers on GPU 0; replica 1: two stages of 2 layers. GPU 2's first bucket
    # (layers 2-3) is GPU 0's second, which GPU 0 gathers after layers 0-1: before the fix GPU 2
    # "waited" from t = 0 for that first gather (31,825 ns on this plan).
    plan = make_plan([[("h100", 0, 1, 0, 4)], [("h100", 1, 2, 0, 2), ("h100", 2, 3, 2, 4)]],
                     training={"zero_stage": 1})
    trace, m = _run(plan)
    gathers = _gathers(trace)
    st = m.stragglers[m.stragglers["kind"] == "dp"]
    ag = st[st["collective"].isin(gathers)]
    assert len(gathers) == 4 and len(ag) == 8  # 2 buckets x 2 members per stage pair
    assert (ag["ready_ns"] == 0).all() and (ag["wait_ns"] == 0).all()
    # the reduce-scatters still see the real imbalance: GPU 0 computes 4 layers, 1 and 2 two
    rs = st[~st["collective"].isin(gathers) & (st["wait_ns"] > 0)]
    assert set(rs["waiter"]) == {1, 2} and set(rs["culprit"]) == {0}
    r = m.ranks.set_index("rank")
    assert r.loc[1, "straggler_wait_ns"] > 0 and r.loc[2, "straggler_wait_ns"] > 0
    assert r.loc[0, "straggler_wait_ns"] == 0
    assert r.loc[0, "caused_wait_ns"] == r.loc[[1, 2], "straggler_wait_ns"].sum()


def test_a_slow_gpu_is_still_the_culprit_with_zero1() -> None:
    plan = api.load_plan(WORKLOADS / "whatif-slow-gpu.yaml")  # GPU 5 (replica 1) 15% slower
    plan = replace(plan, training=replace(plan.training, zero_stage=1))
    trace, m = _run(plan)
    st = m.stragglers[m.stragglers["kind"] == "dp"]
    gathers = _gathers(trace)
    assert gathers and (st[st["collective"].isin(gathers)]["wait_ns"] == 0).all()
    late = st[st["wait_ns"] > 0]
    # replica 1's pipeline (ranks 4-7, slowed by GPU 5) sets the pace at every gradient sync
    assert set(late["culprit"]) == {4, 5, 6, 7} and set(late["waiter"]) == {0, 1, 2, 3}
    r = m.ranks.set_index("rank")
    assert (r.loc[[0, 1, 2, 3], "straggler_wait_ns"] > 1_000_000).all()
    assert (r.loc[[4, 5, 6, 7], "straggler_wait_ns"] == 0).all()
    assert np.isclose(r["caused_wait_ns"].sum(), r["straggler_wait_ns"].sum())
