"""Chakra ET export, read back with Chakra's own reader (mlc-chakra's protolib.decodeMessage).

Counts, bytes and dependencies are checked exactly against the trace; the p2p mapping against
the GOAL exporter's schedule; and both mappings by replaying the files with zero-time
communication, which must give the trace's own critical path.
"""

from __future__ import annotations

import json
from collections import defaultdict
from graphlib import TopologicalSorter

import numpy as np
import pytest
from helpers.gen import make_plan

from xsim_adapters.plan.model import OverlapSpec
from xsim_adapters.trace.export_goal import rank_programs
from xsim_adapters.trace.latency import latency_as_barriers
from xsim_adapters.trace.schema import KIND_BARRIER, KIND_FLOW
from xsim_adapters.workload import generate

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="needs mlc-chakra (extra [chakra])")
from chakra.schema.protobuf import et_def_pb2 as pb  # noqa: E402
from helpers.chakra import node_attrs as _attrs  # noqa: E402
from helpers.chakra import read_et as _read  # noqa: E402

from xsim_adapters.trace.export_chakra import COLL_TYPES, export_chakra  # noqa: E402

NAME = {v: k for k, v in pb.NodeType.items()}


@pytest.fixture(scope="module", params=["plain", "zero-sp-overlap"])
def trace(request):
    # replica 0: two stages of TP 2 (H100 0-3), replica 1: one stage of TP 4 (H100 8-11):
    # TP all-reduces, resharding P2P between unequal TP, DP all-reduces over LCM chunks; the
    # second adds ZeRO-1 (reduce-scatter + parameter all-gather), sequence parallelism with
    # TP overlap (reduce-scatter / all-gather beside the GEMMs), chunked rings on 2 channels.
    extra = {} if request.param == "plain" else dict(
        training={"zero_stage": 1, "sequence_parallel": True,
                  "overlap": OverlapSpec(tp_comm=True)},
        collectives={"granularity": "chunked", "channels": 2})
    plan = make_plan([[("h100", 0, 2, 0, 2), ("h100", 2, 4, 2, 4)], [("h100", 8, 12, 0, 4)]],
                     **extra)
    return generate(plan)


@pytest.fixture(scope="module", params=["coll", "p2p"])
def exported(request, trace, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"et-{request.param}")
    paths = export_chakra(trace, out, collectives=request.param)
    files = {r: _read(p) for r, p in enumerate(paths)}
    groups = json.loads((out / "comm_groups.json").read_text())
    return request.param, paths, files, groups


def _ring_flows(trace) -> np.ndarray:
    o = trace.ops
    kinds = trace.collectives.set_index("collective")["kind"]
    ring = [int(c) for c, k in kinds.items() if k in COLL_TYPES]
    return ((o["kind"] == KIND_FLOW) & o["collective"].isin(ring)).to_numpy()


def test_one_file_per_rank_with_global_metadata(trace, exported):
    mode, paths, files, _ = exported
    assert [p.name for p in paths] == [f"et.{r}.et" for r in range(trace.num_ranks)]
    for r, (meta, nodes) in files.items():
        m = _attrs(meta)
        assert meta.version == "0.0.4" and m["rank"] == r and m["num_ranks"] == 16
        assert m["collectives"] == mode and m["plan_digest"] == trace.manifest["plan_digest"]
        assert [n.id for n in nodes] == list(range(len(nodes)))
        for n in nodes:  # topological: every dependency is an earlier node of this file
            assert all(d < n.id for d in n.data_deps) and not n.ctrl_deps
            assert _attrs(n)["is_cpu_op"] is False
    # ranks 4..7 and 12..15 hold no stage: one idle node (ASTRA-sim needs a node to start)
    (idle,) = files[5][1]
    assert (idle.type, idle.duration_micros, _attrs(idle)["op_kind"]) == (pb.COMP_NODE, 0, "idle")


