"""Hostile input on the newer plan sections (MoE routing, what-if events, measured inter-site
matrices, precision, file kinds, key typos): each is one ``xsim: error:`` line naming the YAML
path, in bounded time and memory (a forked child, tests/attack/attack_runner.py), or loads with
a correct meaning. Every case here failed before the fix it guards (issue 32 part 5, issue 27
item 6, issue 31's rough edges).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from attack_runner import assert_clean_error, run_cli

from xsim_adapters.errors import PlanError, PlanWarning
from xsim_adapters.feasibility import load_plan, plan_from_dict
from xsim_adapters.plan._fields import shown
from xsim_adapters.plan.model import MoESpec

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "workloads"
HOMOGENEOUS: dict[str, Any] = yaml.safe_load((WORK / "homogeneous-h100.yaml").read_text())
TWO_SITES: dict[str, Any] = yaml.safe_load((WORK / "two-site-measured.yaml").read_text())
MOE = """name: moe-small
model:
  preset: mixtral-8x7b
  layers: 2
  seq_len: 512
  moe: {routing: zipf, zipf_exponent: 1.2}
training: {global_batch: 8, micro_batch: 1}
device_groups:
  h100: {type: H100-80GB, nodes: 1, gpus_per_node: 8}
replicas:
  uniform: {group: h100, tp: 1, pp: 1, dp: 8, ep: 8}
