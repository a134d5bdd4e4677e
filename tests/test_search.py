"""xsim search: the bound against the flow backend, branch and bound against exhaustive
evaluation, the shipped plans, spec errors, outputs and resumption."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import REPO

from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import load_plan
from xsim_adapters.plan import plan_to_dict
from xsim_adapters.search import load_search_spec, search, spec_from_dict
from xsim_adapters.search.bnb import Searcher, enumerate_space, outcome_summary
from xsim_adapters.search.bound import Analyzer
from xsim_adapters.search.evaluate import Evaluator, run_candidate
from xsim_adapters.search.space import plan_dict
from xsim_adapters.sweep.runner import run_variant

SMALL = REPO / "tests" / "data" / "search" / "small-4gpu.yaml"


@pytest.fixture(scope="module")
def exhaustive():
    """Every feasible candidate of the small space, simulated on the flow backend."""
    return search(SMALL, exhaustive=True, baselines=False)


def _ok(e) -> bool:
    return e.row is not None and e.row.get("error") == ""


@pytest.mark.slow  # 38 simulations (about 15 s of CPU)
def test_bound_never_above_simulated_time_over_the_small_space(exhaustive):
    sims = [e for e in exhaustive.entries if _ok(e)]
    assert len(sims) == exhaustive.summary["feasible"] > 20
    for e in sims:
        assert e.full  # exhaustive evaluation refines every bound
        assert e.lb_ns <= e.row["iteration_time_ns"], e.cand.key
    # the bound is informative: within 20% of the simulated time on every plan of the space.
    # Measured worst 0.829 (a:tp2pp1x1 h:tp1pp1x2, DP 3 over two servers); with bf16 gradient
    # reduction instead of the fp32 default it is 0.886: the DP floor counts the bytes that
    # must cross a server's cut after they are ready, not the ring's step-by-step dependence,
    # so doubling the DP bytes widens the exposed sync the bound does not see
    worst = min(e.lb_ns / e.row["iteration_time_ns"] for e in sims)
    assert worst >= 0.80


@pytest.mark.slow  # shares the exhaustive fixture
def test_branch_and_bound_finds_the_exhaustive_best_with_fewer_simulations(exhaustive):
    spec = load_search_spec(SMALL)
    an = Analyzer(spec)
    entries = enumerate_space(spec, an)
    calls: list[int] = []

    def counted(task):  # the real simulator, counted
        calls.append(1)
        return run_candidate(task)

    res = search(spec, evaluator=Evaluator(run=counted), baselines=False, entries=entries,
                 analyzer=an)
    ex_best = min((e for e in exhaustive.entries if _ok(e)),
                  key=lambda e: (e.row["iteration_time_ns"], e.cand.key))
    assert res.best is not None and res.best.cand.key == ex_best.cand.key
    assert res.best.row["iteration_time_ns"] == ex_best.row["iteration_time_ns"]
    assert res.summary["space_size"] == len(exhaustive.entries)
    assert res.summary["evaluated"] == len(calls) < res.summary["feasible"]
    assert res.summary["proven_optimal"]
    counts = res.summary["prune_counts"]
    assert sum(counts.values()) == res.summary["space_size"]
    assert counts["pruned:bound"] == res.summary["feasible"] - len(calls)


@pytest.mark.slow  # 8 simulations
def test_bound_below_simulated_time_on_random_plans_of_a_richer_space():
    """Random candidates over schedules, recompute, ZeRO, sequence parallel and 3 types."""
    spec = spec_from_dict(yaml.safe_load("""
name: rich
model: {layers: 6, hidden: 256, ffn_hidden: 704, heads: 4, kv_heads: 2, seq_len: 128,
        vocab: 512}
training: {global_batch: [8, 12], zero_stage: 1, sequence_parallel: true}
device_groups:
  h: {type: H100-80GB, nodes: 1, gpus_per_node: 4}
  a: {type: A100-40GB, nodes: 1, gpus_per_node: 2}
  l: {type: L40S, nodes: 2, gpus_per_node: 1}
space: {tp: [1, 2, 4], pp_min: 1, pp_max: 3, schedules: [1f1b, gpipe, zb_h1],
        micro_batch: [1, 2], recompute: [none, selective, full], mix_types: true,
        resharding: [lcm, gather_p2p_scatter, direct], layer_split: [balanced, even]}
