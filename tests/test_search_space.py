"""The search space's newer axes (interleaved, ZeRO, sequence parallel, groups split into
several replica shapes), its dominance rules, the lean evaluation and the kept worker pool, and
the Metis reproduction spec."""

from __future__ import annotations

import os
from collections import Counter

import pytest
import yaml
from helpers import REPO

from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.search import load_search_spec, search, spec_from_dict
from xsim_adapters.search.bnb import STATUS_DOMINATED, enumerate_space, twin
from xsim_adapters.search.bound import Analyzer
from xsim_adapters.search.evaluate import KeptPoolExecutor, run_candidate
from xsim_adapters.search.space import plan_dict, structures
from xsim_adapters.sweep.runner import run_variant

BASE = """
name: axes
model: {layers: 8, hidden: 256, ffn_hidden: 704, heads: 4, kv_heads: 4, seq_len: 128,
        vocab: 512}
training: {global_batch: 16}
device_groups:
  h: {type: H100-80GB, nodes: 3, gpus_per_node: 2}
  a: {type: A100-40GB, nodes: 2, gpus_per_node: 2}
collectives: {granularity: chunked, chunks: 1}
space: {tp: [1, 2], pp_min: 1, pp_max: 4, mix_types: true}
"""


def _spec(**space):
    raw = yaml.safe_load(BASE)
    raw["space"].update(space)
    return spec_from_dict(raw)


def test_interleaved_candidates_follow_megatrons_rules_and_load():
    """Every feasible interleaved candidate gives each pipeline of two or more stages a
    micro-batch count that is a multiple of its depth and at least v layers per stage, and
    loads as a plan (the plan loader enforces both)."""
    spec = _spec(schedules=["interleaved"], virtual_stages=[2])
    entries = enumerate_space(spec, Analyzer(spec))
    inter = [e for e in entries if e.status == "" and any(p.depth > 1 for p in e.cand.parts)]
    assert len(inter) > 10
    for e in inter[::7]:
        for part, lay, ms in zip(e.cand.parts, e.cand.layers, e.cand.micro_batches,
                                 strict=True):
            if part.depth > 1:
                assert all(m % part.depth == 0 for m in ms)
                assert all(b - a >= 2 for a, b in lay)
        plan = plan_from_dict(plan_dict(spec, e.cand))
        assert plan.training.virtual_stages == 2
    # single-stage replicas run interleaved as 1F1B: the same plan, so not listed twice
    spec2 = _spec(schedules=["1f1b", "interleaved"])
    counts = Counter(e.status for e in enumerate_space(spec2, Analyzer(spec2)))
    assert counts[STATUS_DOMINATED] > 0


def test_groups_split_into_shapes_on_whole_servers_cover_every_device():
    """With shapes_per_group 2 a group may hold two replica shapes (or a mixed part and one
    pure shape), each on whole servers, every TP group inside one server, every device of a
    used group used once; the one-shape space is part of it."""
    one, two = _spec(), _spec(shapes_per_group=2)
    s1, s2 = structures(one), structures(two)
    assert set(s1) <= set(s2) and len(s2) > len(s1)
    groups = {g.name: g for g in two.device_groups}
    split = 0
    for st in s2:
        used: dict[str, list[int]] = {}
        for part in st:
            for i, g in enumerate(part.groups):
                lo = part.base_of(i)
                n = part.devices_on(i)
                used.setdefault(g, []).extend(range(lo, lo + n))
                gpn = groups[g].gpus_per_node
                assert lo % part.tp[i] == 0 and gpn % part.tp[i] == 0
                shared = sum(1 for q in st if g in q.groups) > 1
                if shared:
                    assert lo % gpn == 0 and n % gpn == 0  # whole servers
        for g, devs in used.items():
            assert sorted(devs) == list(range(groups[g].num_devices)), (st, g)
        split += any(sum(1 for q in st if g in q.groups) > 1 for g in used)
    assert split > 0


def test_dominated_twins_and_zero_stages():
    """Sequence parallel without TP and ZeRO without DP are the same plans as without them;
    ZeRO-2 is listed only where ZeRO-1 does not fit (it moves the same bytes)."""
    spec = _spec(zero_stage=[0, 1, 2], sequence_parallel=[False, True])
    an = Analyzer(spec)
    entries = enumerate_space(spec, an)
    by = {(e.cand.choice, e.cand.parts): e for e in entries}
    for e in entries:
        c = e.cand
        if c.choice.sequence_parallel and all(t == 1 for p in c.parts for t in p.tp):
            assert e.status == STATUS_DOMINATED and twin(spec, c) is not None
        if c.choice.zero_stage == 2 and e.status == STATUS_DOMINATED and twin(spec, c) is None:
            lower = by[(c.choice.__class__(**{**c.choice.__dict__, "zero_stage": 1}),
                        c.parts)]
            assert lower.status == ""
    assert sum(e.status == STATUS_DOMINATED for e in entries) > 0


