"""Metrics on hand-built traces with closed-form answers (no backend involved)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.metrics import TraceBuilder, asap_timeline, one_f_one_b, ring_all_reduce

from xsim_adapters.errors import BackendError
from xsim_adapters.metrics import (
    BREAKDOWN_COLUMNS,
    RANK_COLUMNS,
    compare,
    compute_metrics,
    union_blocks,
    union_length,
)
from xsim_adapters.trace.timeline import Timeline


def test_union_length_merges_overlaps_and_ignores_empty() -> None:
    key = np.array([0, 0, 0, 1, 1, 2])
    s = np.array([0.0, 5.0, 2.0, 0.0, 10.0, 7.0])
    e = np.array([3.0, 6.0, 4.0, 1.0, 12.0, 7.0])
    assert union_length(key, s, e, 4).tolist() == [5.0, 3.0, 0.0, 0.0]
    k, lo, hi = union_blocks(key, s, e)
    assert k.tolist() == [0, 0, 1, 1]
    assert lo.tolist() == [0.0, 5.0, 0.0, 10.0]
    assert hi.tolist() == [4.0, 6.0, 1.0, 12.0]


def test_union_length_touching_intervals_form_one_block() -> None:
    k, lo, hi = union_blocks(np.array([3, 3]), np.array([0.0, 10.0]), np.array([10.0, 20.0]))
    assert (k.tolist(), lo.tolist(), hi.tolist()) == ([3], [0.0], [20.0])


@pytest.mark.parametrize("p,m", [(4, 8), (2, 4), (3, 3)])
def test_1f1b_equal_stages_bubble_is_closed_form(p: int, m: int) -> None:
    f, b = 100, 200
    trace = one_f_one_b(p, m, f, b)
    met = compute_metrics(trace, asap_timeline(trace))
    r = met.ranks
    assert list(r.columns) == list(RANK_COLUMNS)
    it = (m + p - 1) * (f + b)
    assert met.summary["iteration_time_ns"] == it
    s0 = r.loc[r["stage"] == 0].iloc[0]
    assert s0["iteration_time_ns"] == it
    assert s0["bubble_ns"] == (p - 1) * (f + b)
    assert s0["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert (r["compute_ns"] == m * (f + b)).all()
    # The last stage's window starts at its first forward: no bubble inside it.
    assert r.loc[r["stage"] == p - 1, "bubble_ns"].iloc[0] == 0.0
    assert (r["non_compute_ns"] == r["iteration_time_ns"] - r["compute_ns"]).all()
    # Breakdown: stage 0 idles (p-1)(f+b) inside its window (bubble or a p2p in flight);
    # the last stage idles (p-1)f before its first forward (fill) and ends with its last bwd.
    parts = r[list(BREAKDOWN_COLUMNS)]
    assert (parts.sum(axis=1) == r["iteration_time_ns"]).all()
    s0 = r.loc[r["stage"] == 0].iloc[0]
    assert s0["breakdown_bubble_ns"] + s0["breakdown_exposed_comm_ns"] == (p - 1) * (f + b)
    assert s0["breakdown_other_ns"] == 0 and s0["breakdown_straggler_wait_ns"] == 0
    last = r.loc[r["stage"] == p - 1].iloc[0]
    assert last["breakdown_bubble_ns"] + last["breakdown_exposed_comm_ns"] == (p - 1) * f


def _dp_pair(late_bwd: int, via_barrier: bool) -> tuple:
    """Two replicas of one rank each; replica 1's backward ends ``late_bwd`` ns later."""
    tb = TraceBuilder([("a", "H100"), ("b", "A100")], {"H100": 1000.0, "A100": 300.0})
    f0 = tb.compute(0, 100, "fwd", 0, 0, 0, flops=1e9)
    b0 = tb.compute(0, 200, "bwd", 0, 0, 0, (f0,), flops=2e9)
    f1 = tb.compute(1, 100, "fwd", 1, 0, 0, flops=1e9)
    b1 = tb.compute(1, 200 + late_bwd, "bwd", 1, 0, 0, (f1,), flops=2e9)
    ready = {0: b0, 1: b1}
    if via_barrier:
        bar = tb.barrier((b0, b1))
        ready = {0: bar, 1: bar}
    last = ring_all_reduce(tb, 0, [0, 1], 800, ready)
    tb.compute(0, 50, "optim", 0, 0, -1, (last[0],))
    tb.compute(1, 50, "optim", 1, 0, -1, (last[1],))
    return tb.build(), (b0, b1)


