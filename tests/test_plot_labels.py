"""Pictures say their units and what they show (issue 31): times as the terminal prints them,
labelled timeline rows, a comparison axis that keeps small differences small, labelled search
baselines, and one unit per validation axis. Checked through matplotlib artists, not pixels."""

from __future__ import annotations

import numpy as np
import pandas as pd

from validation.framework import Result, plot_figure
from xsim_adapters._units import axis_unit, fmt_ns
from xsim_adapters.report.plot import MIN_SPAN_PCT, ROW_HELP, compare_figure, timeline_figure
from xsim_adapters.search.outputs import pareto_marks
from xsim_adapters.trace.schema import KIND_COMPUTE, PHASE_INDEX


def test_times_read_like_the_terminal() -> None:
    assert fmt_ns(1_257_000_000) == "1.257 s"
    assert fmt_ns(42_132_000) == "42.132 ms"
    assert fmt_ns(2_500) == "2.500 us"
    assert fmt_ns(850) == "850 ns"
    assert fmt_ns(None) == "n/a"
    assert axis_unit(1.257e9) == (1e9, "s") and axis_unit(8e8) == (1e6, "ms")


def _timeline():
    # two ranks, 1.3 s: rank 1 computes late, rank 0 "caused" a 1.257 s wait
    tf = pd.DataFrame({
        "op_id": [0, 1], "kind": [KIND_COMPUTE] * 2, "rank": [0, 1], "dst": [-1, -1],
        "phase": [PHASE_INDEX["fwd"]] * 2, "start_ns": [0, 1_257_000_000],
        "end_ns": [1_257_000_000, 1_300_000_000], "bytes": [0, 0],
        "duration_ns": [1_257_000_000, 43_000_000],
    })
    ranks = pd.DataFrame({"rank": [0, 1], "replica": [0, 1], "stage": [0, 0],
                          "device_type": ["H100", "A100"],
                          "caused_wait_ns": [1_257_000_000, 0]})
    return tf, ranks


def test_timeline_in_seconds_with_rows_explained() -> None:
    tf, ranks = _timeline()
    ax = timeline_figure(tf, ranks, "t").axes[0]
    assert ax.get_xlabel() == "time (s); iteration 1.300 s"
    assert ax.get_ylabel() == ROW_HELP["rank"] and "r<rank> R<replica> s<stage>" in ROW_HELP["rank"]
    texts = [t.get_text() for t in ax.texts]
    assert "culprit: rank 0 made others wait 1.257 s (red row)" in texts
    assert not any("e+" in t for t in texts)
    fmt = ax.xaxis.get_major_formatter()
    assert fmt(1000.0, 0) == "1" and fmt(500.0, 0) == "0.5"  # data in ms, ticks in s


def test_a_tiny_difference_stays_small_on_the_compare_axis() -> None:
    a = {"iteration_time_ns": 1_000_000_000, "tokens_per_s": 1000.0, "mfu": 0.4,
         "means": {"compute_ns": 5e8, "comm_ns": 3e8}}
    b = {"iteration_time_ns": 1_000_400_000, "tokens_per_s": 1000.0 / 1.0004, "mfu": 0.4,
         "means": {"compute_ns": 5e8, "comm_ns": 3e8}}
    ax = compare_figure({"flow": a, "ns3": b}).axes[0]
    lo, hi = ax.get_xlim()
    assert hi >= MIN_SPAN_PCT and lo <= -MIN_SPAN_PCT  # 0.04% is 4% of the half-axis
    assert "+0.04%" in [t.get_text() for t in ax.texts]
    assert "axis at least ±1%, largest 0.04%" in ax.get_xlabel()


def test_pareto_marks_the_best_and_each_baseline() -> None:
    summary = {"search": {"best": "mixed"},
               "homogeneous": {"H100": {"same_batch": {"best": "h"}, "own_batch": {"best": "h"}},
                               "A100": {"same_batch": {"best": "a"},
                                        "own_batch": {"best": "a2"}}}}
    assert pareto_marks(summary) == [
        ("best (search)", "mixed", "*"), ("baseline: A100 only", "a", "s"),
        ("baseline: A100 only, own batch", "a2", "D"), ("baseline: H100 only", "h", "s")]
    assert pareto_marks({}) == []


def test_validation_scatter_has_one_unit_per_axis() -> None:
    rs = [Result("a", "x", "iteration_time_s", 1.0, 1.1, 0.0, ""),
          Result("a", "y", "iteration_time_s", 30.0, 29.0, 0.0, ""),
          Result("b", "z", "busbw_GBps", 150.0, 160.0, 0.0, "")]
    fig = plot_figure(rs)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["iteration time (s)",
                                               "all-reduce bus bandwidth (GB/s)"]
    # each panel holds its own metric's points only
    pts = [np.concatenate([c.get_offsets()[:, 0] for c in ax.collections]) for ax in axes]
    assert sorted(pts[0].tolist()) == [1.0, 30.0] and pts[1].tolist() == [150.0]