@pytest.mark.parametrize(("space", "message"), [
    ({"shapes_per_group": 5}, "space.shapes_per_group: expected at most 4"),
    ({"virtual_stages": [1, 2]}, "space.virtual_stages: expected model chunks per stage of at "
                                 "least 2 (got [1, 2])"),
    ({"zero_stage": [0, 4]}, "space.zero_stage[1]: expected an integer in 0..3 (got 4)"),
    ({"sequence_parallel": []}, "space.sequence_parallel: expected a non-empty list of true "
                                "/ false (got [])"),
])
def test_new_space_keys_errors_name_the_yaml_path(space, message):
    with pytest.raises(PlanError) as err:
        _spec(**space)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.slow  # enumerates 474,178 structures (4 s)
def test_a_space_too_large_to_analyse_is_an_error_naming_the_keys():
    raw = yaml.safe_load((REPO / "workloads" / "search" / "h100-a100-1024gpu.yaml").read_text())
    raw["space"].update(shapes_per_group=2, pp_max=8)
    spec = spec_from_dict(raw)
    with pytest.raises(PlanError) as err:
        enumerate_space(spec, Analyzer(spec))
    msg = str(err.value)
    assert msg.startswith("space: expected at most 200,000 candidates (got ")
    assert "lower space.shapes_per_group" in msg and "\n" not in msg


@pytest.mark.parametrize("coarsen", ["auto", "on"])
def test_lean_row_is_the_metrics_summary(coarsen):
    """What the search measures (iteration time, tokens/s, MFU, per type) equals what the full
    metrics give for the same run, coarsened or not."""
    spec = _spec()
    an = Analyzer(spec)
    e = next(e for e in enumerate_space(spec, an) if e.status == ""
             and sum(p.count for p in e.cand.parts) > 2)
    task = {"plan": plan_dict(spec, e.cand)}
    lean = run_candidate({**task, "coarsen": coarsen})
    full = run_variant(task)
    assert lean["error"] == full["error"] == ""
    assert lean["coarsened"] == (coarsen == "on")
    if coarsen == "auto":  # the same run: the same numbers
        assert lean["iteration_time_ns"] == full["iteration_time_ns"]
        for k in ("tokens_per_s", "mfu", "mfu_H100-80GB", "mfu_A100-40GB"):
            assert lean[k] == pytest.approx(full[k], rel=1e-9), k
    else:  # identical replicas on a symmetric fabric: coarsening changes nothing here
        assert lean["iteration_time_ns"] == pytest.approx(full["iteration_time_ns"], rel=1e-6)


def _pid(task):
    if task.get("die"):
        os._exit(3)
    return {"error": "", "pid": os.getpid()}


@pytest.mark.slow  # starts worker processes (a few seconds)
def test_kept_pool_keeps_its_workers_and_isolates_a_crash():
    with KeptPoolExecutor(2) as ex:
        first = {r["pid"] for r in ex.map(_pid, [{}, {}, {}, {}])}
        second = {r["pid"] for r in ex.map(_pid, [{}, {}])}
        assert second <= first and os.getpid() not in first
        rows = ex.map(_pid, [{}, {"die": True}, {}])
        assert rows[1]["error"].startswith("crash: the worker process")
        assert rows[0]["error"] == rows[2]["error"] == ""
        after = ex.map(_pid, [{}, {}])  # a new pool after the crash
        assert all(r["error"] == "" for r in after)


METIS = REPO / "workloads" / "search" / "metis-a100-t4-16gpu.yaml"


def metis_published_plan() -> dict:
    """Metis's rank-1 plan (SamsungLabs/Metis results/hetero_cost_model): 4 DP pipelines of
    2 stages of TP 2; stage 0 on the 4 T4 and 4 A100, stage 1 on the other 8 A100; Metis's
    layers [0, 4) | [4, 10) of 10 (embedding, 8 layers, head) = layers [0, 3) | [3, 8) here;
    8 micro-batches of 4 sequences per pipeline."""
    from xsim_adapters.search.spec import plan_base

    spec = load_search_spec(METIS)
    plan = {"name": "metis-published", "seed": 0, **plan_base(spec)}
    plan["training"] = {**plan["training"], "micro_batch": 4, "schedule": "1f1b"}

    def st(g: str, a: int, lay: tuple[int, int]) -> dict:
        return {"group": g, "devices": [a, a + 2], "tp": 2, "layers": list(lay)}

    plan["replicas"] = [
        {"stages": [st(g0, a0, (0, 3)), st("a100", a1, (3, 8))], "micro_batches": 8}
        for g0, a0, a1 in (("t4", 0, 4), ("t4", 2, 6), ("a100", 0, 8), ("a100", 2, 10))]
    return plan


@pytest.mark.slow  # a budget-limited search on 16 GPUs
def test_search_finds_a_plan_at_least_as_fast_as_metis_published_plan():
    """Same cluster, same model: the best plan of the spec's space simulates at least as fast
    as the plan Metis's planner published for it (simulated the same way)."""
    published = run_candidate({"plan": metis_published_plan()})
    assert published["error"] == ""
    res = search(METIS, baselines=False, top=1)
    assert res.best is not None
    assert res.best.row["iteration_time_ns"] <= published["iteration_time_ns"]
