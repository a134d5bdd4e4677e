"""Fuzz: random types and values at random paths of the newer plan sections (MoE, EP/CP keys,
server fabrics, measured inter-site matrices, what-if events and slowdowns, traffic specs).

Every input either loads or raises PlanError (or InfeasiblePlanError) whose message is one
short line; never another exception. A mutated MoE plan that loads must also generate its
trace. In the style of test_fuzz_plan_yaml.py (its value strategy and paths are reused);
deterministic examples (``derandomize``) keep the suite stable and under a minute.
"""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_plan_yaml import VALUES, _paths

from xsim_adapters.errors import InfeasiblePlanError, PlanError, PlanWarning
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.trace.schema import KIND_COMPUTE, KIND_FLOW
from xsim_adapters.traffic import traffic_from_dict

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "workloads"
MOE = {
    "name": "fuzz-moe",
    "model": {"preset": "tiny-gpt", "layers": 2, "seq_len": 64,
              "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden": 256,
                      "routing": "zipf", "zipf_exponent": 1.2, "capacity_factor": 1.5,
                      "placement": "by_speed"}},
    "training": {"global_batch": 4, "micro_batch": 1, "schedule": "1f1b"},
    "device_groups": {"h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 2},
                      "a100": {"type": "A100-80GB", "nodes": 1, "gpus_per_node": 2}},
    "collectives": {"channels": 1},
    "replicas": [{"stages": [{"group": g, "devices": [i, i + 1], "tp": 1, "ep": 2,
                              "layers": [0, 2]}]} for i in (0, 1) for g in ("h100", "a100")],
}
WHATIF = yaml.safe_load((WORK / "homogeneous-h100.yaml").read_text())
WHATIF["network"]["events"] = [
    {"at_us": 10.0, "kind": "degrade", "src": "gpu0", "dst": "nvs0", "factor": 0.5},
    {"at_us": 20.0, "kind": "nic_down", "rank": 3},
    {"at_us": 30.0, "kind": "nic_up", "rank": 3},
]
WHATIF["perturb"] = {"slow": [{"rank": 5, "factor": 1.15},
                              {"group": "h100", "devices": [8, 12], "factor": 1.3,
                               "from_us": 5.0, "until_us": 50.0},
                              {"server": 1, "factor": 1.1}, {"ranks": [0, 9], "factor": 0.9}],
                     "jitter": {"sigma": 0.05}}
TRAFFIC = yaml.safe_load((WORK / "traffic" / "tenants-permutation.yaml").read_text())
BASES: dict[str, dict[str, Any]] = {
    "moe": MOE,
    "cp": yaml.safe_load((WORK / "long-context-128k-cp4.yaml").read_text()),
    "fabric": yaml.safe_load((WORK / "dgx1-v100-cube-mesh.yaml").read_text()),
    "measured": yaml.safe_load((WORK / "two-site-measured.yaml").read_text()),
    "whatif": WHATIF,
    "traffic": TRAFFIC,
}
# The sections under attack in each base (a mutation's path starts with one of these).
SECTIONS = {
    "moe": (("model", "moe"),),  # and every stage's ep (STAGE_KEYS)
    "cp": (("replicas",), ("model", "seq_len"), ("training",)),
    "fabric": (("device_groups",),),
    "measured": (("network", "measured"),),
    "whatif": (("network", "events"), ("perturb",)),
    "traffic": (("traffic",),),
}
STAGE_KEYS = ("ep",)
PATHS = {
    name: [p for p in _paths(d)[1:] if any(p[:len(s)] == s for s in SECTIONS[name])
           or (name == "moe" and p[-1] in STAGE_KEYS)]
    for name, d in BASES.items()
}
EXTRA_KEYS = ["extra", "ep", "etp", "cp", "factor", "rank", "gbps", "nics", "fabric", "top_k"]


@st.composite
def mutated(draw: Any) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(BASES)))
    d = copy.deepcopy(BASES[name])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS[name]))
        parent: Any = d
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["set", "set", "scale", "scale", "delete", "add"]))
            old = parent[path[-1]]
            if action == "scale" and isinstance(old, int | float) and not isinstance(old, bool):
                # a near miss of a valid number: the plan often still loads, so generation
                # (MoE) and the cross-section checks run on it too
                factor = draw(st.sampled_from([0, 0.5, 2, 3, 8, 1e6, -1, float("nan")]))
                new = old * factor
                parent[path[-1]] = int(new) if isinstance(old, int) and math.isfinite(new) \
                    else new
            elif action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "add" and isinstance(parent, dict):
                parent[draw(st.sampled_from(EXTRA_KEYS))] = draw(VALUES)
            else:
                parent[path[-1]] = draw(VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or retyped this path
    return name, d


def _load(name: str, d: dict[str, Any]) -> Any:
    # through YAML as a user's file would be (NaN and inf survive as .nan / .inf)
    data = yaml.safe_load(yaml.safe_dump(d, sort_keys=False, width=10_000))
    if name == "traffic":
        return traffic_from_dict(data)
    return plan_from_dict(data, feasibility=True)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated())
def test_mutated_sections_load_or_raise_one_line(case):
    name, d = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        try:
            plan = _load(name, d)
        except (PlanError, InfeasiblePlanError) as e:
            text = str(e)
            assert "\n" not in text and 0 < len(text) < 1000, text[:2000]
            return
    if name == "moe":  # a plan that loads must generate (counts, bytes, durations all valid)
        from xsim_adapters.api import generate

        ops = generate(plan).ops
        assert len(ops) > 0
        assert (ops.loc[ops["kind"] == KIND_FLOW, "bytes"] > 0).all()
        assert (ops.loc[ops["kind"] == KIND_COMPUTE, "duration_ns"] >= 0).all()


def test_the_bases_load():
    """The fuzz starts from inputs that load (so a PlanError above is caused by the mutation),
    and every section under attack has paths to mutate."""
    for name in BASES:
        assert _load(name, copy.deepcopy(BASES[name])) is not None
        assert len(PATHS[name]) >= 3, name
    assert math.isfinite(BASES["whatif"]["perturb"]["jitter"]["sigma"])
