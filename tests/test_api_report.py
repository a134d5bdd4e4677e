"""The documented Python report writer ``xs.write_report`` and metrics frames indexed by names."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_output_paths import tiny_plans

import xsim_adapters as xs
from xsim_adapters import cli
from xsim_adapters.errors import OutputError, XsimError
from xsim_adapters.report.outputs import read_timeline

REPORT_FILES = ["ranks.csv", "summary.json", "timeline.parquet", "timeline.perfetto.json",
                "timeline.png"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    a, _ = tiny_plans(tmp_path_factory.mktemp("plans"))
    plan = xs.load_plan(a)
    trace = xs.generate(plan)
    tl = xs.run(trace, "flow", xs.build_topology(plan))
    return plan, trace, tl, xs.metrics(trace, tl)


def test_write_report_writes_the_run_files_safely(run, tmp_path: Path) -> None:
    _, _, tl, m = run
    out = tmp_path / "rep"
    paths = xs.write_report(m, out)
    assert sorted(p.name for p in paths) == REPORT_FILES
    assert all(p.parent == out and p.is_file() for p in paths)
    assert sorted(p.name for p in out.iterdir()) == sorted([".xsim-output", *REPORT_FILES])
    assert json.loads((out / ".xsim-output").read_text())["kind"] == "run"
    # the backend's own float times are stored, not the integer-ns metrics frame
    pd.testing.assert_frame_equal(read_timeline(out / "timeline.parquet").frame, tl.frame)
    ranks = pd.read_csv(out / "ranks.csv")
    assert ranks["breakdown_other_ns"].tolist() == m.ranks["breakdown_other_ns"].tolist()
    assert json.loads((out / "summary.json").read_text())["iteration_time_ns"] == (
        m.summary["iteration_time_ns"])
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "timeline.perfetto.json").read_text())["traceEvents"]
    # again into its own earlier output: replaced; without plots: no stale pictures
    paths = xs.write_report(m, out, plots=False)
    assert sorted(p.name for p in out.iterdir()) == [".xsim-output", "ranks.csv",
                                                      "summary.json", "timeline.parquet"]


def test_write_report_never_touches_a_foreign_directory(run, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious\n")
    with pytest.raises(OutputError, match="not an xsim output"):
        xs.write_report(run[3], mine)
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".xsim-tmp")]


def test_write_report_replaces_an_xsim_run_output_and_needs_force_for_another_kind(
        run, tmp_path: Path, monkeypatch) -> None:
    a, _ = tiny_plans(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", str(a), "--no-plots", "-o", "r"]) == 0
    xs.write_report(run[3], tmp_path / "r", plots=False)
    assert not (tmp_path / "r" / "trace").exists()  # one unit: the new report alone
    assert cli.main(["trace", str(a), "-o", "t"]) == 0
    with pytest.raises(OutputError, match="--force"):
        xs.write_report(run[3], tmp_path / "t", plots=False)
    xs.write_report(run[3], tmp_path / "t", plots=False, force=True)
    assert (tmp_path / "t" / "ranks.csv").is_file()


def test_write_report_wants_metrics(tmp_path: Path) -> None:
    with pytest.raises(XsimError, match="met: expected the Metrics"):
        xs.write_report({"iteration_time_ns": 1}, tmp_path / "x")  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()


def test_frames_are_indexed_by_names(run) -> None:
    plan, _, _, m = run
    types = sorted({g.type for g in plan.device_groups})
    assert m.device_types.index.tolist() == types == ["H100-80GB"]
    assert m.device_types.loc["H100-80GB", "mfu"] == pytest.approx(
        m.summary["device_types"]["H100-80GB"]["mfu"])
    assert m.device_types.loc["H100-80GB", "flop_count"] == m.ranks["flop_count"].sum()
    assert m.replicas.index.tolist() == list(range(plan.dp))
    assert m.replicas.loc[0, "ranks"] == plan.num_ranks
    assert (m.ranks.index == m.ranks["rank"]).all()
