"""The validation suite's fast subset (Megatron-LM SC21 Table 1, smallest rows) in CI.

Fails if the median absolute error of the fast subset regresses beyond MEDIAN_LIMIT or any fast
case beyond WORST_LIMIT (docs/validation.md states both and what they were when set).
"""

from __future__ import annotations

import csv

import pytest

from validation import framework as fw
from validation import megatron_sc21 as sc21

MEDIAN_LIMIT = 0.08  # the target for the SC21 table; the fast rows measure 2.8-9.1%
WORST_LIMIT = 0.15


def test_fast_subset_error_stays_within_limits(tmp_path) -> None:
    cases = fw.select(fw.discover(), [sc21.SOURCE], fast_only=True)
    assert [c.label for c in cases] == [
        "1.7B tp1 pp1 32gpu", "3.6B tp2 pp1 64gpu", "7.5B tp4 pp1 128gpu"]  # fmt: skip
    results = fw.run_cases(cases, log=lambda s: None)
    s = fw.summary(results)[sc21.SOURCE]
    assert s["median_abs_error"] <= MEDIAN_LIMIT, fw.markdown_table(results)
    assert abs(s["worst_error"]) <= WORST_LIMIT, fw.markdown_table(results)
    fw.write_csv(results, tmp_path / "r.csv")
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert [r["label"] for r in rows] == [c.label for c in cases]
    assert float(rows[0]["error_pct"]) == pytest.approx(100 * results[0].error, abs=0.01)
    fw.write_plot(results, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_sc21_plans_follow_the_paper() -> None:
    row = sc21.rows()[4]  # 39.1B: tp 8, pp 2, dp 32, batch 1536
    d = sc21.plan_dict(row)  # the whole plan: every replica, the DP all-reduce simulated
    assert d["training"]["global_batch"] == 1536
    assert d["replicas"]["uniform"] == {"group": "a100", "tp": 8, "pp": 2, "dp": 32}
    assert d["model"]["hidden"] == 8192 and d["model"]["ffn_hidden"] == 4 * 8192
    assert d["device_groups"]["a100"] == {"type": "A100-80GB", "nodes": 64, "gpus_per_node": 8}
    assert d["training"]["overlap"] == {"dp_grad_reduce": False}  # 2021 local DDP
    one = sc21.plan_dict(row, replicas=1)  # one replica with its share of the batch
    assert one["training"]["global_batch"] == 1536 // 32
    assert one["device_groups"]["a100"]["nodes"] == 2
    # the measured iteration time is the paper's Eq. 3 FLOPs / (GPUs x TFLOP/s per GPU)
    b, s, layers, h, v = 1536, 2048, 48, 8192, 51200
    f = 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert row["derived_iter_time_s"] == pytest.approx(f / (512 * 138e12), rel=0.01)


def test_dp_allreduce_is_the_ring_formula() -> None:
    row = sc21.rows()[0]  # 1.7B, tp 1, pp 1, dp 32: every GPU holds all parameters
    nbytes = sc21.stage_grad_bytes(row)
    from xsim_adapters.plan.model import ModelSpec
    from xsim_adapters.plan.params import model_params

    m = ModelSpec("g", 24, 2304, 9216, 24, 24, 2048, 51200, "fp16", False)
    assert nbytes == pytest.approx(2 * model_params(m))
    want = 2 * 31 / 32 * nbytes / 25e9 + (8.4 + 62 * 14.0) * 1e-6
    assert sc21.dp_allreduce_s(row) == pytest.approx(want)


def test_discover_and_select() -> None:
    sources = fw.discover()
    assert sc21.SOURCE in sources
    with pytest.raises(ValueError, match="unknown source"):
        fw.select(sources, ["nope"])
    r = fw.Result("s", "l", "m", 2.0, 2.5, 0.0)
    assert r.error == pytest.approx(0.25)


def test_results_csv_round_trips(tmp_path) -> None:
    rs = [fw.Result("s", "a", "m", 2.0, 2.5, 1.0, "n1"), fw.Result("s", "b", "m", 4.0, 3.0, 2.0)]
    fw.write_csv(rs, tmp_path / "r.csv")
    back = fw.read_csv(tmp_path / "r.csv")
    assert [(r.label, r.measured, r.predicted, r.notes) for r in back] == [
        ("a", 2.0, 2.5, "n1"), ("b", 4.0, 3.0, "")]  # fmt: skip
    assert fw.summary(back)["s"]["median_abs_error"] == pytest.approx((0.25 + 0.25) / 2)


# ---------------------------------------------------------------- training-throughput sources


def test_training_plans_follow_their_sources() -> None:
    """Plan writers: the published configurations, and the metrics derived from them by hand."""
    from validation import amp_hetero, bloom_176b, llama3_405b, megascale_megatron
    from validation import megatron_core_h100 as mc
    from validation import nemo_h100 as nemo

    # Megatron-LM README, 1.7B row: 16 heads, h 2048, 24 layers, 48 GPUs, batch 192, 408.8 TF
    r = mc.rows()[0]
    s, v, h, layers = 4096, 131072, 2048, 24
    f = 12 * 192 * s * layers * h * h * ((1 + 1 + s / h) + 4 + v / (2 * layers * h))
    assert mc.measured_iteration_s(r) == pytest.approx(f / (48 * 408.8e12))
    d = mc.plan_dict(mc.rows()[4])  # 70B: TP 8, PP 2, DP 48, batch 384
    # Megatron-Core's rank order: the pipeline outermost (docs/plan.md, uniform `order`)
    assert d["replicas"]["uniform"] == {"group": "g", "tp": 8, "pp": 2, "dp": 48,
                                        "order": "tp-dp-pp"}
    assert d["training"]["overlap"]["tp_comm"] and d["training"]["sequence_parallel"]
    assert d["collectives"] == {"channels": 1}  # a TP 8 DP ring has one GPU (one NIC) a server
    assert mc.plan_dict(r)["collectives"] == {"channels": 8}
    # NeMo Llama 2 7B: 128 x 4096 tokens over 8 GPUs at 16934 tokens/s/GPU
    n = next(x for x in nemo.rows() if x["model"] == "LLAMA2-7B")
    assert nemo.measured_iteration_s(n) == pytest.approx(128 * 4096 / (8 * 16934))
    d = nemo.plan_dict(next(x for x in nemo.rows() if x["model"] == "LLAMA3-70B"))
    assert d["replicas"]["uniform"] == {"group": "g", "tp": 4, "pp": 4, "dp": 4, "cp": 2,
                                        "order": "tp-dp-pp"}
    assert d["training"]["schedule"] == "interleaved" and d["training"]["virtual_stages"] == 5
    assert d["training"]["precision"] == "fp8" and d["training"]["grad_reduce_dtype"] == "bf16"
    # Llama 3 and BLOOM: one layer fewer on the first and the last stage
    sizes = [b - a for a, b in llama3_405b.stage_layers(16)]
    assert sizes == [7] + [8] * 14 + [7]
    sizes = [b - a for a, b in bloom_176b.stage_layers(70, 12)]
    assert sizes == [5] + [6] * 10 + [5]
    d = bloom_176b.plan_dict(bloom_176b.rows()[0])  # Megatron-DeepSpeed order: pipe, data, model
    assert d["replicas"][1]["stages"][2]["devices"] == [2 * 8 * 4 + 1 * 4, 2 * 8 * 4 + 8]
    assert megascale_megatron.rows()[0] == {"batch": 768, "gpus": 256, "iteration_s": 40.0}
    # AMP: DeepSpeed's 30-entry layer list and rank order; every replica the same micro-batches
    assert amp_hetero.stage_layers([0, 7, 14, 20, 30]) == [(0, 5), (5, 12), (12, 18), (18, 24)]
    assert amp_hetero.stage_layers([0, 1, 2, 30]) is None  # a stage without a layer
    row = {"cluster": "v100x12+t4x4", "micro_batch": 2, "tp": 2, "dp": 2, "pp": 4,
           "layers": [(0, 6), (6, 12), (12, 18), (18, 24)]}
    d = amp_hetero.plan_dict(row)
    last = d["replicas"][1]["stages"][3]  # rank 3 * 2 * 2 + 1 * 2 = 14: the T4 server
    assert (last["group"], last["devices"]) == ("t4", [2, 4])
    assert [rep["micro_batches"] for rep in d["replicas"]] == [8, 8]  # 32 / (2 x 2)


# Bounds on the fast subsets of the training sources: about 1.2x the median and worst |error|
# they measure on this branch (docs/validation.md has the numbers), so a change that moves them
# much further from the measurements fails. All three are under-predicted today: the H100 rows
# by 15-30% (the compute model's GEMMs run at 95-97% of the MAMF on shapes where the real runs
# reach less), AMP's 2020-21 DeepSpeed stack by 15-55% (its host-side costs).
FAST_BOUNDS = {  # source: (median |error|, worst |error|)
    "nemo-h100": (0.19, 0.21),  # measured 15.8%, 17.3% (Llama 2 7B, Llama 3 8B, 8 GPUs)
    "megatron-core-h100": (0.22, 0.29),  # measured 18.3%, 23.9% (1.7B, 7.1B)
    "amp-hetero": (0.43, 0.64),  # measured 35.8%, 53.0% (12 trials)
}


@pytest.mark.slow
@pytest.mark.parametrize("source", sorted(FAST_BOUNDS))
def test_training_source_fast_subset_within_bounds(source: str) -> None:
    cases = fw.select(fw.discover(), [source], fast_only=True)
    assert cases, source
    results = fw.run_cases(cases, log=lambda s: None)
    s = fw.summary(results)[source]
    median, worst = FAST_BOUNDS[source]
    assert s["median_abs_error"] <= median, fw.markdown_table(results)
    assert abs(s["worst_error"]) <= worst, fw.markdown_table(results)
    # every prediction is a positive, finite iteration time from a whole simulated plan
    assert all(0 < r.predicted < 100 * r.measured for r in results)


def test_a_case_that_raises_is_reported_and_the_others_still_run(tmp_path, monkeypatch,
                                                                 capsys) -> None:
    """``run_cases`` with a failures list logs the simulator's error, skips that case and runs
    the rest; ``python -m validation`` writes the others and exits 1 naming the failed case;
    without the list the error propagates."""
    from validation import __main__ as cli
    from xsim_adapters.errors import PlanError

    def boom() -> float:
        raise PlanError("", "the plan's trace would have about 87,225,280 ops")

    cases = [fw.Case("src", "ok-1", "x_s", 2.0, lambda: 2.2), fw.Case("src", "big", "x_s", 1.0,
             boom), fw.Case("src", "ok-2", "x_s", 4.0, lambda: 3.0)]
    lines: list[str] = []
    failures: list = []
    res = fw.run_cases(cases, log=lines.append, failures=failures)
    assert [r.label for r in res] == ["ok-1", "ok-2"]
    assert res[0].error == pytest.approx(0.1) and res[1].error == pytest.approx(-0.25)
    assert [c.label for c, _ in failures] == ["big"]
    assert "FAILED PlanError: the plan's trace would have about 87,225,280 ops" in lines[1]
    with pytest.raises(PlanError):
        fw.run_cases(cases, log=lambda s: None)
    monkeypatch.setattr(fw, "select", lambda *a, **k: cases)
    assert cli.main(["--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "error: src big: PlanError: the plan's trace would have about 87,225,280 ops" in err
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [r["label"] for r in rows] == ["ok-1", "ok-2"]
