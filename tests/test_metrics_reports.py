"""Reports: Perfetto JSON, timeline and compare pictures, progress bar, atomic run outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers.metrics import TraceBuilder, asap_timeline, one_f_one_b

from xsim_adapters.metrics import compute_metrics
from xsim_adapters.report import (
    perfetto_trace,
    plot_compare,
    plot_timeline,
    timeline_rows,
    write_atomic,
    write_perfetto,
)
from xsim_adapters.report.outputs import read_timeline, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pipeline():
    trace = one_f_one_b(4, 6, 1000, 2000, act_bytes=500)
    tl = asap_timeline(trace)
    return trace, tl, compute_metrics(trace, tl)


def _wide(n_ranks: int, tp: int) -> tuple:
    """``n_ranks`` ranks in replicas of 2 stages of ``tp`` ranks, 2 ops each + a tp flow."""
    tb = TraceBuilder([("g", "H100")] * n_ranks)
    for r in range(n_ranks):
        stage_size = 2 * tp
        rep, st = divmod(r, stage_size)
        f = tb.compute(r, 100 + r % 7, "fwd", rep, st // tp, 0)
        peer = (r // tp) * tp + (r + 1) % tp
        x = tb.flow(r, peer, 80, "tp", (f,), replica=rep, stage=st // tp)
        tb.compute(r, 200, "bwd", rep, st // tp, 0, (x,))
    trace = tb.build()
    return trace, compute_metrics(trace, asap_timeline(trace))


def test_perfetto_events_are_valid_and_in_microseconds(pipeline) -> None:
    trace, tl, met = pipeline
    doc = json.loads(json.dumps(perfetto_trace(met.timeline, met.ranks)))
    ev = doc["traceEvents"]
    x = [e for e in ev if e["ph"] == "X"]
    comp = trace.ops[trace.ops["kind"] == 0]
    assert len([e for e in x if e["tid"] % 8 == 0]) == len(comp)
    first = next(e for e in x if e.get("args", {}).get("op_id") == 0)
    assert first["ts"] == 0.0 and first["dur"] == 1.0  # 1000 ns = 1 us
    assert first["pid"] == 1 and first["tid"] == 0 and first["name"] == "fwd"
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert names[(1, 0)] == "rank 0 s0 H100 compute"
    assert names[(1, 8 * 1 + 2)] == "rank 1 s1 H100 pp"
    assert {e["args"]["name"] for e in ev if e["name"] == "process_name"} == {"replica 0"}
    # No two events on one track overlap (overlapping "X" slices do not nest in Perfetto).
    df = pd.DataFrame(x).sort_values(["pid", "tid", "ts"])
    nxt = df.groupby(["pid", "tid"])["ts"].shift(-1)
    assert ((df["ts"] + df["dur"] <= nxt + 1e-9) | nxt.isna()).all()
    assert doc["otherData"]["xsim"]["rule"] == "all ranks, all events"


def test_perfetto_cap_keeps_one_rank_per_stage_then_truncates() -> None:
    trace, met = _wide(64, tp=4)
    full = perfetto_trace(met.timeline, met.ranks)["otherData"]["xsim"]
    assert full["events_written"] == full["events_total"] == 64 * 2 + 64
    capped = perfetto_trace(met.timeline, met.ranks, max_events=100)
    info = capped["otherData"]["xsim"]
    assert info["rule"] == "lowest rank of each (replica, stage)"
    # 8 replicas x 2 stages = 16 representative ranks, 2 compute + 1 tp block each.
    assert info["events_written"] == 16 * 3
    tids = {e["tid"] // 8 for e in capped["traceEvents"] if e["ph"] == "X"}
    assert tids == set(range(0, 64, 4))
    tiny = perfetto_trace(met.timeline, met.ranks, max_events=10)["otherData"]["xsim"]
    assert tiny["events_written"] == 10
    assert tiny["rule"].endswith("earliest 10 events by start time")


def test_timeline_png_per_rank_and_summarized(tmp_path: Path, pipeline) -> None:
    _, _, met = pipeline
    p = plot_timeline(tmp_path / "t.png", met.timeline, met.ranks, "1f1b")
    assert p.read_bytes()[:8] == PNG_MAGIC
    rows, labels, what = timeline_rows(met.ranks)
    assert what == "rank" and labels[0] == "r0 R0 s0 H100" and rows.tolist() == [0, 1, 2, 3]
    _, wide = _wide(1024, tp=8)
    rows, labels, what = timeline_rows(wide.ranks)
    assert what.startswith("(replica, stage)")
    assert len(labels) == 128 and labels[0] == "R0 s0 H100 x8"
    p2 = plot_timeline(tmp_path / "w.png", wide.timeline, wide.ranks)
    assert p2.read_bytes()[:8] == PNG_MAGIC
    assert not list(tmp_path.glob(".*.tmp"))


def test_compare_png(tmp_path: Path, pipeline) -> None:
    _, _, met = pipeline
    p = plot_compare(tmp_path / "c.png", {"flow": met.summary, "ns3": met.summary})
    assert p.read_bytes()[:8] == PNG_MAGIC


def test_write_run_outputs_round_trip(tmp_path: Path, pipeline) -> None:
    trace, tl, met = pipeline
    paths = write_run(tmp_path / "out", tl, met)
    assert sorted(p.name for p in paths) == sorted([
        "timeline.parquet", "ranks.csv", "summary.json", "timeline.png",
        "timeline.perfetto.json"])
    back = read_timeline(tmp_path / "out" / "timeline.parquet")
    assert back.backend == "asap"
    pd.testing.assert_frame_equal(back.frame, tl.frame)
    ranks = pd.read_csv(tmp_path / "out" / "ranks.csv")
    for col in ("rank", "group", "device_type", "replica", "stage", "iteration_time_ns",
                "compute_ns", "comm_ns", "exposed_comm_ns", "bubble_ns", "straggler_wait_ns",
                "idle_ns", "non_compute_ns", "bubble_fraction", "comm_pp_ns",
                "flop_count", "breakdown_other_ns"):
        assert col in ranks.columns
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    for key in ("plan", "backend", "iteration_time_ns", "tokens_per_s", "ranks", "rank_ns_sums",
                "phases_rank_ns", "flop_count", "means", "device_types", "mfu"):
        assert key in s
    assert s["iteration_time_ns"] == float(tl.frame["end_ns"].max())
    assert json.loads((tmp_path / "out" / "timeline.perfetto.json").read_text())["traceEvents"]
    # A later run without plots must not leave the old pictures beside its numbers.
    write_run(tmp_path / "out", tl, met, plots=False)
    assert not (tmp_path / "out" / "timeline.png").exists()
    assert not (tmp_path / "out" / "timeline.perfetto.json").exists()


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    target.write_text("old")

    def boom(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(target, boom)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_write_perfetto_is_compact_json(tmp_path: Path, pipeline) -> None:
    _, _, met = pipeline
    p = write_perfetto(tmp_path / "t.perfetto.json", met.timeline, met.ranks)
    text = p.read_text()
    assert text.startswith('{"traceEvents":[') and "\n" not in text