"""))
    an = Analyzer(spec)
    feasible = [e for e in enumerate_space(spec, an) if e.status == ""]
    rng = random.Random(13)
    picks = rng.sample(feasible, 8)
    for e in picks:
        row = run_candidate({"plan": plan_dict(spec, e.cand)})
        assert row["error"] == "", (e.cand.key, row["error"])
        lb = an.lower_bound_ns(e.cand)
        assert e.lb_ns <= lb <= row["iteration_time_ns"], e.cand.key


def _spec_for_plan(path: Path, space: dict, budget: dict) -> dict:
    raw = yaml.safe_load(path.read_text())
    raw.pop("replicas")
    raw["name"] = raw["name"] + "-search"
    raw["space"] = space
    raw["budget"] = budget
    return raw


SHIPPED = [
    pytest.param("uneven-layers.yaml", {"tp": [2, 4], "pp_max": 2}, marks=pytest.mark.slow),
    pytest.param("hetero-pipeline-reshard.yaml", {"tp": [4, 8], "pp_max": 2, "mix_types": True},
                 marks=pytest.mark.slow),
    ("congested-incast-slow-nic.yaml", {"tp": [1, 4], "pp_max": 2, "mix_types": True}),
    pytest.param("homogeneous-h100.yaml", {"tp": [4, 8], "pp_max": 2},
                 marks=pytest.mark.slow),
    pytest.param("hetero-dp-h100-a100.yaml", {"tp": [4, 8], "pp_max": 2},
                 marks=pytest.mark.slow),
    pytest.param("congested-mixed-nic-leaf.yaml", {"tp": [8], "pp_max": 1},
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("plan", "space"), SHIPPED)
def test_found_plan_at_least_as_fast_as_the_shipped_plan(plan, space):
    path = REPO / "workloads" / plan
    spec = spec_from_dict(_spec_for_plan(path, space, {"evaluations": 6, "wave": 2}))
    res = search(spec, baselines=False, top=1)
    shipped = run_variant({"plan": plan_to_dict(load_plan(path))})
    assert shipped["error"] == ""
    assert res.best is not None
    assert res.best.row["iteration_time_ns"] <= shipped["iteration_time_ns"], (
        res.best.cand.key, res.best.row["iteration_time_ns"], shipped["iteration_time_ns"])


@pytest.mark.parametrize(("patch", "message"), [
    ({"space": {"tp": [3]}}, "space.tp: expected a TP degree dividing the 2 GPUs"),
    ({"space": {"pp_min": 3, "pp_max": 2}}, "space.pp_max: expected at least pp_min = 3 (got 2)"),
    ({"space": {"schedules": ["1f1b", "pipedream"]}},
     "space.schedules[1]: expected one of 1f1b, gpipe, zb_h1, interleaved (got 'pipedream')"),
    ({"space": {"colour": 1}}, "space.colour: unknown key; expected one of tp, pp_min"),
    ({"training": {"global_batch": [8, 0]}},
     "training.global_batch[1]: expected a positive integer (got 0)"),
    ({"prices_per_gpu_hour": {"H100-80GB": 2.0}},
     "prices_per_gpu_hour.A100-40GB: required because H100-80GB has a price (got nothing)"),
    ({"objective": "cost"}, "objective: expected prices_per_gpu_hour for objective cost"),
    ({"budget": {"evaluations": -1}}, "budget.evaluations: expected a positive integer (got -1)"),
    ({"device_groups": {"h": {"type": "H100-80GB", "nodes": 0, "gpus_per_node": 2}}},
     "device_groups.h.nodes: expected a positive integer (got 0)"),
])
def test_spec_errors_name_the_yaml_path(patch, message):
    raw = yaml.safe_load(SMALL.read_text())
    for k, v in patch.items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    with pytest.raises(PlanError) as err:
        spec_from_dict(raw)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_layer_split_balances_the_compute_model_and_batch_split_covers_the_batch():
    spec = load_search_spec(SMALL)
    an = Analyzer(spec)
    for e in enumerate_space(spec, an):
        if e.status != "":
            continue
        for part, lay, ms in zip(e.cand.parts, e.cand.layers, e.cand.micro_batches,
                                 strict=True):
            assert lay[0][0] == 0 and lay[-1][1] == spec.model.layers
            assert all(a < b for a, b in lay)
            assert all(b == c for (_, b), (c, _) in zip(lay, lay[1:], strict=False))
            assert len(ms) == part.count
        total = sum(sum(ms) for ms in e.cand.micro_batches)
        assert total * e.cand.choice.micro_batch == e.cand.choice.global_batch


def test_cli_writes_outputs_and_resume_simulates_nothing_new(tmp_path, monkeypatch, capsys):
    from xsim_adapters import cli
    from xsim_adapters.search import evaluate

    calls: list[int] = []

    def counted(task):
        calls.append(1)
        return run_candidate(task)

    monkeypatch.setattr(evaluate.Evaluator.__init__, "__defaults__",
                        (None, "flow", None, None, None, None, counted, "auto"))
    out = tmp_path / "s"
    argv = ["search", str(SMALL), "-o", str(out), "--max-evaluations", "3", "--top", "2"]
    assert cli.main(argv) == 0
    first = len(calls)
    assert 0 < first
    files = {p.name for p in out.iterdir()}
    assert {"best.yaml", "candidates.csv", "candidates.parquet", "pareto.png", "summary.json",
            "search.rows.jsonl", "top"} <= files
    plan = load_plan(out / "best.yaml")
    assert plan.training.global_batch == 8
    frame = pd.read_csv(out / "candidates.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(frame) == summary["space_size"]
    assert summary["status_counts"] == frame["status"].value_counts().sort_index().to_dict()
    assert sum(summary["prune_counts"].values()) == len(frame)
    assert "speedup_same_batch" in summary["homogeneous"]["H100-80GB"]
    assert sorted(p.name for p in (out / "top").iterdir()) == ["01.yaml", "02.yaml"]
    # a resumed search replays the same decisions from the rows file: no new simulation
    assert cli.main([*argv, "--resume"]) == 0
    assert len(calls) == first
    again = json.loads((out / "summary.json").read_text())
    assert again["search"] == summary["search"] and again["simulated_now"] == 0
    # without --resume the earlier output is replaced, and everything is simulated again
    assert cli.main(argv) == 0
    assert len(calls) == 2 * first
    assert "best:" in capsys.readouterr().out


@pytest.mark.parametrize("path", sorted((REPO / "workloads" / "search").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_shipped_search_specs_load(path):
    spec = load_search_spec(path)
    assert spec.budget.evaluations is not None  # every shipped spec is bounded
    assert len(spec.device_groups) >= 2


@pytest.mark.parametrize("objective", ["throughput", "cost"])
def test_branch_and_bound_logic_matches_exhaustive_with_a_fake_simulator(objective):
    """Simulator faked (time = bound x a digest-derived factor in [1, 2)): checks the search
    logic itself, both objectives, on the 16-GPU example space, in milliseconds."""
    import hashlib

    spec = load_search_spec(REPO / "workloads" / "search" / "h100-a100-16gpu.yaml")
    raw = dict(spec.raw, objective=objective, budget={"wave": 3})
    spec = spec_from_dict(raw, spec.base_dir)
    an = Analyzer(spec)
    entries = enumerate_space(spec, an)
    # the fake's times are at least the full bound, which the search refines lazily
    lb = {json.dumps(plan_dict(spec, e.cand), sort_keys=True): an.lower_bound_ns(e.cand)
          for e in entries if e.status == ""}

    def fake(task):
        key = json.dumps(task["plan"], sort_keys=True)
        factor = 1 + int(hashlib.sha256(key.encode()).hexdigest()[:4], 16) / 65536
        t = lb[key] * factor
        tokens = task["plan"]["training"]["global_batch"] * spec.model.seq_len
        return {"error": "", "iteration_time_ns": t, "tokens_per_s": tokens / t * 1e9,
                "mfu": 0.5}

    results = {}
    for exhaustive in (True, False):
        ev = Evaluator(run=fake)
        s = Searcher(spec, [dataclasses.replace(e) for e in entries], ev, analyzer=an)
        o = s.run("x", exhaustive=exhaustive)
        results[exhaustive] = (o.best.cand.key, o.evaluated, s)
    assert results[True][0] == results[False][0]
    assert results[False][1] < results[True][1] == sum(e.status == "" for e in entries)
    s = results[True][2]
    if objective == "cost":  # $ per million tokens = $/s x seconds per token x 1e6
        e = next(x for x in s.entries if x.row is not None)
        c = e.cand
        gpus_price = sum(2.50 * t * pp * p.count if g == "h100" else 1.10 * t * pp * p.count
                         for p in c.parts for g, t, pp in zip(p.groups, p.tp, p.pp, strict=True))
        want = gpus_price / 3600 * e.row["iteration_time_ns"] * 1e-9 / (
            c.choice.global_batch * spec.model.seq_len) * 1e6
        assert s.objective(c, e.row["iteration_time_ns"]) == pytest.approx(want, rel=1e-12)


def test_every_pass_reports_its_proven_bound_over_its_best():
    """bound_over_best is 1.0 for a finished pass and, for one stopped by its budget, the
    least objective bound of the candidates left unreached over the best (fake simulator:
    time = 1.5 x the full bound)."""
    spec = load_search_spec(REPO / "workloads" / "search" / "h100-a100-16gpu.yaml")
    an = Analyzer(spec)
    entries = enumerate_space(spec, an)
    lb = {json.dumps(plan_dict(spec, e.cand), sort_keys=True): an.lower_bound_ns(e.cand)
          for e in entries if e.status == ""}

    def fake(task):
        t = 1.5 * lb[json.dumps(task["plan"], sort_keys=True)]
        tokens = task["plan"]["training"]["global_batch"] * spec.model.seq_len
        return {"error": "", "iteration_time_ns": t, "tokens_per_s": tokens / t * 1e9,
                "mfu": 0.5}

    for budget in (None, 1):
        sp = spec_from_dict(dict(spec.raw, budget={"wave": 1, **(
            {"evaluations": budget} if budget else {})}), spec.base_dir)
        s = Searcher(sp, [dataclasses.replace(e) for e in entries], Evaluator(run=fake),
                     analyzer=an)
        o = s.run("x")
        got = outcome_summary(o, sp)
        best_obj = s.objective(o.best.cand, float(o.best.row["iteration_time_ns"]))
        assert got["best_bound_over_time"] == pytest.approx(1 / 1.5, abs=1e-6)
        if budget is None:
            assert o.proven and got["bound_over_best"] == 1.0
        else:
            left = [e for e in s.entries if o.statuses.get(e.index) == "not_reached:budget"]
            assert not o.proven and left
            want = min(s.objective(e.cand, e.lb_ns) for e in left) / best_obj
            assert got["bound_over_best"] == pytest.approx(want, abs=1e-6)
            assert 1 / 1.5 <= got["bound_over_best"] < 1.0


def test_phase_one_stopped_by_its_deadline_counts_the_rest_and_proves_nothing():
    import time

    from xsim_adapters.search.bnb import STATUS_BUDGET, Space, prune_counts

    spec = load_search_spec(REPO / "workloads" / "search" / "h100-a100-16gpu.yaml")
    an = Analyzer(spec)
    whole = enumerate_space(spec, an)
    assert isinstance(whole, Space) and whole.size == len(whole) and whole.not_analysed == 0
    none = enumerate_space(spec, an, until=time.monotonic())  # the budget is already spent
    assert len(none) == 0 and none.size == len(whole)
    o = Searcher(spec, none, Evaluator(run=lambda t: {"error": "not called"})).run("x")
    assert o.evaluated == 0 and not o.proven and o.not_analysed == len(whole)
    assert prune_counts(none, o) == {STATUS_BUDGET: len(whole)}


def test_a_row_with_an_impossible_time_is_an_error_never_the_best():
    """Whatever gives the evaluator its rows, a time that is not finite and > 0 never ranks."""
    import math

    spec = load_search_spec(SMALL)
    an = Analyzer(spec)
    entries = enumerate_space(spec, an)

    def fake(task):
        bad = task["plan"]["training"]["micro_batch"] == 1
        return {"error": "", "iteration_time_ns": -5.0 if bad else 1e9, "tokens_per_s": 1.0,
                "mfu": 0.1}

    for bad_time in (-5.0, math.nan, math.inf, 0, "1"):
        def fake_t(task, bad_time=bad_time):
            row = fake(task)
            if row["iteration_time_ns"] < 0:
                row["iteration_time_ns"] = bad_time
            return row

        s = Searcher(spec, [dataclasses.replace(e) for e in entries], Evaluator(run=fake_t),
                     analyzer=an)
        o = s.run("x", exhaustive=True)
        assert o.best is not None and o.best.cand.choice.micro_batch == 2
        assert o.best.row["iteration_time_ns"] == 1e9
        bad = [e for e in s.entries if e.row is not None and e.cand.choice.micro_batch == 1]
        assert bad and all(e.status == "error" for e in bad)


def test_simulations_still_running_at_the_deadline_are_stopped_and_not_counted():
    import math
    import time

    from xsim_adapters.search.evaluate import KeptPoolExecutor

    class Killed(Evaluator):  # what a KeptPoolExecutor gives for rounds cut at the deadline
        def evaluate(self, plans, labels, stop_at=math.inf):
            return [None] * len(plans)

    spec = load_search_spec(SMALL)
    entries = enumerate_space(spec, Analyzer(spec))
    s = Searcher(spec, entries, Killed())
    o = s.run("x")
    assert o.evaluated == 0 and s.simulations == 0 and o.best is None and not o.proven
    assert o.unreached == o.considered  # every candidate: not reached, none cut by a bound
    with KeptPoolExecutor(1) as ex:  # the executor itself: a worker sleeping 60 s is killed
        ex.stop_at = time.monotonic() + 2.0
        t0 = time.monotonic()
        assert ex.map(time.sleep, [60]) == []
        assert time.monotonic() - t0 < 30  # (a spawned worker starts in a few seconds)
        ex.stop_at = math.inf
        assert ex.map(abs, [-3, 4]) == [3, 4]  # and the next round gets a fresh worker
