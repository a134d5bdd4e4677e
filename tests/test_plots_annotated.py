"""The annotated timeline (bubble and straggler wait shaded, culprit marked) and the compare
picture of relative differences: checked through their matplotlib artists, not pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PolyCollection

import xsim_adapters as xs
from xsim_adapters.metrics.ranks import bubble_intervals, straggler_intervals
from xsim_adapters.report.plot import (
    COMPARE_METRICS,
    compare_figure,
    plot_compare,
    relative_differences,
    timeline_figure,
)

#: An H100 replica (one stage) beside a two-stage A100 pipeline: the A100 stages have
#: pipeline bubbles, the H100 ranks wait for the A100s at the gradient sync.
HETERO = """\
name: tiny-hetero
model: tiny-gpt
training: {global_batch: 4, micro_batch: 1, schedule: 1f1b}
device_groups:
  h100: {type: H100-80GB, nodes: 1, gpus_per_node: 2}
  a100: {type: A100-40GB, nodes: 1, gpus_per_node: 4}
network:
  scale_out: {topology: leaf_spine, link_gbps: 400, latency_us: 1.0}
replicas:
  - stages:
      - {group: h100, devices: [0, 2], tp: 2, layers: [0, 4]}
  - stages:
      - {group: a100, devices: [0, 2], tp: 2, layers: [0, 2]}
      - {group: a100, devices: [2, 4], tp: 2, layers: [2, 4]}
"""


@pytest.fixture(scope="module")
def met():
    plan = xs.load_plan(HETERO)
    trace = xs.generate(plan)
    return xs.metrics(trace, xs.run(plan, "flow", trace=trace))


def test_shaded_intervals_add_up_to_the_metrics(met) -> None:
    n = len(met.ranks)
    k, s, e = bubble_intervals(met.timeline, n, met.stragglers)
    assert (e > s).all()
    np.testing.assert_array_equal(np.rint(np.bincount(k, e - s, n)).astype(np.int64),
                                  met.ranks["bubble_ns"].to_numpy())
    k, s, e = straggler_intervals(met.stragglers, met.timeline)
    np.testing.assert_array_equal(np.rint(np.bincount(k, e - s, n)).astype(np.int64),
                                  met.ranks["straggler_wait_ns"].to_numpy())
    assert met.ranks["bubble_ns"].max() > 0 and met.ranks["straggler_wait_ns"].max() > 0


def test_timeline_shades_bubble_and_straggler_wait_and_marks_the_culprit(met) -> None:
    fig = timeline_figure(met.timeline, met.ranks, "t", met.stragglers)
    ax = fig.axes[0]
    shaded = {c.get_label(): c for c in ax.collections if isinstance(c, PolyCollection)}
    assert {"pipeline bubble", "straggler wait"} <= set(shaded)
    # one shaded block per rank row and gap: bubble rows are the A100 stages (ranks 2..5 have
    # bubbles only where bubble_ns > 0), straggler rows the H100 ranks
    bubble_rows = {int(np.floor(p.vertices[:, 1].min())) for p in shaded["pipeline bubble"]
                   .get_paths()}
    assert bubble_rows == set(np.flatnonzero(met.ranks["bubble_ns"].to_numpy() > 0).tolist())
    wait_rows = {int(np.floor(p.vertices[:, 1].min())) for p in shaded["straggler wait"]
                 .get_paths()}
    assert wait_rows == set(np.flatnonzero(met.ranks["straggler_wait_ns"].to_numpy() > 0)
                            .tolist())
    culprit = int(met.ranks["caused_wait_ns"].idxmax())
    notes = [t for t in ax.texts if t.get_gid() == "culprit"]
    assert len(notes) == 1 and notes[0].get_text().startswith(f"culprit: rank {culprit} ")
    tick = ax.get_yticklabels()[culprit]
    assert tick.get_color() == "#d62728" and tick.get_fontweight() == "bold"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "pipeline bubble" in legend and "straggler wait" in legend


def test_no_culprit_mark_without_waits(met) -> None:
    ranks = met.ranks.assign(caused_wait_ns=0)
    ax = timeline_figure(met.timeline, ranks, "t").axes[0]
    assert not [t for t in ax.texts if t.get_gid() == "culprit"]
    labels = {c.get_label() for c in ax.collections}
    assert "straggler wait" not in labels  # no straggler frame given: nothing to shade


def test_compare_picture_shows_relative_differences(met, tmp_path: Path) -> None:
    ref = met.summary
    other = {**ref, "iteration_time_ns": ref["iteration_time_ns"] * 1.1,
             "means": {**ref["means"], "bubble_ns": 0}}
    rel = relative_differences({"ns3": ref, "flow": other})
    assert list(rel.columns) == ["flow"] and len(rel) == len(COMPARE_METRICS)
    assert rel.loc["iteration time (ms)", "flow"] == pytest.approx(10.0)
    assert rel.loc["mean bubble (ms)", "flow"] == pytest.approx(-100.0)
    assert rel.loc["tokens/s", "flow"] == pytest.approx(0.0)
    ax = compare_figure({"ns3": ref, "flow": other}).axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert widths[0] == pytest.approx(10.0) and len(widths) == len(COMPARE_METRICS)
    texts = [t.get_text() for t in ax.texts if t.get_gid() == "rel-diff"]
    assert texts[0] == "+10%" and "-100%" in texts and "+0%" in texts
    assert "relative to ns3" in ax.get_xlabel()
    assert plot_compare(tmp_path / "c.png", {"ns3": ref, "flow": other}).read_bytes()[:4] \
        == b"\x89PNG"


def test_metric_frames_are_indexed_by_names(met) -> None:
    assert met.device_types.index.tolist() == ["A100-40GB", "H100-80GB"]
    assert met.device_types.loc["H100-80GB", "ranks"] == 2
    assert met.ranks.index.tolist() == met.ranks["rank"].tolist()