def test_compute_and_barriers_are_comp_nodes_with_exact_times(trace, exported):
    mode, _, files, _ = exported
    o = trace.ops
    seen: dict = {}
    for r, (_, nodes) in files.items():
        for n in nodes:
            if n.type == pb.COMP_NODE:
                a = _attrs(n)
                assert a["op_id"] not in seen or a["op_id"] == -1
                seen[a["op_id"]] = (r, a["duration_ns"], n.duration_micros, a["num_ops"])
    # compute ops and barriers keep their ids; a start latency (schema 2) is one COMP_NODE per
    # collective and member (gate flows of all channels share it), numbered after the ops;
    # with coll, a ring collective's own barriers and latencies are inside its node
    lat = latency_as_barriers(trace, per_member=True).ops
    assert len(lat) > len(o)
    comp = lat[lat["kind"] != KIND_FLOW]
    if mode == "coll":
        comp = comp[~_ring_ops(trace, comp)]
    assert sorted(seen) == [-1] * (-1 in seen) + comp["op_id"].tolist()
    seen.pop(-1, None)
    for op, rank, dur, flops in comp[["op_id", "rank", "duration_ns", "flops"]].itertuples(
            index=False):
        r, ns, us, num_ops = seen[op]
        assert (r, ns, num_ops) == (max(rank, 0), dur, round(flops))
        assert us == round(dur / 1000)


def _ring_ops(trace, ops) -> np.ndarray:
    """Flows and barriers (joins, latencies) of ``ops`` that belong to a ring collective."""
    kinds = trace.collectives.set_index("collective")["kind"]
    ring = [int(c) for c, k in kinds.items() if k in COLL_TYPES]
    return (ops["collective"].isin(ring) & ops["kind"].isin([KIND_FLOW, KIND_BARRIER])).to_numpy()


def test_messages_and_collectives_carry_every_byte(trace, exported):
    mode, _, files, groups = exported
    o = trace.ops
    flows = o[o["kind"] == KIND_FLOW]
    ring = _ring_flows(trace)[flows.index] if mode == "coll" else np.zeros(len(flows), bool)
    sends, recvs, colls = {}, {}, defaultdict(dict)
    for r, (_, nodes) in files.items():
        for n in nodes:
            a = _attrs(n)
            if n.type == pb.COMM_SEND_NODE:
                assert a["comm_src"] == r and a["comm_tag"] not in sends
                sends[a["comm_tag"]] = (r, a["comm_dst"], a["comm_size"], a["op_id"])
            elif n.type == pb.COMM_RECV_NODE:
                assert a["comm_dst"] == r and a["comm_tag"] not in recvs
                recvs[a["comm_tag"]] = (a["comm_src"], r, a["comm_size"], a["op_id"])
            elif n.type == pb.COMM_COLL_NODE:
                assert mode == "coll" and a["collective"] not in colls[r]
                colls[r][a["collective"]] = a
    assert sends == recvs  # every message is matched on its peer with the same tag and size
    direct = flows[~ring]
    got = {op: (s, d, b) for s, d, b, op in sends.values() if op >= 0}
    assert got == {op: (s, d, b) for op, s, d, b in
                   direct[["op_id", "rank", "dst", "bytes"]].itertuples(index=False)}
    # notifications: 1 byte (ASTRA-sim asserts chunk_size > 0), marked as such
    assert all(b == 1 for _, _, b, op in sends.values() if op < 0)
    assert {bool(_attrs(n).get("notification")) for _, nodes in files.values() for n in nodes
            if n.type == pb.COMM_SEND_NODE and _attrs(n)["op_id"] < 0} <= {True}
    if mode == "p2p":
        assert not colls and sum(b for _, _, b, _ in sends.values()) == flows["bytes"].sum()
        return
    ctab = trace.collectives.set_index("collective")
    rf = flows[ring]
    assert set(rf["collective"]) == {c for per in colls.values() for c in per}
    for c, f in rf.groupby("collective"):
        members = sorted(set(f["rank"]) | set(f["dst"]))
        assert sorted(r for r in colls if c in colls[r]) == members
        for r in members:
            a = colls[r][c]
            assert a["comm_size"] == ctab.loc[c, "bytes"]
            assert pb.CollectiveCommType.Name(a["comm_type"]) == COLL_TYPES[ctab.loc[c, "kind"]]
            assert groups[a["pg_name"]] == members


