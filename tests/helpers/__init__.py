"""Helpers shared by the tests: hand-built plans, topologies, traces and timelines with known
answers (no test in here; the fixtures shared by many files are in ``tests/conftest.py``).

- :mod:`.gen`: small plans from the plan dataclasses, DAG order checks (generator tests).
- :mod:`.topo`: small plans and ring traces for the topology and flow-backend tests.
- :mod:`.metrics`: hand-built traces and their uncontended (ASAP) timelines.
- :mod:`.plan`: the example plan and Hypothesis strategies of valid plan dicts.
- :mod:`.sweep`: a tiny 8-GPU plan for the sweep tests.
- :mod:`.whatif`: two-spine fabrics, cable failures (rerouting and slowdown tests).
- :mod:`.ns3`: star topologies and the ns-3 wheel's presence (``HAVE_NS3``, ``needs_ns3``).
- :mod:`.htsim`: star topologies, the htsim driver (built from ``$HTSIM_DIR``), driver files.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]  # the repository root, whatever the working directory
WORKLOADS = REPO / "workloads"  # the shipped plans

# The shipped plans of thousands of GPUs (docs/scale.md): replaying one on the flow backend
# takes 20-32 s on 2 cores (tests --durations, 2026-12-04), so tests that replay every shipped
# plan mark these slow (tests/test_scale_plans.py checks them in the slow selection).
SCALE_PLANS = frozenset({"megatron-1t-3072gpu", "llama3-405b-16k-h100", "llama3-405b-16k-hetero"})


def plan_params(paths: Iterable[str | Path], slow: Collection[str] = SCALE_PLANS) -> list[Any]:
    """``paths`` (plan files or names) as pytest parameters with the given values and ids,
    those whose stem is in ``slow`` marked ``slow``."""
    return [pytest.param(p, marks=[pytest.mark.slow] if Path(p).stem in slow else [])
            for p in paths]