@pytest.mark.parametrize("via_barrier", [False, True])
def test_dp_straggler_wait_is_the_backward_difference(via_barrier: bool) -> None:
    trace, _ = _dp_pair(late_bwd=300, via_barrier=via_barrier)
    met = compute_metrics(trace, asap_timeline(trace, gbps=8.0))
    st = met.stragglers[met.stragglers["kind"] == "dp"].set_index("waiter")
    assert st.loc[0, "wait_ns"] == 300.0
    assert st.loc[1, "wait_ns"] == 0.0
    assert (st["culprit"] == 1).all()
    assert st.loc[0, "ready_ns"] == 300.0 and st.loc[1, "ready_ns"] == 600.0
    r = met.ranks.set_index("rank")
    assert r.loc[0, "straggler_wait_ns"] == 300.0
    assert r.loc[1, "caused_wait_ns"] == 300.0
    assert r.loc[0, "caused_wait_ns"] == 0.0
    assert met.summary["max_straggler"] == {"rank": 1, "caused_wait_ns": 300.0}
    # Breakdown, all in ns (fwd 100, bwd 200 / 500, ring 2 x 400 ns, optim 50; iteration 1450).
    # Behind a barrier rank 0 sends nothing before 600: [300, 600) is pure straggler wait.
    # Without it, rank 0 sends its step 0 at [300, 700): moving bytes is communication, so the
    # wait overlaps communication and the breakdown's straggler part is 0.
    bd0 = r.loc[0, list(BREAKDOWN_COLUMNS)].tolist()
    wait = 300 if via_barrier else 0
    assert bd0 == [350, 1100 - wait, wait, 0, 0]
    assert r.loc[1, list(BREAKDOWN_COLUMNS)].tolist() == [650, 800, 0, 0, 0]


def test_dp_comm_exposed_and_summary_numbers() -> None:
    trace, _ = _dp_pair(late_bwd=300, via_barrier=False)
    met = compute_metrics(trace, asap_timeline(trace, gbps=8.0))
    r = met.ranks.set_index("rank")
    # 2 ranks, 800 B: chunks of 400 B at 8 Gb/s = 400 ns; 2(n-1) = 2 steps.
    # Rank 0 sends at [300, 700) (its step 0 does not wait for rank 1), receives rank 1's step 0
    # at [600, 1000), then step 1 both ways at [1000, 1400): comm = [300, 1400) = 1100 ns.
    assert r.loc[0, "comm_ns"] == 1100.0
    assert r.loc[0, "comm_dp_ns"] == 1100.0
    assert r.loc[0, "exposed_comm_ns"] == 1100.0  # no compute overlaps it
    assert r.loc[1, "comm_ns"] == 1400.0 - 300.0
    # iteration: 1400 + optim 50
    assert met.summary["iteration_time_ns"] == 1450.0
    assert met.summary["tokens_per_s"] == pytest.approx(4096 / 1450e-9)
    dt = met.summary["device_types"]
    # H100 rank: 3e9 FLOPs over 1450 ns = 2069 TFLOP/s achieved vs 1000 peak (toy numbers).
    assert dt["H100"]["achieved_tflops_per_gpu"] == pytest.approx(3e9 / 1450e-9 / 1e12)
    assert dt["A100"]["mfu"] == pytest.approx(3e9 / 1450e-9 / 1e12 / 300.0)
    assert met.summary["mfu"] == pytest.approx(6e9 / 1450e-9 / 1e12 / 1300.0)
    assert met.summary["phases_rank_ns"]["dp"] == 1100.0 + 1100.0
    assert met.summary["phases_rank_ns"]["bwd"] == 200.0 + 500.0