def test_p2p_mapping_is_the_goal_schedule(trace, tmp_path):
    paths = export_chakra(trace, tmp_path, collectives="p2p")
    files = {r: _read(p) for r, p in enumerate(paths)}
    progs = rank_programs(trace, latency_per_member=True)
    for r, (_, nodes) in files.items():
        prog = progs.get(r)
        if prog is None:
            assert [_attrs(n)["op_kind"] for n in nodes] == ["idle"]
            continue

        def key_goal(v):
            label, kind, _, _, tag, _, op = v
            return (kind, op if op >= 0 else tag)

        by_label = {v[0]: key_goal(v) for v in prog.vertices}
        kinds = {pb.COMP_NODE: "calc", pb.COMM_SEND_NODE: "send", pb.COMM_RECV_NODE: "recv"}
        by_id = {}
        for n in nodes:
            a = _attrs(n)
            op = a["op_id"] if a["op_id"] >= 0 else a["comm_tag"]
            by_id[n.id] = (kinds[n.type], op)
        assert sorted(by_id.values()) == sorted(by_label.values())
        # GOAL's notification tags start at 2^40, Chakra's at the number of ops: the same
        # messages in the same order
        goal_notes = sorted(t for k, t in by_label.values() if t >= trace.num_ops)
        ours = sorted(t for k, t in by_id.values() if t >= trace.num_ops)
        assert len(goal_notes) == len(ours)
        norm = dict(zip(goal_notes, ours, strict=True))

        def fix(k, norm=norm):
            return (k[0], norm.get(k[1], k[1]))

        goal_deps = {(fix(by_label[a]), fix(by_label[b])) for a, b in prog.requires}
        assert goal_deps == {(by_id[n.id], by_id[d]) for n in nodes for d in n.data_deps}


def _trace_critical_path_ns(trace, without_ring_latency: bool = False) -> int:
    o = trace.ops
    dur = o["duration_ns"].to_numpy().copy()  # a flow's is its start latency; comm: no time
    if without_ring_latency:  # what a coll export leaves to the simulator's collectives
        dur[_ring_ops(trace, o)] = 0
    preds = defaultdict(list)
    for p, s in trace.deps[["pred", "succ"]].itertuples(index=False):
        preds[s].append(p)
    end = {}
    for op in TopologicalSorter({i: preds[i] for i in range(len(o))}).static_order():
        end[op] = max((end[p] for p in preds[op]), default=0) + int(dur[op])
    return max(end.values())


def _replay_zero_comm_ns(files) -> int:
    """Replay the ET files: compute takes duration_ns, a message arrives when sent, and a
    collective finishes on all members once every member has reached it."""
    preds, dur, send_of, coll_deps = {}, {}, {}, defaultdict(list)
    for r, (_, nodes) in files.items():
        for n in nodes:
            a = _attrs(n)
            preds[(r, n.id)] = [(r, d) for d in n.data_deps]
            dur[(r, n.id)] = a.get("duration_ns", 0)
            if n.type == pb.COMM_SEND_NODE:
                send_of[a["comm_tag"]] = (r, n.id)
            elif n.type == pb.COMM_COLL_NODE:
                coll_deps[a["collective"]] += preds[(r, n.id)]
    for r, (_, nodes) in files.items():
        for n in nodes:
            a = _attrs(n)
            if n.type == pb.COMM_RECV_NODE:
                preds[(r, n.id)].append(send_of[a["comm_tag"]])
            elif n.type == pb.COMM_COLL_NODE:
                preds[(r, n.id)] = coll_deps[a["collective"]]
    end: dict = {}
    for v in TopologicalSorter(preds).static_order():
        end[v] = max((end[p] for p in preds.get(v, ())), default=0) + dur.get(v, 0)
    return max(end.values())


def test_zero_time_replay_of_the_files_gives_the_trace_critical_path(trace, exported):
    mode, _, files, _ = exported
    assert _replay_zero_comm_ns(files) == _trace_critical_path_ns(trace, mode == "coll") > 0


def test_missing_chakra_says_how_to_install_it(monkeypatch, trace, tmp_path):
    import sys

    from xsim_adapters.errors import BackendUnavailable

    monkeypatch.setitem(sys.modules, "chakra.schema.protobuf", None)
    with pytest.raises(BackendUnavailable, match=r'pip install "xsim-adapters\[chakra\]"'):
        export_chakra(trace, tmp_path / "et")
    assert not (tmp_path / "et").exists()
