"""Every shipped plan runs as shipped and its summary matches the golden file.

The goldens hold the iteration time, the per-phase totals and the op counts of each plan on the
flow backend. Results are deterministic, so the tolerance only absorbs floating-point summation
order across numpy/pandas versions. After an intended model change, regenerate with
``XSIM_REGEN_GOLDEN=1 python -m pytest tests/test_golden_workloads.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import xsim_adapters as xs

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = sorted((ROOT / "workloads").glob("*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "golden"
REL = 1e-6


def _summary(path: Path) -> dict:
    plan = xs.load_plan(path)
    trace = xs.generate(plan)
    tl = xs.run(trace, "flow", topology=xs.build_topology(plan))
    s = xs.metrics(trace, tl).summary
    return {
        "plan": s["plan"],
        "ranks": s["ranks"],
        "num_ops": trace.num_ops,
        "num_deps": len(trace.deps),
        "iteration_time_ns": s["iteration_time_ns"],
        "tokens_per_s": s["tokens_per_s"],
        "phases": s["phases"],
        "bubble_ns": s["totals"]["bubble_ns"],
        "straggler_wait_ns": s["totals"]["straggler_wait_ns"],
        "exposed_comm_ns": s["totals"]["exposed_comm_ns"],
    }


def test_every_shipped_plan_has_a_golden():
    names = {p.stem for p in WORKLOADS}
    goldens = {p.stem for p in GOLDEN.glob("*.json")}
    assert len(names) >= 5
    assert names == goldens, f"missing: {names - goldens}, stale: {goldens - names}"


@pytest.mark.parametrize("path", WORKLOADS, ids=[p.stem for p in WORKLOADS])
def test_shipped_plan_matches_golden(path: Path):
    got = _summary(path)
    gfile = GOLDEN / f"{path.stem}.json"
    if os.environ.get("XSIM_REGEN_GOLDEN"):
        gfile.parent.mkdir(exist_ok=True)
        tmp = gfile.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, gfile)
    want = json.loads(gfile.read_text())
    assert got["plan"] == want["plan"]
    assert got["ranks"] == want["ranks"]
    assert got["num_ops"] == want["num_ops"]
    assert got["num_deps"] == want["num_deps"]
    for key in ("iteration_time_ns", "tokens_per_s", "bubble_ns", "straggler_wait_ns",
                "exposed_comm_ns"):
        assert got[key] == pytest.approx(want[key], rel=REL, abs=1.0), key
    assert set(got["phases"]) == set(want["phases"])
    for phase, v in want["phases"].items():
        assert got["phases"][phase] == pytest.approx(v, rel=REL, abs=1.0), phase
