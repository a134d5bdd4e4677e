"""Fuzz: random types and values at random paths of valid plans, through ``xsim``'s main().

Never a traceback; always exit 0, or exit 1 with exactly one ``xsim: error:`` line. The small
plan goes through ``xsim trace`` (so a mutated plan that validates must also generate and write
its trace), the heterogeneous pipeline plan through ``xsim validate``. Deterministic examples
(``derandomize``) keep the suite stable; run with ``--hypothesis-seed`` to explore further.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xsim_adapters.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = """name: fuzz-small
model: tiny-gpt
training: {global_batch: 4, micro_batch: 1, schedule: 1f1b}
device_types:
  H100-80GB: {efficiency: 0.6}
device_groups:
  h100: {type: H100-80GB, nodes: 1, gpus_per_node: 4}
  a100: {type: A100-40GB, nodes: 1, gpus_per_node: 2}
network:
  scale_out: {topology: leaf_spine, link_gbps: 400, latency_us: 1.0}
collectives: {channels: 1, granularity: step}
replicas:
  - stages:
      - {group: h100, devices: [0, 2], tp: 2, layers: [0, 2]}
      - {group: a100, devices: [0, 2], tp: 2, layers: [2, 4]}
  - uniform: {group: h100, devices: [2, 4], tp: 1, pp: 2}
"""
BASES = {
    "trace": yaml.safe_load(SMALL),
    "validate": yaml.safe_load((ROOT / "workloads" / "hetero-pipeline-reshard.yaml").read_text()),
}


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) into ``node``, containers included."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, (*prefix, i)))
    return out


PATHS = {cmd: _paths(d)[1:] for cmd, d in BASES.items()}

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 3, 2**15, 2**31, 2**63, 10**9, 40_000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, 1e300, -0.0, 0.5, 1.5]),
    st.text(max_size=12),
    st.sampled_from(["../x", "a/b", "h100", "a100", "H100-80GB", "", "\0", "x" * 300, "1f1b"]),
    st.lists(st.integers(-3, 70), max_size=4),
    st.dictionaries(st.sampled_from(["tp", "group", "x", "layers"]), st.integers(-1, 9),
                    max_size=2),
)


@st.composite
def mutated(draw: Any) -> tuple[str, dict[str, Any]]:
    cmd = draw(st.sampled_from(sorted(BASES)))
    d = copy.deepcopy(BASES[cmd])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS[cmd]))
        parent: Any = d
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
            if action == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif action == "add" and isinstance(parent, dict):
                parent[draw(st.sampled_from(["extra", "tp", "layers", "gbps"]))] = draw(VALUES)
            else:
                parent[path[-1]] = draw(VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or retyped this path
    return cmd, d


def _dump(d: dict[str, Any]) -> str:
    # safe_dump writes NaN/inf as .nan/.inf, which YAML reads back as floats
    return yaml.safe_dump(d, sort_keys=False, allow_unicode=False, width=10_000)


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated())
def test_mutated_plans_never_crash(case):
    cmd, d = case
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.yaml"
        plan.write_text(_dump(d))
        argv = [cmd, str(plan)] + (["-o", str(Path(tmp) / "out")] if cmd == "trace" else [])
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    text = err.getvalue()
    assert "Traceback" not in text
    if code == 0:
        return
    assert code == 1, (code, text)
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("xsim: error: "), text[:2000]
    assert len(lines[0]) < 1000


def test_the_unmutated_bases_are_valid():
    """The fuzz starts from plans that pass (so exit 1 above is caused by the mutation)."""
    for cmd, d in BASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            plan = Path(tmp) / "plan.yaml"
            plan.write_text(_dump(d))
            argv = [cmd, str(plan)] + (["-o", str(Path(tmp) / "out")] if cmd == "trace" else [])
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(argv) == 0
    assert math.isfinite(BASES["trace"]["network"]["scale_out"]["link_gbps"])