"""


def _write(tmp: Path, d: Any, name: str = "plan.yaml") -> Path:
    p = tmp / name
    p.write_text(yaml.safe_dump(d, sort_keys=False, width=10_000))
    return p


def _with(base: dict[str, Any], edit: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    d = copy.deepcopy(base)
    edit(d)
    return d


def _events(*events: dict[str, Any]) -> dict[str, Any]:
    return _with(HOMOGENEOUS, lambda d: d["network"].update(events=list(events)))


def _measured(gbps: Any, latency: Any) -> dict[str, Any]:
    return _with(TWO_SITES, lambda d: d["network"]["measured"].update(gbps=gbps,
                                                                      latency_us=latency))


def _training(**kw: Any) -> dict[str, Any]:
    return _with(HOMOGENEOUS, lambda d: d["training"].update(kw))


# (id, plan data, command, the exact error line after "xsim: error: ")
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("event-nic-missing", _events({"at_us": 10, "kind": "nic_down", "rank": 100}), "validate",
     "network.events[0].rank: expected a global rank in 0..15 (got 100)"),
    ("event-node-missing", _events({"at_us": 10, "kind": "fail", "src": "gpu0", "dst": "leaf9"}),
     "validate", "network.events[0].dst: unknown topology node; expected one of gpu0..gpu15, "
     "nvs0..nvs1, leaf0 (got 'leaf9')"),
    ("event-link-missing", _events({"at_us": 10, "kind": "degrade", "src": "gpu0", "dst": "gpu9",
                                    "factor": 0.5}),
     "trace", "network.events[0]: expected two nodes joined by a link (got 'gpu0' and 'gpu9', "
     "which have none between them)"),
    ("event-second-of-two", _events({"at_us": 1, "kind": "nic_down", "rank": 3},
                                    {"at_us": 2, "kind": "fail", "src": "x" * 5000, "dst": "nvs0"}),
     "validate", "network.events[1].src: unknown topology node; expected one of gpu0..gpu15, "
     f"nvs0..nvs1, leaf0 (got {shown('x' * 5000)})"),  # cut to 80 characters
    ("vocab-below-tp", _with(HOMOGENEOUS, lambda d: d.update(
        model={"preset": "llama2-7b", "seq_len": 2048, "vocab": 3})), "trace",
     "replicas.uniform.tp: must be at most the model's vocabulary of 3 (each TP rank holds a "
     "slice of it) (got 4)"),
    ("measured-one-way", _measured([[None, 100], [None, None]], [[None, 250], [None, None]]),
     "trace", "network.measured.gbps[1][0]: expected a measured rate: site 1 (a100) has no path "
     "to site 0 (h100), directly or through another site (got null)"),
    ("measured-no-path", _measured([[None, None], [None, None]], None), "trace",
     "network.measured.gbps[0][1]: expected a measured rate: site 0 (h100) has no path to site 1 "
     "(a100), directly or through another site (got null)"),
    ("typo-training", _training(micro_bach=1), "validate",
     "training.micro_bach: unknown key (did you mean micro_batch?); expected one of "
     "global_batch, micro_batch, schedule, optimizer, zero_stage, recompute, sequence_parallel, "
     "causal_attention_halving, flash_attention, virtual_stages, overlap, fsdp, precision, "
     "dropout, "
     "grad_reduce_dtype, grad_accumulation_fusion"),
    ("typo-top-level", _with(HOMOGENEOUS, lambda d: d.update(replica=d.pop("replicas"))),
     "validate", "replica: unknown key (did you mean replicas?); expected one of name, seed, "
     "model, training, device_types, device_groups, network, replicas, collectives, perturb"),
    ("typo-moe", yaml.safe_load(MOE.replace("routing: zipf", "routng: zipf")), "validate",
     "model.moe.routng: unknown key (did you mean routing?); expected one of num_experts, "
     "top_k, expert_ffn_hidden, shared_experts, shared_ffn_hidden, every, first_dense_layers, "
     "router, capacity_factor, routing, zipf_exponent, placement, alltoall, router_bias"),
    ("precision-from-dtype-unrunnable", _with(HOMOGENEOUS, lambda d: (
        d["model"].update(dtype="fp8"), d["device_groups"]["h100"].update(type="A100-80GB"))),
     "validate", "training.precision: fp8 (not given, so taken from model.dtype) needs "
     "device_types.A100-80GB.fp8_tflops > 0 (device type A100-80GB has none; got 'fp8')"),
]


@pytest.mark.parametrize(("data", "cmd", "line"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_hostile_section(data, cmd, line, tmp_path):
    """exit 1 and exactly this one line (before the fixes: exit 0, or a ZeroDivisionError)."""
    plan = _write(tmp_path, data)
    argv = [cmd, str(plan)] + (["-o", str(tmp_path / "out")] if cmd == "trace" else [])
    out = run_cli(argv, cwd=str(tmp_path))
    assert_clean_error(out, line)
    assert out.stderr.strip() == f"xsim: error: {line}"
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- measured CSV


def _csv_plan(tmp: Path, rows: str) -> Path:
    (tmp / "m.csv").write_text("src,dst,gbps,latency_us\n" + rows)
    return _write(tmp, _with(TWO_SITES, lambda d: d["network"].update(measured="m.csv")))


def test_measured_csv_missing_way_back(tmp_path):
    out = run_cli(["validate", str(_csv_plan(tmp_path, "h100,a100,100,250\n"))])
    assert_clean_error(out, f"network.measured: {tmp_path / 'm.csv'}: expected a row a100,h100: "
                            "site 1 (a100) has no path to site 0 (h100), directly or through "
                            "another site (got no such row)")


def test_measured_csv_of_many_names_is_refused_in_bounded_time(tmp_path):
    """A 1 MiB CSV of 56,000 distinct pairs built a 113,000^2 matrix (out of time and memory)."""
    rows = "".join(f"a{i},b{i},1,1\n" for i in range(56_000))
    out = run_cli(["validate", str(_csv_plan(tmp_path, rows))], timeout=20)
    assert_clean_error(out, "expected rows between at most 256 groups (MAX_MEASURED_SITES)",
                       max_seconds=15)


def test_measured_three_sites_one_relayed_way_is_valid():
    """A missing direct entry is fine when another site relays: 0 -> 1 only through 2."""
    d = copy.deepcopy(TWO_SITES)
    d["device_groups"]["l40s"] = {"type": "L40S", "nodes": 1, "gpus_per_node": 8}
    d["network"]["measured"] = {"groups": ["h100", "a100", "l40s"],
                                "gbps": [[None, None, 100], [80, None, 80], [90, 90, None]]}
    d["replicas"].append({"stages": [{"group": "l40s", "devices": [0, 8], "tp": 8,
                                      "layers": [0, 8]}]})
    plan = plan_from_dict(d, feasibility=False)
    assert plan.network.measured is not None and plan.network.measured.gbps[0][1] is None


# ---------------------------------------------------------------- Zipf routing


@pytest.mark.parametrize("exponent", [0.0, 1.2, 40.0, 400.0, 1e6, 1e300])
@pytest.mark.parametrize(("experts", "top_k"), [(8, 2), (8, 8), (60, 4), (4096, 8)])
def test_zipf_counts_are_valid_at_any_exponent(exponent, experts, top_k):
    """Each member routes exactly tokens x top_k assignments, none negative, none above the
    tokens (a token picks an expert once); before: 1 / rank^1e6 = 0, NaN shares, and counts of
    -9.2e18 with exit 0."""
    from xsim_adapters.workload.compute.routing import popularity, routing_counts

    spec = MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden=8, routing="zipf",
                   zipf_exponent=exponent)
    p = popularity(spec, 3, 7)
    assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-9 and p.max() <= 1 / top_k + 1e-12
    c = routing_counts(spec, layer=3, tokens=1000, members=4, seed=7)
    assert (c.sum(axis=1) == 1000 * top_k).all()
    assert c.min() >= 0 and c.max() <= 1000
    if exponent >= 400:  # the limit: the k most popular experts take every token
        assert np.sort(c.sum(axis=0))[-top_k:].tolist() == [4000] * top_k


def test_zipf_overflow_plan_traces_with_valid_alltoall(tmp_path):
    from xsim_adapters.workload.comm.alltoall import expert_load

    plan = load_plan(MOE.replace("zipf_exponent: 1.2", "zipf_exponent: 1000000.0"))
    load = expert_load(plan)
    assert (load["tokens"] >= 0).all()
    assert (load.groupby("layer")["tokens"].sum() == 8 * 512 * 2).all()  # 8 ranks x T x k
    out = run_cli(["trace", str(_write(tmp_path, yaml.safe_load(MOE.replace(
        "zipf_exponent: 1.2", "zipf_exponent: 1000000.0")))), "-o", str(tmp_path / "o")])
    assert out.code == 0 and out.stderr == "", out.stderr[-2000:]


@pytest.mark.parametrize("factor", [1e30, 2**63])
def test_a_huge_capacity_factor_drops_nothing(factor, tmp_path):
    """ceil(c T k / E) above int64 was an OverflowError in numpy; a cap above the tokens drops
    nothing, so the plan traces exactly as dropless routing does."""
    from xsim_adapters.workload.compute.routing import routing_counts

    spec = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=8, routing="zipf",
                   zipf_exponent=2.0, capacity_factor=float(factor))
    dropless = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=8, routing="zipf",
                       zipf_exponent=2.0)
    assert np.array_equal(routing_counts(spec, 0, 800, 2, 0),
                          routing_counts(dropless, 0, 800, 2, 0))
    d = yaml.safe_load(MOE)
    d["model"]["moe"]["capacity_factor"] = factor
    plan = _write(tmp_path, d)
    out = run_cli(["trace", str(plan), "-o", str(tmp_path / "o")])
    assert out.code == 0 and out.stderr == "", out.stderr[-2000:]


# ---------------------------------------------------------------- precision from model.dtype


@pytest.mark.parametrize(("dtype", "precision"), [("fp16", "fp16"), ("fp32", "fp32"),
                                                  ("fp8", "fp8")])
def test_precision_is_taken_from_the_dtype_with_one_warning(dtype, precision):
    d = _with(HOMOGENEOUS, lambda d: d["model"].update(dtype=dtype))
    with pytest.warns(PlanWarning) as caught:
        plan = plan_from_dict(d, feasibility=False)
    assert plan.training.precision == precision
    assert [str(w.message) for w in caught] == [
        f"training.precision: not given, so {precision} is taken from model.dtype {dtype} "
        f"(such plans computed in bf16 before); write training.precision: {precision} to state "
        "it (docs/plan.md#precision-and-dtype)"]


def test_stated_precision_and_bf16_plans_are_unchanged_and_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        stated = plan_from_dict(_with(HOMOGENEOUS, lambda d: (
            d["model"].update(dtype="fp16"), d["training"].update(precision="bf16"))))
        assert stated.training.precision == "bf16"
        assert plan_from_dict(copy.deepcopy(HOMOGENEOUS)).training.precision == "bf16"


def test_no_shipped_plan_changes_meaning():
    """Every plan in workloads/ is bf16 or states its precision: none warns, none changes."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        for path in sorted(WORK.glob("*.yaml")):
            raw = yaml.safe_load(path.read_text())
            plan = load_plan(path, feasibility=False)
            assert plan.training.precision == raw["training"].get("precision", "bf16"), path


