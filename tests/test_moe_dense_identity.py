"""A dense plan with EP = CP = 1 gives the same trace as without the MoE/CP fields.

When MoE and CP landed (branch ``moe``), dense traces were hash-identical to main@b76c29b, the
commit before them. The NCCL algorithm work merged in the same session changed dense traces on
purpose (NVLS for H100 all-reduces), so that fixed reference no longer applies; what stays
checkable is that writing ``ep: 1, cp: 1`` changes nothing, and that a dense plan has no
expert-parallel or context-parallel op, collective or manifest entry.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest
import yaml
from helpers import REPO

from xsim_adapters.feasibility import load_plan, plan_from_dict
from xsim_adapters.workload import generate

DENSE = ("homogeneous-h100.yaml", "hetero-dp-h100-a100.yaml")


def trace_hash(trace) -> str:
    h = hashlib.sha256()
    for df in (trace.ops, trace.deps, trace.collectives):
        h.update(",".join(f"{c}:{df[c].dtype}" for c in df.columns).encode())
        h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    h.update(json.dumps(trace.manifest, sort_keys=True).encode())
    return h.hexdigest()


@pytest.mark.parametrize("name", DENSE)
def test_dense_trace_has_no_ep_or_cp_work(name):
    from xsim_adapters.trace.schema import PHASE_INDEX

    t = generate(load_plan(REPO / "workloads" / name))
    phases = {PHASE_INDEX["ep"], PHASE_INDEX["cp"]}
    assert not t.ops["phase"].isin(phases).any()
    assert not t.collectives["phase"].isin(phases).any()
    assert "ep" not in t.manifest["op_counts"]["by_phase"]
    assert "cp" not in t.manifest["op_counts"]["by_phase"]


def test_explicit_ep_cp_one_changes_nothing():
    path = REPO / "workloads" / "homogeneous-h100.yaml"
    d = yaml.safe_load(path.read_text())
    d["replicas"]["uniform"].update({"ep": 1, "cp": 1})
    a = generate(plan_from_dict(d, base_dir=str(path.parent)))
    b = generate(load_plan(path))
    assert trace_hash(a) == trace_hash(b)
