"""Corrupt traces: each consumer (``xsim export``, ``xsim run``) refuses every one with exit 1
and one line naming the file and the field, no traceback, in bounded time and memory.

The corrupt traces are made by mutating one trace generated at test time.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from attack_runner import assert_clean_error, run_cli

from xsim_adapters.cli import main

# A small plan (a few thousand ops) so that each case copies and reads little.
PLAN = """name: attack-small
model: tiny-gpt
training: {global_batch: 8, micro_batch: 1}
device_groups:
  h100: {type: H100-80GB, nodes: 1, gpus_per_node: 8}
replicas:
  uniform: {group: h100, tp: 2, pp: 2, dp: 2}
"""
GROUP = "groups/h100.parquet"
# consumer per case: most go through export, these through run (both read via read_trace)
RUN = {"manifest-digest", "plan-edited", "plan-garbage", "plan-missing", "deps-cycle",
       "ops-rank-beyond", "manifest-list", "manifest-group-dotdot", "ops-nan-flops"}

Mutation = Callable[[Path], None]
CASES: list[tuple[str, Mutation, str]] = []


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("good")
    (base / "plan.yaml").write_text(PLAN)
    assert main(["trace", str(base / "plan.yaml"), "-o", str(base / "trace")]) == 0
    return base / "trace"


def _manifest(t: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    m = json.loads((t / "manifest.json").read_text())
    change(m)
    (t / "manifest.json").write_text(json.dumps(m))


def _frame(t: Path, rel: str, change: Callable[[pd.DataFrame], pd.DataFrame | None]) -> None:
    df = pq.read_table(t / rel).to_pandas()
    new = change(df)
    df = df if new is None else new
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), t / rel)


def manifest_case(cid: str, change: Callable[[dict[str, Any]], Any], named: str) -> None:
    CASES.append((cid, lambda t, c=change: _manifest(t, c), named))


def frame_case(cid: str, rel: str, change: Callable[[pd.DataFrame], Any], named: str) -> None:
    CASES.append((cid, lambda t, r=rel, c=change: _frame(t, r, c), named))


def raw_case(cid: str, rel: str, data: bytes, named: str) -> None:
    CASES.append((cid, lambda t, r=rel, d=data: (t / r).write_bytes(d), named))


def _set_col(col: str, value: Any, where: Callable[[pd.DataFrame], Any] | None = None):
    def change(df: pd.DataFrame) -> None:
        rows = where(df) if where is not None else df.index[:1]
        df.loc[rows, col] = np.array(value).astype(df[col].dtype)

    return change


def _first(kind: int) -> Callable[[pd.DataFrame], Any]:
    return lambda df: df.index[df["kind"] == kind][:1]


# ---------------------------------------------------------------- manifest
raw_case("manifest-list", "manifest.json", b"[]", "manifest.json")
raw_case("manifest-not-json", "manifest.json", b"{", "manifest.json")
raw_case("manifest-utf16", "manifest.json", '{"a": 1}'.encode("utf-16"), "byte offset 0")
raw_case("manifest-deep", "manifest.json", b"[" * 100_000 + b"]" * 100_000, "manifest.json")
manifest_case("manifest-num-ops-string", lambda m: m.update(num_ops=str(m["num_ops"])),
              "num_ops")
manifest_case("manifest-num-ops-wrong", lambda m: m.update(num_ops=m["num_ops"] + 1), "num_ops")
manifest_case("manifest-rank-without-group", lambda m: m["ranks"][3].pop("group"),
              "ranks[3].group")
manifest_case("manifest-rank-beyond", lambda m: m["ranks"][3].update(rank=999), "ranks[3].rank")
manifest_case("manifest-rank-not-object", lambda m: m["ranks"].__setitem__(0, 7), "ranks[0]")
manifest_case("manifest-ranks-string", lambda m: m.update(ranks="x" * 10_000), "ranks")
manifest_case("manifest-groups-string", lambda m: m.update(groups="h100"), "groups")
manifest_case("manifest-group-dotdot", lambda m: m.update(groups=["../../etc/x"]), "groups[0]")
manifest_case("manifest-group-absolute", lambda m: m.update(groups=["/tmp/x"]), "groups[0]")
manifest_case("manifest-group-unknown-rank", lambda m: m["ranks"][0].update(group="a100"),
              "ranks[0].group")
manifest_case("manifest-schema-99", lambda m: m.update(schema_version=99), "schema_version")
manifest_case("manifest-no-ranks", lambda m: m.pop("ranks"), "ranks")
manifest_case("manifest-fewer-ranks", lambda m: m.update(ranks=m["ranks"][:3]), "column rank")
manifest_case("manifest-digest", lambda m: m.update(plan_digest="0" * 64), "plan_digest")

# ---------------------------------------------------------------- ops (group file)
frame_case("ops-rank-beyond", GROUP, _set_col("rank", 9999), "column rank")
frame_case("ops-phase-99", GROUP, _set_col("phase", 99), "column phase")
frame_case("ops-unknown-kind", GROUP, _set_col("kind", 7), "column kind")
frame_case("ops-negative-bytes", GROUP, _set_col("bytes", -5, _first(1)), "column bytes")
frame_case("ops-negative-duration", GROUP, _set_col("duration_ns", -1, _first(0)),
           "column duration_ns")
frame_case("ops-nan-flops", GROUP, _set_col("flops", np.nan, _first(0)), "column flops")
frame_case("ops-negative-flops", GROUP, _set_col("flops", -1e12, _first(0)), "column flops")
frame_case("ops-dst-beyond", GROUP, _set_col("dst", 500, _first(1)), "column dst")
frame_case("ops-duplicate-id", GROUP, _set_col("op_id", 5, lambda df: df.index[6:7]),
           "column op_id")
frame_case("ops-extra-rows", GROUP, lambda df: pd.concat([df, df.iloc[:3]]), "rows")
frame_case("ops-bytes-float", GROUP, lambda df: df.assign(bytes=df["bytes"].astype(float)),
           "column bytes")
frame_case("ops-missing-column", GROUP, lambda df: df.drop(columns=["phase"]), "phase")
frame_case("ops-collective-unknown", GROUP, _set_col("collective", 10**8, _first(1)),
           "column collective")
raw_case("ops-garbage", GROUP, b"PAR1" + b"\0" * 100, GROUP)
CASES.append(("ops-missing-file", lambda t: (t / GROUP).unlink(), GROUP))

# ---------------------------------------------------------------- deps
def _cycle(df: pd.DataFrame) -> pd.DataFrame:
    e = df.iloc[len(df) // 2]
    return pd.concat([df, pd.DataFrame({"pred": [e["succ"]], "succ": [e["pred"]]})])


def _long_cycle(df: pd.DataFrame) -> pd.DataFrame:
    # from the last op back to the first: a cycle through a path of many levels
    back = pd.DataFrame({"pred": [df["succ"].max()], "succ": [0]}).astype(df.dtypes.to_dict())
    return pd.concat([df, back], ignore_index=True)


frame_case("deps-cycle", "deps.parquet", _cycle, "cycle")
frame_case("deps-long-cycle", "deps.parquet", _long_cycle, "cycle")
frame_case("deps-missing-op", "deps.parquet", _set_col("pred", 10**9), "column pred")
frame_case("deps-negative", "deps.parquet", _set_col("succ", -3), "column succ")
frame_case("deps-self-loop", "deps.parquet",
           lambda df: df.assign(succ=np.where(df.index == 0, df["pred"], df["succ"])),
           "self-loops")
CASES.append(("deps-missing-file", lambda t: (t / "deps.parquet").unlink(), "deps.parquet"))

# ---------------------------------------------------------------- plan.yaml beside the trace
def _edit_plan(t: Path) -> None:
    p = t / "plan.yaml"
    p.write_text(p.read_text().replace("nic_gbps: 400", "nic_gbps: 2", 1).replace(
        "link_gbps: 400", "link_gbps: 2", 1))


CASES.append(("plan-edited", _edit_plan, "plan_digest"))
raw_case("plan-garbage", "plan.yaml", b"\xff\xfe\0garbage", "plan.yaml")
CASES.append(("plan-missing", lambda t: (t / "plan.yaml").unlink(), "plan.yaml"))


@pytest.mark.parametrize(("mutate", "named", "consumer"),
                         [(m, n, "run" if c in RUN else "export") for c, m, n in CASES],
                         ids=[c[0] for c in CASES])
def test_corrupt_trace(good_trace, mutate, named, consumer, tmp_path):
    """exit 1, one line naming the file and the field, no traceback, bounded time and memory."""
    t = tmp_path / "trace"
    shutil.copytree(good_trace, t)
    mutate(t)
    out_path = tmp_path / ("out.goal" if consumer == "export" else "run")
    argv = (["export", str(t), "--format", "goal", "-o", str(out_path)] if consumer == "export"
            else ["run", str(t), "-o", str(out_path), "--no-plots"])
    out = run_cli(argv)
    assert_clean_error(out, named)
    assert not out_path.exists()


def test_validation_is_fast_and_accepts_the_good_trace(good_trace, tmp_path):
    """The unmutated trace passes every check (the corpus above is not refused by accident)."""
    out = run_cli(["export", str(good_trace), "--format", "goal", "-o", str(tmp_path / "g")])
    assert out.code == 0, out.stderr
    assert (tmp_path / "g").read_text().startswith("num_ranks 8\n")


def _dfs_has_cycle(a: np.ndarray, b: np.ndarray, n: int) -> bool:
    succs: dict[int, list[int]] = {}
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        succs.setdefault(x, []).append(y)
    state = [0] * n  # 0 new, 1 on the stack, 2 done

    def visit(v: int) -> bool:
        state[v] = 1
        for w in succs.get(v, []):
            if state[w] == 1 or (state[w] == 0 and visit(w)):
                return True
        state[v] = 2
        return False

    return any(state[v] == 0 and visit(v) for v in range(n))


@pytest.mark.parametrize("path", ["native", "scc", "kahn"])
def test_cycle_checks_agree_with_a_depth_first_search(monkeypatch, path):
    """The compiled core's Kahn, the SCC path and Kahn in numpy find exactly the cycles a plain
    DFS finds."""
    from xsim_adapters.trace import validate
    from xsim_adapters.trace.validate import acyclic_remainder, cyclic_ops

    if path == "native":
        native = pytest.importorskip("xsim_flowcore").unordered_ops
    else:
        monkeypatch.setattr(validate, "_native_unordered", lambda: None)
        monkeypatch.setattr(validate, "SCC_MIN_EDGES", 0 if path == "scc" else 10**9)
    rng = np.random.default_rng(7)
    cyclic_seen = 0
    for i in range(300):
        n = int(rng.integers(2, 25))
        e = int(rng.integers(0, 50))
        a, b = rng.integers(0, n, e), rng.integers(0, n, e)
        a, b = a[a != b], b[a != b]
        if i % 2:  # the trace's int32 edges, and int64 as older traces and callers give
            a, b = a.astype(np.int32), b.astype(np.int32)
        cyclic = _dfs_has_cycle(a, b, n)
        cyclic_seen += cyclic
        assert (acyclic_remainder(a, b, n) > 0) == cyclic
        assert (cyclic_ops(a, b, n) > 0) == cyclic
        if path == "native":  # every op numpy's windowed Kahn leaves unordered, and maybe
            # more: the ops behind a cycle past the window of backward edges
            assert native(a, b, n) >= acyclic_remainder(a, b, n)
    assert 30 < cyclic_seen < 270  # both outcomes were exercised


def test_native_cycle_check_refuses_an_edge_outside_the_ops():
    """The compiled check names the bad edge instead of reading out of bounds."""
    native = pytest.importorskip("xsim_flowcore").unordered_ops
    with pytest.raises(ValueError, match="edge 1 names an op outside 0..3"):
        native(np.array([0, 5]), np.array([1, 2]), 4)


@pytest.mark.parametrize(("column", "value"), [("flops", -1e12), ("flops", np.nan),
                                                ("bytes", -1), ("phase", 99)])
def test_api_run_refuses_a_corrupt_trace_object(good_trace, column, value):
    """A Trace handed to api.run (how plugins and scripts reach a backend) is validated too,
    so NaN or negative FLOPs never reach the metrics (no negative MFU)."""
    from xsim_adapters import api
    from xsim_adapters.errors import TraceError

    trace, plan = api.load_trace_and_plan(good_trace)
    ops = trace.ops.copy()
    row = ops.index[ops["kind"] == (0 if column == "flops" else 1)][0]
    ops.loc[row, column] = np.array(value).astype(ops[column].dtype)
    trace.ops = ops
    with pytest.raises(TraceError, match=f"column {column}"):
        api.run(trace, "flow", api.build_topology(plan))