def test_exposed_comm_excludes_overlap_with_own_compute() -> None:
    tb = TraceBuilder([("g", "H100"), ("g", "H100")])
    c = tb.compute(0, 100, "fwd", 0, 0, 0)
    tb.flow(0, 1, 100, "tp", ())          # [0, 100) at 8 Gb/s: fully under the compute
    tb.flow(0, 1, 200, "tp", ())          # [0, 200): 100 ns exposed
    tb.compute(0, 100, "bwd", 0, 0, 0, (c,))
    trace = tb.build()
    met = compute_metrics(trace, asap_timeline(trace))
    r = met.ranks.set_index("rank")
    assert r.loc[0, "comm_ns"] == 200.0 and r.loc[0, "comm_tp_ns"] == 200.0
    assert r.loc[0, "exposed_comm_ns"] == 0.0  # compute covers [0, 200)
    assert r.loc[1, "exposed_comm_ns"] == 200.0  # rank 1 never computes
    assert r.loc[1, "non_compute_ns"] == 200.0  # rank 1 only receives: not computing...
    assert r.loc[1, "idle_ns"] == 0  # ...but not idle
    assert r.loc[1, "breakdown_exposed_comm_ns"] == 200


def test_pp_receive_wait_attributed_to_sender() -> None:
    tb = TraceBuilder([("g", "H100"), ("g", "H100")])
    f0 = tb.compute(0, 100, "fwd", 0, 0, 0)
    a = tb.flow(0, 1, 10, "pp", (f0,))  # 10 ns
    f1 = tb.compute(1, 100, "fwd", 0, 1, 0, (a,))
    b1 = tb.compute(1, 200, "bwd", 0, 1, 0, (f1,))
    g = tb.flow(1, 0, 10, "pp", (b1,))
    tb.compute(0, 200, "bwd", 0, 0, 0, (f0, g))
    trace = tb.build()
    met = compute_metrics(trace, asap_timeline(trace))
    st = met.stragglers.set_index("op_id")
    # Activation: rank 1 has no earlier compute (ready 0), sender ready at 100.
    assert st.loc[a, ["waiter", "culprit", "wait_ns"]].tolist() == [1, 0, 100.0]
    # Gradient: rank 0 ready at 100 (its forward), rank 1 sends at 110 + 100 + 200 = 410.
    assert st.loc[g, ["waiter", "culprit", "wait_ns"]].tolist() == [0, 1, 310.0]
    r = met.ranks.set_index("rank")
    # Receive waits are pipeline waits: reported alone, not as straggler wait.
    assert r.loc[0, "straggler_pp_ns"] == 310.0 and r.loc[1, "straggler_pp_ns"] == 100.0
    assert (r["straggler_wait_ns"] == 0).all() and (r["caused_wait_ns"] == 0).all()
    # Pipeline window of rank 0: [0, 620); computing 300 of it.
    assert r.loc[0, "bubble_ns"] == 620.0 - 300.0


def test_incomplete_timeline_is_rejected() -> None:
    trace = one_f_one_b(2, 2, 10, 20)
    tl = asap_timeline(trace)
    tl.frame.loc[3, "end_ns"] = np.nan
    with pytest.raises(BackendError, match="1 ops never completed"):
        compute_metrics(trace, tl)
    short = Timeline("x", tl.frame.iloc[:-1])
    with pytest.raises(BackendError, match="partial timeline"):
        compute_metrics(trace, short)


