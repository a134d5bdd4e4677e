"""Generated traces: DAG shape, run-order chains, determinism, and the trace directory on disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from helpers import WORKLOADS
from helpers.gen import A100, H100, make_plan, topo_order

from xsim_adapters.errors import TraceError
from xsim_adapters.trace import (
    COLLECTIVE_COLUMNS,
    KIND_COMPUTE,
    KIND_FLOW,
    OP_COLUMNS,
    PHASE_INDEX,
    read_trace,
    write_trace,
)
from xsim_adapters.workload import generate

HETERO = [
    [("h100", 0, 4, 0, 1), ("a100", 0, 2, 1, 3), ("a100", 2, 8, 3, 4)],
    [("h100", 8, 10, 0, 2), ("h100", 10, 12, 2, 4)],
]
HETERO_GROUPS = [("h100", H100, 2, 8), ("a100", A100, 1, 8)]

VARIANTS = {
    "1f1b": {},
    "gpipe": {"training": {"schedule": "gpipe"}},
    "sp+recompute": {"training": {"sequence_parallel": True, "recompute": True}},
    "chunked+2ch": {"collectives": {"granularity": "chunked", "chunks": 3, "channels": 2}},
    "gather": {"collectives": {"resharding": "gather_p2p_scatter"}},
    "direct+natural": {"collectives": {"resharding": "direct", "ring_order": "natural"}},
}


def _hetero(**kw):
    return make_plan(HETERO, groups=HETERO_GROUPS, micro_batches=[5, 3], **kw)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_dag_is_acyclic_and_every_op_reachable_from_a_root(variant: str) -> None:
    trace = generate(_hetero(**VARIANTS[variant]))
    order, roots = topo_order(trace)
    assert len(order) == trace.num_ops  # acyclic (Kahn visits all) and all reachable from roots
    indeg = np.bincount(trace.deps["succ"], minlength=trace.num_ops)
    root_ops = trace.ops[indeg == 0]
    # the only roots: the first forward compute of every first-stage rank (4 + 2)
    assert roots == 6
    assert (root_ops["kind"] == KIND_COMPUTE).all() and (root_ops["stage"] == 0).all()
    assert (root_ops["microbatch"] == 0).all()
    ops = trace.ops
    assert ops["op_id"].tolist() == list(range(len(ops)))
    assert list(ops.columns) == list(OP_COLUMNS)
    assert [str(ops[c].dtype) for c in OP_COLUMNS] == [
        np.dtype(t).name for t in OP_COLUMNS.values()
    ]
    assert list(trace.collectives.columns) == list(COLLECTIVE_COLUMNS)
    flows = trace.flows()
    assert (flows["rank"] != flows["dst"]).all()  # never a flow to itself
    assert trace.manifest["num_ops"] == trace.num_ops
    assert sum(trace.manifest["op_counts"]["by_kind"].values()) == trace.num_ops


def test_each_ranks_compute_ops_form_one_chain_in_run_order() -> None:
    trace = generate(_hetero())
    ops, deps = trace.ops, trace.deps
    comp = ops["kind"].to_numpy() == KIND_COMPUTE
    rank = ops["rank"].to_numpy()
    p, s = deps["pred"].to_numpy(), deps["succ"].to_numpy()
    chain = comp[p] & comp[s] & (rank[p] == rank[s])
    cp, cs = p[chain], s[chain]
    for r in np.unique(rank[comp]):
        mine = set(np.flatnonzero(comp & (rank == r)).tolist())
        sel = rank[cs] == r
        succs = cs[sel].tolist()
        assert len(succs) == len(set(succs)) == len(mine) - 1  # one predecessor each but the first
        nxt = dict(zip(cp[sel].tolist(), succs, strict=True))
        assert len(nxt) == len(mine) - 1  # and one successor each but the last: a single chain
        first = (mine - set(succs)).pop()
        seen = [first]
        while seen[-1] in nxt:
            seen.append(nxt[seen[-1]])
        assert len(seen) == len(mine)
        phases = ops["phase"].to_numpy()[seen]
        assert phases[-1] == PHASE_INDEX["optim"]


def test_tp_all_reduce_bytes_per_rank() -> None:
    plan = _hetero()
    trace = generate(plan)
    flows = trace.flows()
    tp = flows[flows["phase"] == PHASE_INDEX["tp"]]
    size = 1 * plan.model.seq_len * plan.model.hidden * 2
    colls = trace.collectives.set_index("collective")
    for coll, g in list(tp.groupby("collective"))[:50]:
        n = len(colls.at[coll, "ranks"].split(","))
        assert colls.at[coll, "bytes"] == size
        sent = g.groupby("rank")["bytes"].sum()
        assert len(sent) == n and (sent == 2 * (n - 1) * size // n).all()


def test_receiving_stage_waits_for_every_incoming_transfer_flow() -> None:
    trace = generate(_hetero())
    ops = trace.ops
    preds = trace.deps.groupby("succ")["pred"].apply(set)
    pp = ops[
        (ops["kind"] == KIND_FLOW) & ops["phase"].isin([PHASE_INDEX["pp"], PHASE_INDEX["reshard"]])
    ]
    assert set(pp["phase"]) == {PHASE_INDEX["pp"], PHASE_INDEX["reshard"]}
    comp = ops[ops["kind"] == KIND_COMPUTE]
    for op in pp.itertuples():
        # the destination's first compute op of that micro-batch and direction
        succ = [s for s in trace.deps.loc[trace.deps["pred"] == op.op_id, "succ"]]
        targets = comp[comp["op_id"].isin(succ)]
        assert len(targets) == 1
        t = targets.iloc[0]
        assert t["rank"] == op.dst and t["microbatch"] == op.microbatch
        assert op.op_id in preds[t["op_id"]]


def test_same_plan_gives_byte_identical_trace_directories(tmp_path: Path) -> None:
    plan = _hetero()
    a = write_trace(generate(plan), tmp_path / "a")
    b = write_trace(generate(plan), tmp_path / "b")
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    assert [str(f) for f in files_a] == [
        "collectives.parquet",
        "deps.parquet",
        "groups/a100.parquet",
        "groups/h100.parquet",
        "manifest.json",
    ]
    for f in files_a:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    meta = pq.read_metadata(a / "deps.parquet").metadata or {}
    assert b"pandas" not in meta  # no per-run metadata


def test_read_trace_round_trip(tmp_path: Path) -> None:
    trace = generate(_hetero())
    back = read_trace(write_trace(trace, tmp_path / "t"))
    pd.testing.assert_frame_equal(back.ops, trace.ops)
    pd.testing.assert_frame_equal(back.deps, trace.deps)
    pd.testing.assert_frame_equal(back.collectives, trace.collectives)
    assert back.manifest == json.loads(json.dumps(trace.manifest))
    assert back.manifest["plan_digest"] == trace.manifest["plan_digest"]
    assert len(back.manifest["plan_digest"]) == 64
    assert back.manifest["groups"] == ["h100", "a100"]


@pytest.mark.parametrize(("version", "why"), [
    (999, ""),
    # version 1 put NCCL's delay into timed barriers: refused with what changed and what to do
    (1, " (version 1 carried NCCL's per-member latency as timed barriers; version 2 puts it on"
        " each ring's first flows as a start latency)"),
])
def test_read_trace_rejects_other_schema_versions(tmp_path: Path, version: int, why: str) -> None:
    d = write_trace(generate(_hetero()), tmp_path / "t")
    m = json.loads((d / "manifest.json").read_text())
    m["schema_version"] = version
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TraceError) as e:
        read_trace(d)
    msg = str(e.value)
    assert f"schema_version {version} is not supported{why}; this xsim reads schema_version 2." \
        in msg
    assert "Regenerate the trace with `xsim trace PLAN -o" in msg and "upgrade" in msg


def test_read_trace_names_missing_files_and_bad_columns(tmp_path: Path) -> None:
    d = write_trace(generate(_hetero()), tmp_path / "t")
    with pytest.raises(TraceError, match="not a trace directory"):
        read_trace(tmp_path)
    (d / "groups" / "a100.parquet").unlink()
    with pytest.raises(TraceError, match=r"a100.parquet: missing \(ops of group a100\)"):
        read_trace(d)
    d2 = write_trace(generate(_hetero()), tmp_path / "t2")
    deps = pq.read_table(d2 / "deps.parquet").to_pandas().astype({"pred": "int64"})
    deps.to_parquet(d2 / "deps.parquet")
    with pytest.raises(TraceError, match="column pred has dtype int64, expected int32"):
        read_trace(d2)


def test_crash_while_writing_leaves_no_trace_and_keeps_the_old_one(tmp_path, monkeypatch) -> None:
    trace = generate(_hetero())
    old = write_trace(trace, tmp_path / "old")
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    calls = {"n": 0}
    real = pq.write_table

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(pq, "write_table", failing)
    with pytest.raises(OSError, match="disk full"):
        write_trace(trace, tmp_path / "new")
    calls["n"] = 0
    with pytest.raises(OSError, match="disk full"):
        write_trace(trace, old)
    assert sorted(os.listdir(tmp_path)) == ["old"]  # no temporary or half-written directories
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
    monkeypatch.setattr(pq, "write_table", real)
    write_trace(trace, old)  # replacing an existing trace works
    assert sorted(os.listdir(tmp_path)) == ["old"]
    read_trace(old)


@pytest.mark.parametrize(
    "name",
    [
        "homogeneous-h100.yaml",
        "hetero-dp-h100-a100.yaml",
        "hetero-pipeline-reshard.yaml",
        "uneven-layers.yaml",
    ],
)
def test_shipped_plans_generate(name: str) -> None:
    from xsim_adapters.feasibility import load_plan

    plan = load_plan(WORKLOADS / name)
    trace = generate(plan)
    order, _ = topo_order(trace)
    assert len(order) == trace.num_ops
    assert trace.manifest["plan_name"] == plan.name
    assert trace.manifest["workload"]["dp"] == plan.dp
    assert len(trace.manifest["ranks"]) == plan.num_ranks


def test_extra_files_arrive_with_the_trace(tmp_path: Path) -> None:
    trace = generate(_hetero())
    d = write_trace(trace, tmp_path / "t", extra_files={"plan.yaml": "name: x\n"})
    assert (d / "plan.yaml").read_text() == "name: x\n"
    with pytest.raises(ValueError, match="must be a plain file name"):
        write_trace(trace, tmp_path / "u", extra_files={"../evil": "x"})
    assert sorted(os.listdir(tmp_path)) == ["t"]