def test_the_warning_is_one_line_on_the_command_line(tmp_path):
    plan = _write(tmp_path, _with(HOMOGENEOUS, lambda d: d["model"].update(dtype="fp32")))
    out = run_cli(["validate", str(plan)])
    assert out.code == 0, out.stderr
    assert out.stderr.splitlines() == [
        "xsim: warning: training.precision: not given, so fp32 is taken from model.dtype fp32 "
        "(such plans computed in bf16 before); write training.precision: fp32 to state it "
        "(docs/plan.md#precision-and-dtype)"]


# ---------------------------------------------------------------- the wrong command for a file


SEARCH = "workloads/search/h100-a100-16gpu.yaml"
TRAFFIC = "workloads/traffic/tenants-permutation.yaml"
WRONG = [
    (["validate", SEARCH], f"{SEARCH}: this is a search spec, not a plan: run it with "
                           f"'xsim search {SEARCH}'"),
    (["run", SEARCH], f"{SEARCH}: this is a search spec, not a plan: run it with "
                      f"'xsim search {SEARCH}'"),
    (["trace", TRAFFIC, "-o", "never"], f"{TRAFFIC}: this is a traffic spec, not a plan: run it "
                                        f"beside a plan with 'xsim run PLAN --job {TRAFFIC}'"),
    (["search", "workloads/homogeneous-h100.yaml", "-o", "never"],
     "workloads/homogeneous-h100.yaml: this is a plan, not a search spec: run it with "
     "'xsim run workloads/homogeneous-h100.yaml' (or validate, trace, export)"),
    (["search", TRAFFIC, "-o", "never"], f"{TRAFFIC}: this is a traffic spec, not a search spec: "
                                         f"run it beside a plan with 'xsim run PLAN --job "
                                         f"{TRAFFIC}'"),
    (["run", "workloads/homogeneous-h100.yaml", "--job", SEARCH, "-o", "never"],
     f"{SEARCH}: this is a search spec, not a plan: run it with 'xsim search {SEARCH}'"),
]


@pytest.mark.parametrize(("argv", "line"), WRONG, ids=[" ".join(a[:2]) for a, _ in WRONG])
def test_the_wrong_command_names_the_right_one(argv, line):
    out = run_cli(argv, cwd=str(ROOT))
    assert_clean_error(out, line)
    assert out.stderr.strip() == f"xsim: error: {line}"
    assert not (ROOT / "never").exists()


def test_a_sweep_file_given_as_a_plan(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"base: {WORK / 'homogeneous-h100.yaml'}\naxes: {{training.micro_batch: "
                     "[1, 2]}\n")
    out = run_cli(["validate", str(sweep)])
    assert_clean_error(out, f"{sweep}: this is a sweep file, not a plan: run it with "
                            f"'xsim sweep --sweep {sweep}'")


def test_a_plan_with_a_search_key_is_still_a_plan():
    """`replicas` decides: a plan that also has `space` gets the unknown-key error."""
    with pytest.raises(PlanError, match=r"^space: unknown key; expected one of name, seed"):
        plan_from_dict(_with(HOMOGENEOUS, lambda d: d.update(space={})))
