"""A dense plan with EP = CP = 1 gives the same trace as the code before MoE/CP existed.

The reference hashes were computed with main@b76c29b (before this work) by the same
``trace_hash`` over the generated trace (ops, deps, collectives frames and the manifest). If a
later, intended change of the dense generator moves them, recompute them with that commit's
successor on main and say so in the commit message.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from xsim_adapters.plan import load_plan, plan_from_dict
from xsim_adapters.workload import generate

ROOT = Path(__file__).resolve().parents[1]
MAIN_B76C29B = {
    "homogeneous-h100.yaml": "4e5458af5d0d848649ba4067fb0b93528b09312f09b232ea9e72b562bfdedac4",
    "hetero-dp-h100-a100.yaml": "16834d29075357fc97a0cd03f0ff7a9d90b9fc0b021fb380d238972a3c4be4f5",
}


def trace_hash(trace) -> str:
    h = hashlib.sha256()
    for df in (trace.ops, trace.deps, trace.collectives):
        h.update(",".join(f"{c}:{df[c].dtype}" for c in df.columns).encode())
        h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    h.update(json.dumps(trace.manifest, sort_keys=True).encode())
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(MAIN_B76C29B))
def test_dense_trace_equals_the_one_before_moe(name):
    assert trace_hash(generate(load_plan(ROOT / "workloads" / name))) == MAIN_B76C29B[name]


def test_explicit_ep_cp_one_changes_nothing():
    d = yaml.safe_load((ROOT / "workloads" / "homogeneous-h100.yaml").read_text())
    d["replicas"]["uniform"].update({"ep": 1, "cp": 1})
    a = generate(plan_from_dict(d))
    assert trace_hash(a) == MAIN_B76C29B["homogeneous-h100.yaml"]
    assert "ep" not in a.manifest["op_counts"]["by_phase"]
