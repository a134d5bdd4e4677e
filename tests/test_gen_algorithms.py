"""Tree, NVLS and hierarchical lowerings, NCCL's tuner rule (auto) and collectives.algorithm."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers.gen import H100, TINY, make_plan, topo_order

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.bench_collective import bench, bench_plan, lowered_trace
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.model import CollectiveAlgorithms
from xsim_adapters.plan.serialize import plan_to_dict
from xsim_adapters.topology import build_topology
from xsim_adapters.trace.schema import PHASE_INDEX
from xsim_adapters.workload import generate
from xsim_adapters.workload.comm.algorithms import (
    dtree_parents,
    layout_of,
    merge,
    staged_flows,
    tile,
    tree_flows,
)
from xsim_adapters.workload.comm.collectives import ring_flows
from xsim_adapters.workload.comm.nccl import (
    NVLINK_BW_EFFICIENCY_BY_CC,
    NVLS_CHANNELS,
    NVLS_EFFICIENCY,
    Fabric,
    choose,
)

INF = float("inf")


def _layout(servers: int, ppn: int):
    return layout_of(np.repeat(np.arange(servers), ppn), np.tile(np.arange(ppn), servers))


def _sent(t, n):
    return np.bincount(t.src, weights=t.nbytes, minlength=n).astype(np.int64)


def _received(t, n):
    return np.bincount(t.dst, weights=t.nbytes, minlength=n).astype(np.int64)


# ---- lowerings: closed-form bytes per rank ---------------------------------------------------
@pytest.mark.parametrize("servers,ppn,size", [(1, 8, (1 << 20) + 7), (2, 8, 12345678),
                                              (3, 4, 999_999), (5, 1, 1 << 16)])
def test_tree_moves_each_channel_share_up_and_down_every_edge(servers, ppn, size) -> None:
    n = servers * ppn
    t = tree_flows(_layout(servers, ppn), size, channels=4, chunks=3)
    # every non-root member sends its channel share up once and receives it down once, per
    # channel: 2(n-1) edge crossings of S/C per channel, S per channel set
    assert int(t.nbytes.sum()) == 2 * (n - 1) * size
    assert np.array_equal(_sent(t, n).sum(), _received(t, n).sum())
    for c in range(4):
        sel = t.channel == c
        # a tree: n - 1 edges, each carrying the channel's share both ways
        pairs = {(int(a), int(b)) for a, b in zip(t.src[sel], t.dst[sel], strict=True)}
        assert len(pairs) == 2 * (n - 1)
        assert all((b, a) in pairs for a, b in pairs)


def test_double_binary_tree_matches_ncclgetdtree() -> None:
    # ncclGetBtree on 4 ranks: 0 is the root with child 2; 2 has children 1 and 3
    assert dtree_parents(4, 0) == [-1, 2, 0, 2]
    # tree 1 mirrors tree 0 for an even count: root 3, child 1, leaves 0 and 2
    assert dtree_parents(4, 1) == [1, 3, 1, -1]
    # odd count: tree 1 is tree 0 ([-1, 2, 4, 2, 0] on 5 ranks) shifted by one rank
    assert dtree_parents(5, 0) == [-1, 2, 4, 2, 0]
    assert dtree_parents(5, 1) == [1, -1, 3, 0, 3]
    for n in range(2, 17):
        for t in (0, 1):
            par = dtree_parents(n, t)
            assert par.count(-1) == 1
            root = par.index(-1)
            assert par.count(root) == 1  # the root has one child (NCCL's btree)


@pytest.mark.parametrize("ppn", [2, 4, 8])
def test_nvls_one_server_sends_and_receives_s_plus_s_over_m(ppn) -> None:
    s = 8 * 1024 * 1024 + 40
    t = staged_flows(_layout(1, ppn), s, "all_reduce", "nvls", chunks=4)
    want = s * (ppn + 1) // ppn  # its share of every slice up + its slice down, and back
    assert np.all(_sent(t, ppn) == want)
    assert np.all(_received(t, ppn) == want)


@pytest.mark.parametrize("ppn", [4, 5, 6, 8])
def test_nvls_phase_b_waits_on_phase_a_through_a_join_when_it_is_smaller(ppn) -> None:
    """One server, one piece: 2m(m-1) flows; phase B from a GPU waits on the m-1 phase-A flows
    into it. As (m-1)^2 edges per GPU, or through one join (a zero-byte barrier of that GPU)
    with 2(m-1) edges when (m-1)^2 > 2(m-1) + JOIN_COST_EDGES: m >= 6."""
    from xsim_adapters.trace.schema import KIND_BARRIER, KIND_FLOW
    from xsim_adapters.workload.comm.algorithms import JOIN_COST_EDGES, worth_a_join

    m = ppn
    t = staged_flows(_layout(1, m), 1 << 20, "all_reduce", "nvls", chunks=4)
    joined = (m - 1) ** 2 > 2 * (m - 1) + JOIN_COST_EDGES
    assert joined == worth_a_join(m - 1, m - 1) == (m >= 6)
    flows = 2 * m * (m - 1)
    if not joined:
        assert t.kind is None and t.size == flows and len(t.pred) == m * (m - 1) ** 2
        return
    kinds = t.op_kinds()
    assert t.size == flows + m and int((kinds == KIND_BARRIER).sum()) == m
    assert len(t.pred) == m * 2 * (m - 1)
    joins = np.flatnonzero(kinds == KIND_BARRIER)
    assert (t.nbytes[joins] == 0).all() and (t.src[joins] == t.dst[joins]).all()
    assert sorted(t.src[joins].tolist()) == list(range(m))
    assert (t.op_dst()[joins] == -1).all() and (t.op_dst()[kinds == KIND_FLOW] >= 0).all()
    for j in joins.tolist():  # in: the flows into its GPU; out: the flows from it
        g = int(t.src[j])
        ins, outs = t.pred[t.succ == j], t.succ[t.pred == j]
        assert sorted(t.dst[ins].tolist()) == [g] * (m - 1)
        assert sorted(t.src[outs].tolist()) == [g] * (m - 1)
    # no join is a gate or a tail
    assert not np.isin(joins, t.start).any() and not np.isin(joins, t.tails).any()


def test_nvls_join_leaves_the_timeline_as_the_edges_do(monkeypatch) -> None:
    """The same 8-GPU NVLS all-reduce with joins and with (m-1)^2 edges per GPU: the same end
    time for every flow, on the flow backend."""
    from xsim_adapters.workload.comm import algorithms

    plan = bench_plan("H100-80GB", 1, 8)
    topo = build_topology(plan)
    s = 96 << 20
    with_join, end_a, _ = lowered_trace(plan, "all_reduce", s, 0, True, "nvls")
    monkeypatch.setattr(algorithms, "JOIN_COST_EDGES", 10**9)
    plain, end_b, _ = lowered_trace(plan, "all_reduce", s, 0, True, "nvls")
    assert with_join.num_ops == plain.num_ops + 8
    assert len(with_join.deps) < len(plain.deps)
    ta = FlowBackend().run(with_join, topo, {}).frame["end_ns"].to_numpy()
    tb = FlowBackend().run(plain, topo, {}).frame["end_ns"].to_numpy()
    assert ta[end_a] == tb[end_b] > 0
    fa = with_join.ops["kind"].to_numpy() == 1
    fb = plain.ops["kind"].to_numpy() == 1
    assert np.array_equal(ta[fa], tb[fb])


def test_nvls_two_servers_adds_the_rail_all_reduce_of_a_slice() -> None:
    s, m = 1 << 24, 8
    t = staged_flows(_layout(2, m), s, "all_reduce", "nvls", chunks=4)
    # per piece P (4 of S/4): P(m+1)/m inside the server + a 2-member ring all-reduce of P/m
    want = s * (m + 1) // m + 2 * (2 - 1) * (s // m) // 2
    assert np.all(_sent(t, 2 * m) == want)


def test_hierarchical_bytes_are_intra_rs_rail_ar_intra_ag() -> None:
    servers, m = 4, 8
    s = servers * m * 4096 * 4  # divisible by every cut
    n = servers * m
    t = staged_flows(_layout(servers, m), s, "all_reduce", "ring", chunks=4)
    intra = 2 * (m - 1) * s // m
    rail = 2 * (servers - 1) * (s // m) // servers
    assert np.all(_sent(t, n) == intra + rail)
    same = (t.src // m) == (t.dst // m)
    assert int(t.nbytes[~same].sum()) == n * rail  # only the rail rings cross servers
    cross = t.src[~same] % m == t.dst[~same] % m
    assert cross.all()  # rail-aligned


def test_hierarchical_reduce_scatter_and_all_gather_halves() -> None:
    servers, m = 2, 4
    s = 1 << 20
    n = servers * m
    rs = staged_flows(_layout(servers, m), s, "reduce_scatter", "ring", chunks=2)
    ag = staged_flows(_layout(servers, m), s, "all_gather", "ring", chunks=2)
    want = (m - 1) * s // m + (servers - 1) * (s // m) // servers
    assert np.all(_sent(rs, n) == want)
    assert np.all(_sent(ag, n) == want)


# ---- NCCL's tuner rule -----------------------------------------------------------------------
A100_1 = Fabric(8, 1, 8, 300.0, INF, "nvlink", 80, False)
H100_1 = Fabric(8, 1, 8, 450.0, INF, "nvlink", 90, True)
A100_2 = Fabric(16, 2, 8, 300.0, 25.0, "nvlink", 80, False, channels=16)
A100_8 = Fabric(64, 8, 8, 300.0, 25.0, "nvlink", 80, False, channels=16)


@pytest.mark.parametrize("fab,size,algo,proto", [
    (A100_1, 1 << 10, "ring", "LL"),
    (A100_1, 16 << 20, "ring", "LL128"),
    (A100_1, 8 << 30, "ring", "Simple"),  # no NVLS on A100; tree is slower on one server
    (H100_1, 1 << 10, "ring", "LL"),
    (H100_1, 16 << 20, "nvls", "Simple"),
    (H100_1, 8 << 30, "nvls", "Simple"),
    (A100_2, 64 << 10, "tree", "LL"),  # latency: 2 log2(N) network hops beat 2(N-1)
    (A100_2, 8 << 30, "ring", "Simple"),
    (A100_8, 1 << 20, "tree", "LL128"),
    (A100_8, 8 << 30, "ring", "Simple"),
])
def test_auto_picks_as_the_documented_rule(fab, size, algo, proto) -> None:
    c = choose("all_reduce", size, fab)
    assert (c.algorithm, c.protocol) == (algo, proto)


def test_auto_is_the_least_predicted_time_and_reduce_scatter_is_ring_only() -> None:
    for size in (1 << 12, 1 << 20, 1 << 28):
        best = choose("all_reduce", size, H100_1)
        for algo in ("ring", "tree", "nvls"):
            assert best.time_us(size) <= choose("all_reduce", size, H100_1, algo).time_us(size)
        assert choose("reduce_scatter", size, H100_1).algorithm == "ring"
    # ring latency: base + 14 NVLink steps (tuning.cc Ring LL: 6.6 + 14 x 0.6 us)
    assert choose("all_reduce", 1024, A100_1).latency_us == pytest.approx(15.0)
    # NVLS on one node: the NVLink NVLS hop only (hwLat 25 us, base 0)
    assert choose("all_reduce", 1 << 30, H100_1).latency_us == pytest.approx(25.0)


# ---- bench numbers vs closed forms -----------------------------------------------------------
def test_bench_nvls_without_nccl_cost_is_link_rate_over_s_plus_s_over_m() -> None:
    s = 1 << 30
    f = bench(bench_plan("H100-80GB", 1, 8), "all_reduce", [s], nccl_cost=False,
              algorithm="nvls")
    assert f["algorithm"].iloc[0] == "nvls:Simple"
    # each link carries S + S/8 at 450 GB/s: algbw = 450 x 8/9, busbw = algbw x 14/8
    assert f["busbw"].iloc[0] == pytest.approx(450 * 8 / 9 * 14 / 8, rel=0.01)


def test_bench_nvls_with_cost_runs_at_nccl_nvls_rate() -> None:
    s = 8 << 30
    f = bench(bench_plan("H100-80GB", 1, 8), "all_reduce", [s], algorithm="auto")
    link = 450 * NVLINK_BW_EFFICIENCY_BY_CC[90] * NVLS_EFFICIENCY[90] * (
        NVLS_CHANNELS[90] - 1) / NVLS_CHANNELS[90]
    assert f["busbw"].iloc[0] == pytest.approx(link * 8 / 9 * 14 / 8, rel=0.01)
    # and within 10% of the public H100 measurement at 8 GiB (478.87 GB/s)
    assert f["busbw"].iloc[0] == pytest.approx(478.87, rel=0.10)


def test_bench_hierarchical_two_servers_is_bounded_by_its_phases() -> None:
    s = 1 << 30
    f = bench(bench_plan("A100-80GB", 2, 8), "all_reduce", [s], nccl_cost=False,
              algorithm="hierarchical")
    t_ns = f["time_us"].iloc[0] * 1e3
    intra = 2 * 7 / 8 * s / 300.0  # RS + AG over NVLink
    rail = 2 * (1 / 2) * (s / 8) / 25.0  # ring all-reduce of S/8 over two NICs
    assert max(intra, rail) <= t_ns <= intra + rail


def test_explicit_nvls_on_a100_falls_back_to_ring() -> None:
    _, _, algo = lowered_trace(bench_plan("A100-80GB", 1, 8), "all_reduce", 1 << 30,
                               algorithm="nvls")
    assert algo == "ring:Simple"


# ---- plan field ------------------------------------------------------------------------------
def test_algorithm_field_one_value_or_per_kind_and_round_trip() -> None:
    base = make_plan([[("h100", 0, 8, 0, 4)]])
    d = plan_to_dict(base)
    assert d["collectives"]["algorithm"] == {"all_reduce": "auto", "reduce_scatter": "auto",
                                             "all_gather": "auto"}
    d["collectives"]["algorithm"] = "ring"
    p = plan_from_dict(d, feasibility=False)
    assert p.collectives.algorithm.of("all_gather") == "ring"
    d["collectives"]["algorithm"] = {"all_reduce": "nvls"}
    p = plan_from_dict(d, feasibility=False)
    assert p.collectives.algorithm.all_reduce == "nvls"
    assert p.collectives.algorithm.reduce_scatter == "auto"
    assert plan_from_dict(plan_to_dict(p), feasibility=False) == p


@pytest.mark.parametrize("value,msg", [
    ("butterfly", "collectives.algorithm: expected one of auto, ring, tree, nvls, hierarchical"),
    ({"all_to_all": "ring"}, "collectives.algorithm"),
    ({"all_reduce": "star"}, "collectives.algorithm.all_reduce"),
])
def test_bad_algorithm_names_the_path(value, msg) -> None:
    d = plan_to_dict(make_plan([[("h100", 0, 8, 0, 4)]]))
    d["collectives"]["algorithm"] = value
    with pytest.raises(PlanError, match=msg.replace(".", r"\.")):
        plan_from_dict(d, feasibility=False)


# ---- generator -------------------------------------------------------------------------------
def test_generator_lowers_h100_tp_all_reduce_by_nvls_and_ring_on_request() -> None:
    groups = [("h100", replace(H100, nvls=True, compute_capability=90), 2, 8)]
    # 4 MiB activations (b s h x 2 bytes): NVLS from ~1 MiB on H100 (tiny ones stay ring LL)
    model = replace(TINY, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816, seq_len=2048)
    auto = generate(make_plan([[("h100", 0, 8, 0, 4)]], groups, model))
    tp = auto.collectives[auto.collectives["kind"] == "all_reduce"]
    assert len(tp) and set(tp["algorithm"]) == {"nvls:Simple"}
    flows = auto.ops[(auto.ops["kind"] == 1) & auto.ops["collective"].isin(tp["collective"])]
    # every NVLS all-reduce moves S(m+1)/m per member (8 members)
    per = flows.groupby("collective")["bytes"].sum()
    s = int(tp["bytes"].iloc[0])
    assert set(per) == {8 * (s * 9 // 8)}
    small = generate(make_plan([[("h100", 0, 8, 0, 4)]], groups))
    assert all(a.startswith("ring") for a in small.collectives["algorithm"])
    ring = generate(make_plan([[("h100", 0, 8, 0, 4)]], groups, model, collectives={
        "algorithm": CollectiveAlgorithms("ring", "ring", "ring")}))
    rtp = ring.collectives[ring.collectives["kind"] == "all_reduce"]
    assert all(a.startswith("ring") for a in rtp["algorithm"])


def test_dp_sync_across_servers_runs_as_tree_with_exact_bytes() -> None:
    # 16 single-GPU replicas on 2 servers: small per-layer gradient buckets -> NCCL's tree
    plan = make_plan([[("h100", i, i + 1, 0, 4)] for i in range(16)], micro_batches=[1] * 16)
    trace = generate(plan)
    colls = trace.collectives
    dp = colls[colls["phase"] == PHASE_INDEX["dp"]].set_index("collective")
    assert len(dp) and all(a.startswith("tree:") for a in dp["algorithm"])
    flows = trace.ops[(trace.ops["kind"] == 1) & trace.ops["collective"].isin(dp.index)]
    per = flows.groupby("collective")["bytes"].sum()
    for cid, total in per.items():
        assert total == 2 * 15 * dp.at[cid, "bytes"]  # every tree edge, both ways
    order, _ = topo_order(trace)
    assert len(order) == trace.num_ops  # acyclic
    tl = FlowBackend().run(trace, build_topology(plan), {})
    assert (tl.frame["end_ns"] >= tl.frame["start_ns"]).all()


def test_merge_keeps_instances_edges_and_gates_of_each_part() -> None:
    members = np.arange(24).reshape(3, 8)
    perm = np.tile(np.arange(8), (2, 1, 1))
    ring = ring_flows(members[[0, 2]], perm, np.array([[800], [1600]]), "all_reduce")
    tree = tile(tree_flows(_layout(1, 8), 4000, 2, 2), members[[1]])
    out = merge([(np.array([0, 2]), ring), (np.array([1]), tree)], 3)
    assert out.size == ring.size + tree.size
    assert out.start.shape == (3, 2, 8) and out.tails.shape[:3] == (3, 2, 8)
    for i in range(3):
        assert set(out.src[out.instance == i]) == set(members[i])
    assert int(out.nbytes[out.instance == 1].sum()) == 2 * 7 * 4000
    assert int(out.nbytes[out.instance == 2].sum()) == 14 * 1600
    # the tree's edges and gates point into its own flows
    tree_ids = np.nonzero(out.instance == 1)[0]
    assert np.isin(out.start[1], tree_ids).all() and np.isin(out.tails[1], tree_ids).all()
    assert np.isin(out.succ[out.pred >= ring.size], tree_ids).all()


def test_nvls_needs_three_members_per_server() -> None:
    # sym_kernels.cc: multimem for > 2 ranks; with 2 NVLS would move 1.5 S per link vs S
    two = Fabric(2, 1, 2, 450.0, INF, "nvlink", 90, True)
    assert choose("all_reduce", 1 << 30, two).algorithm == "ring"
    three = Fabric(3, 1, 3, 450.0, INF, "nvlink", 90, True)
    assert choose("all_reduce", 1 << 30, three).algorithm == "nvls"