def test_compare_identical_and_shifted_timelines() -> None:
    trace = one_f_one_b(3, 4, 100, 200)
    a = asap_timeline(trace, backend="a")
    same = compare(trace, a, asap_timeline(trace, backend="b"))
    assert (same.metrics["abs_diff"].fillna(0) == 0).all()
    assert (same.ops["end_diff_ns"] == 0).all()
    frame = a.frame.copy()
    frame[["start_ns", "end_ns"]] *= 1.1  # b is uniformly 10 % slower
    cmp = compare(trace, a, Timeline("b", frame))
    row = cmp.metrics.set_index("metric").loc["iteration_time_ns"]
    assert row["value_a"] == 1800.0
    assert row["value_b"] == pytest.approx(1980.0)
    assert row["rel_diff"] == pytest.approx(0.1)
    assert set(cmp.metrics["backend_b"]) == {"b"}
    ranks = cmp.ranks.set_index("rank")
    assert ranks.loc[0, "compute_ns_diff"] == pytest.approx(0.1 * 4 * 300.0)
    assert len(cmp.ops) == trace.num_ops


def test_concurrent_waits_count_once_and_exclude_own_compute() -> None:
    """Two DP collectives wait on the same late backward; rank 0 computes 100 ns meanwhile."""
    tb = TraceBuilder([("a", "H100"), ("b", "H100")])
    b0 = tb.compute(0, 300, "bwd", 0, 0, 0)
    extra = tb.compute(0, 100, "bwd", 0, 0, 1, (b0,))  # [300, 400): busy, not waiting
    b1 = tb.compute(1, 600, "bwd", 1, 0, 0)
    last0 = ring_all_reduce(tb, 0, [0, 1], 80, {0: b0, 1: b1})
    last1 = ring_all_reduce(tb, 1, [0, 1], 80, {0: b0, 1: b1})
    tb.compute(0, 10, "optim", 0, 0, -1, (extra, last0[0], last1[0]))
    trace = tb.build()
    met = compute_metrics(trace, asap_timeline(trace))
    st = met.stragglers[(met.stragglers["kind"] == "dp") & (met.stragglers["waiter"] == 0)]
    assert st["wait_ns"].tolist() == [300.0, 300.0]  # raw, per collective
    r = met.ranks.set_index("rank")
    assert r.loc[0, "straggler_wait_ns"] == 200.0  # [300, 600) once, minus [300, 400)
    assert r.loc[1, "caused_wait_ns"] == 200.0
    assert met.ranks["caused_wait_ns"].sum() == met.ranks["straggler_wait_ns"].sum()


def test_public_functions_take_a_timeline_or_its_frame() -> None:
    from xsim_adapters.metrics import rank_metrics, straggler_frame, summary, timeline_frame

    trace = one_f_one_b(3, 4, 100, 200, act_bytes=40)
    tl = asap_timeline(trace, backend="asap")
    tf = timeline_frame(trace, tl)
    assert list(tf["phase_name"].iloc[:2]) == ["fwd", "pp"]
    assert (tf["elapsed_ns"] == tf["end_ns"] - tf["start_ns"]).all()
    a, b = rank_metrics(trace, tl), rank_metrics(trace, tf)
    assert a.equals(b)
    assert straggler_frame(trace, tl).equals(straggler_frame(trace, tf))
    s = summary(trace, tl)
    assert s["backend"] == "asap" and s["backend_stats"] == {"events": trace.num_ops}
    assert s == compute_metrics(trace, tl).summary


def test_straggler_split_into_dp_and_pipeline_waits() -> None:
    # 1F1B alone: every wait is a pipeline receive, none is a DP sync.
    trace = one_f_one_b(3, 4, 100, 200)
    r = compute_metrics(trace, asap_timeline(trace)).ranks
    assert (r["straggler_dp_ns"] == 0).all()
    assert (r["straggler_wait_ns"] == 0).all()  # a balanced pipeline has no straggler
    assert r["straggler_pp_ns"].iloc[0] > 0  # stage 0 waits for gradients: the pipeline drain
    # DP pair: the wait is all DP.
    trace, _ = _dp_pair(late_bwd=300, via_barrier=False)
    r = compute_metrics(trace, asap_timeline(trace)).ranks.set_index("rank")
    assert r.loc[0, "straggler_dp_ns"] == 300.0 and r.loc[0, "straggler_pp_ns"] == 0.0
    assert r.loc[0, "straggler_wait_ns"] == 300.0
