"""End-to-end sweeps on the flow backend: rows, errors, jobs, the CLI (Ray: test_sweep_ray)."""

from __future__ import annotations

import math
import sys

import pandas as pd
import pytest
from helpers.sweep import TINY_PLAN, write_tiny_plan

import xsim_adapters as xs
from xsim_adapters.cli import main
from xsim_adapters.errors import BackendUnavailable
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan import parse_yaml
from xsim_adapters.sweep import TIMING_COLUMNS, make_executor, sweep
from xsim_adapters.trace.schema import KIND_COMPUTE, PHASE_INDEX

AXES = {"training.micro_batch": [1, 2, 3], "collectives.resharding": ["lcm", "direct"]}
TIMING = list(TIMING_COLUMNS)
MB3_ERROR = ("PlanError: training.global_batch: must be divisible by training.micro_batch 3 "
             "(got 8)")


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    return write_tiny_plan(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def frame(plan_path):
    return sweep(plan_path, AXES, jobs=1)


def _direct(mb: int, resharding: str):
    d = parse_yaml(TINY_PLAN)
    d["training"]["micro_batch"] = mb
    d["collectives"] = {"resharding": resharding}
    plan = plan_from_dict(d)
    trace = xs.generate(plan)
    return trace, xs.metrics(trace, xs.run(trace, "flow", topology=xs.build_topology(plan)))


def _fwd_compute(trace) -> int:
    o = trace.ops
    return int(((o["kind"] == KIND_COMPUTE) & (o["phase"] == PHASE_INDEX["fwd"])).sum())


def test_rows_follow_the_product_and_match_a_direct_run(frame):
    assert list(frame["variant"]) == list(range(6))
    assert list(frame.columns[:4]) == ["variant", "training.micro_batch",
                                      "collectives.resharding", "error"]
    assert list(frame["training.micro_batch"]) == [1, 1, 2, 2, 3, 3]
    assert list(frame["collectives.resharding"]) == ["lcm", "direct"] * 3
    for mb in (1, 2):
        trace, met = _direct(mb, "direct")
        row = frame[(frame["training.micro_batch"] == mb)
                    & (frame["collectives.resharding"] == "direct")].iloc[0]
        assert row["error"] == ""
        assert row["num_ops"] == trace.num_ops
        assert row["iteration_time_ns"] == met.summary["iteration_time_ns"]
        assert row["mfu_H100-80GB"] == met.summary["device_types"]["H100-80GB"]["mfu"]
        assert row["phase_dp_ns"] == met.summary["phases_rank_ns"]["dp"]
        assert row["mean_bubble_ns"] == met.summary["means"]["bubble_ns"]
        assert row["bubble_fraction"] == pytest.approx(met.ranks["bubble_fraction"].mean())
        assert row["wall_s"] > 0


def test_micro_batch_override_halves_the_forward_compute_ops(frame):
    # global batch 8 over 2 replicas: 4 micro-batches per replica at micro_batch 1, 2 at 2,
    # and every rank runs the same forward ops per micro-batch.
    t1, t2 = _direct(1, "lcm")[0], _direct(2, "lcm")[0]
    assert _fwd_compute(t1) == 2 * _fwd_compute(t2)
    assert _fwd_compute(t2) % (8 * 2) == 0
    nops = frame.set_index(["training.micro_batch", "collectives.resharding"])["num_ops"]
    assert nops[(1, "lcm")] == t1.num_ops and nops[(2, "lcm")] == t2.num_ops
    assert t1.num_ops != t2.num_ops


def test_an_invalid_variant_records_its_plan_error_and_the_sweep_goes_on(frame):
    bad = frame[frame["training.micro_batch"] == 3]
    assert list(bad["error"]) == [MB3_ERROR, MB3_ERROR]
    assert bad["iteration_time_ns"].isna().all() and bad["num_ops"].isna().all()
    assert (frame.loc[frame["training.micro_batch"] < 3, "error"] == "").all()


def test_jobs_1_and_2_give_identical_frames(plan_path, frame):
    two = sweep(plan_path, AXES, jobs=2)
    pd.testing.assert_frame_equal(frame.drop(columns=TIMING), two.drop(columns=TIMING))


def test_ray_executor_without_ray_says_how_to_install_it(monkeypatch, plan_path, tmp_path,
                                                         capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    with pytest.raises(BackendUnavailable, match=r'pip install "xsim-adapters\[ray\]"'):
        make_executor("ray")
    rc = main(["sweep", str(plan_path), "--set", "training.micro_batch=1", "--executor",
               "ray", "-o", str(tmp_path / "out")])
    assert rc == 1
    assert capsys.readouterr().err.startswith(
        "xsim: error: executor 'ray' needs the ray package, which is not installed: "
        'pip install "xsim-adapters[ray]"')
    assert not (tmp_path / "out").exists()


def test_cli_writes_sweep_csv_parquet_and_yaml(plan_path, tmp_path, capsys, frame):
    out = tmp_path / "out"
    argv = ["sweep", str(plan_path), "--set", "training.micro_batch=1,2,3",
            "--set", "collectives.resharding=lcm,direct", "-o", str(out)]
    assert main(argv) == 1  # micro_batch 3 failed
    text = capsys.readouterr().out
    assert text.startswith(f"6 variants of {plan_path} on flow: 4 ran, 2 failed\n")
    assert f"  variant 4 (training.micro_batch=3, collectives.resharding=lcm): {MB3_ERROR}" in text
    csv = pd.read_csv(out / "sweep.csv", keep_default_na=False, na_values=[""])
    assert list(csv.columns) == list(frame.columns)
    assert csv["iteration_time_ns"].iloc[0] == frame["iteration_time_ns"].iloc[0]
    assert csv["error"].fillna("").tolist() == frame["error"].tolist()
    pq = pd.read_parquet(out / "sweep.parquet")
    pd.testing.assert_frame_equal(pq.drop(columns=TIMING), frame.drop(columns=TIMING),
                                  check_dtype=False)
    assert "training.micro_batch: [1, 2, 3]" in (out / "sweep.yaml").read_text()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [".xsim-output"]
    assert main([*argv, "--allow-failures"]) == 0


def test_cli_sweep_file_plus_set_axes(plan_path, tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(f"base: {plan_path}\naxes:\n  training.micro_batch: [2]\n")
    out = tmp_path / "o"
    assert main(["sweep", "--sweep", str(f), "--set", "model.layers=4,6", "-o", str(out)]) == 0
    df = pd.read_csv(out / "sweep.csv")
    assert list(df[["training.micro_batch", "model.layers"]].itertuples(index=False, name=None)
                ) == [(2, 4), (2, 6)]
    assert df["num_ops"].iloc[1] > df["num_ops"].iloc[0]
    assert main(["sweep", "--sweep", str(f), "--set", "training.micro_batch=1",
                 "-o", str(out)]) == 1
    assert "--set training.micro_batch: this axis is already given" in capsys.readouterr().err
    assert main(["sweep", str(plan_path), "-o", str(out)]) == 1
    assert "no axes" in capsys.readouterr().err
    assert main(["sweep", str(plan_path), "--set", "x=1", "--backend", "nope",
                 "-o", str(out)]) == 1


def test_failed_rows_have_nan_metrics_not_zero(frame):
    row = frame.iloc[4]
    # missing (NaN for floats, <NA> for the Int64 ns columns), never 0
    assert math.isnan(row["mfu"]) and pd.isna(row["phase_fwd_ns"])


def test_sweep_help_is_full_sentences(capsys):
    from xsim_adapters import cli

    with pytest.raises(SystemExit) as ei:
        cli.main(["sweep", "--help"])
    assert ei.value.code == 0
    assert "--set PATH=V1,V2" in capsys.readouterr().out
    sub = cli.build_parser()._subparsers._group_actions[0].choices["sweep"]  # type: ignore
    for action in sub._actions:
        if action.help and action.dest != "help":
            assert action.help[0].isupper() and action.help.endswith("."), action.help
