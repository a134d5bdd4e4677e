"""End to end through the real plan loader, generator, topology and flow backend."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import REPO

import xsim_adapters as xs
from xsim_adapters import cli
from xsim_adapters.backends import registry
from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.errors import XsimError
from xsim_adapters.metrics import RANK_COLUMNS
from xsim_adapters.report.outputs import read_timeline

HETERO = REPO / "workloads" / "hetero-dp-h100-a100.yaml"
RESHARD = REPO / "workloads" / "hetero-pipeline-reshard.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class FlowAgain(FlowBackend):
    """The real flow backend under a second name, so compare can run two backends quickly."""

    name = "flow2"


@pytest.fixture
def two_flows(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "xsim_test_flow_again", mod)
    eps = metadata.EntryPoints([
        metadata.EntryPoint("flow", "xsim_adapters.backends.flow:FlowBackend", registry.GROUP),
        metadata.EntryPoint("flow2", "xsim_test_flow_again:FlowAgain", registry.GROUP),
    ])
    monkeypatch.setattr(registry.metadata, "entry_points", lambda **kw: eps)


def test_run_hetero_plan_writes_every_output(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert cli.main(["run", str(HETERO), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("backend flow: iteration ")
    assert "H100-80GB: 8 GPUs" in text and "A100-40GB: 8 GPUs" in text
    for name in ("timeline.parquet", "ranks.csv", "summary.json", "timeline.png",
                 "timeline.perfetto.json", "trace/manifest.json", "trace/plan.yaml"):
        assert (out / name).is_file(), name
    assert (out / "timeline.png").read_bytes()[:8] == PNG_MAGIC
    assert not list(out.rglob(".*.tmp"))
    trace = xs.read_trace(out / "trace")
    tl = read_timeline(out / "timeline.parquet")
    assert tl.backend == "flow" and len(tl.frame) == trace.num_ops
    ranks = pd.read_csv(out / "ranks.csv")
    assert list(ranks.columns) == list(RANK_COLUMNS)
    assert len(ranks) == 16 and ranks["rank"].tolist() == list(range(16))
    assert set(ranks.loc[ranks["replica"] == 1, "stage"]) == {0, 1}
    assert (ranks["non_compute_ns"] >= ranks["straggler_wait_ns"]).all()
    assert (ranks["compute_ns"] <= ranks["iteration_time_ns"] + 1e-6).all()
    s = json.loads((out / "summary.json").read_text())
    it = float(tl.frame["end_ns"].max())
    assert s["iteration_time_ns"] == round(it)  # integer ns (docs/metrics.md)
    assert s["plan"] == "llama2-7b-h100-a100" and s["backend"] == "flow" and s["ranks"] == 16
    tokens = trace.manifest["workload"]["tokens_per_iteration"]
    assert s["tokens_per_s"] == pytest.approx(tokens / (it * 1e-9))
    assert set(s["device_types"]) == {"H100-80GB", "A100-40GB"}
    for d in s["device_types"].values():
        assert 0.0 < d["mfu"] < 1.0
    # Total FLOPs over the iteration: every compute op's FLOPs land on some device type.
    flops = sum(d["flop_count"] for d in s["device_types"].values())
    assert flops == pytest.approx(float(trace.ops["flops"].sum()))
    perf = json.loads((out / "timeline.perfetto.json").read_text())
    assert perf["otherData"]["xsim"]["rule"] == "all ranks, all events"


def test_trace_then_replay_gives_the_same_timeline(tmp_path: Path, capsys) -> None:
    tdir = tmp_path / "trace"
    assert cli.main(["trace", str(RESHARD), "-o", str(tdir)]) == 0
    msg = capsys.readouterr().out
    trace = xs.read_trace(tdir)
    assert msg.startswith(f"wrote {trace.num_ops} ops (")
    assert f"{len(trace.deps)} dependency edges to {tdir}" in msg
    assert xs.load_plan(tdir / "plan.yaml") == xs.load_plan(RESHARD)
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli.main(["run", str(tdir), "-o", str(a), "--no-plots"]) == 0
    assert cli.main(["run", str(RESHARD), "-o", str(b), "--no-plots"]) == 0
    assert not (a / "timeline.png").exists()
    ta = read_timeline(a / "timeline.parquet").frame
    tb = read_timeline(b / "timeline.parquet").frame
    pd.testing.assert_frame_equal(ta, tb)  # deterministic, and the replay is faithful
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    sa.pop("backend_stats"), sb.pop("backend_stats")  # wall-clock facts differ run to run
    assert sa == sb


def test_replay_without_plan_yaml_is_a_clear_error(tmp_path: Path, capsys) -> None:
    plan = xs.load_plan(RESHARD)
    xs.write_trace(xs.generate(plan), tmp_path / "t")  # no plan given: no plan.yaml
    assert cli.main(["run", str(tmp_path / "t"), "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "no plan.yaml in the trace directory" in err and "xsim trace PLAN -o DIR" in err


def test_compare_two_backends_on_one_trace(tmp_path: Path, two_flows, capsys) -> None:
    out = tmp_path / "cmp"
    rc = cli.main(["compare", str(RESHARD), "--backends", "flow,flow2", "-o", str(out)])
    assert rc == 0
    assert "flow2 vs flow: iteration time +0.00%" in capsys.readouterr().out
    table = pd.read_csv(out / "compare.csv")
    assert {"metric", "backend_a", "value_a", "backend_b", "value_b", "abs_diff",
            "rel_diff"} <= set(table.columns)
    assert (table["abs_diff"].fillna(0) == 0).all()
    assert "phase_reshard_ns" in set(table["metric"])
    ranks = pd.read_csv(out / "compare_ranks.csv")
    assert len(ranks) == 12 and (ranks["iteration_time_ns_diff"] == 0).all()
    assert (out / "compare.png").read_bytes()[:8] == PNG_MAGIC
    for b in ("flow", "flow2"):
        assert json.loads((out / b / "summary.json").read_text())["backend"] == b


def test_api_run_and_metrics(two_flows) -> None:
    plan = xs.load_plan(RESHARD)
    trace = xs.generate(plan)
    topo = xs.build_topology(plan)
    tl = xs.run(trace, "flow", topo)
    assert isinstance(tl, xs.Timeline)
    m = xs.metrics(trace, tl)
    assert isinstance(m, xs.Metrics)
    assert m.summary["iteration_time_ns"] == round(tl.makespan_ns)
    assert len(m.replicas) == plan.dp and set(m.device_types["device_type"]) == {
        t for t in trace.manifest["device_types"]}
    # Reshard plans move activations between TP degrees: those flows show up per rank.
    assert m.ranks["comm_reshard_ns"].sum() > 0
    # The same plan through the Plan entry point gives the identical timeline.
    np.testing.assert_array_equal(xs.run(plan, "flow").frame["end_ns"], tl.frame["end_ns"])
    cmp = xs.compare_backends(plan, ["flow", "flow2"], trace=trace, topology=topo)
    assert list(cmp.pairs) == [("flow", "flow2")]
    assert (cmp.table["abs_diff"].fillna(0) == 0).all()
    with pytest.raises(XsimError, match="pass topology=build_topology"):
        xs.run(trace, "flow")
