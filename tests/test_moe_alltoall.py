"""Expert parallelism: all-to-all bytes, closed-form time, lowering, routing, plan checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from xsim_adapters.api import generate, run
from xsim_adapters.errors import PlanError
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.plan.model import MoESpec
from xsim_adapters.trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload.comm.alltoall import lower_alltoall
from xsim_adapters.workload.comm.nccl import (
    NVLINK_BW_EFFICIENCY,
    RING_BASE_LATENCY_US,
    RING_STEP_LATENCY_US,
)
from xsim_adapters.workload.compute.routing import popularity, routing_counts

H, S, K, E = 1024, 1024, 2, 8  # hidden, seq_len, top_k, experts of the test model


def moe_plan(ep: int = 8, tp: int = 1, dp: int = 8, nodes: int = 1, cp: int = 1,
             moe: dict[str, Any] | None = None, etp: int = 1, **training: Any):
    spec = {"num_experts": E, "top_k": K, "expert_ffn_hidden": 1024, **(moe or {})}
    return plan_from_dict({
        "name": "moe-test",
        "model": {"layers": 2, "hidden": H, "ffn_hidden": 2048, "heads": 8, "seq_len": S,
                  "vocab": 32000, "moe": spec},
        "training": {"global_batch": 2 * dp // cp, "micro_batch": 1,
                     "sequence_parallel": tp > 1, **training},
        "device_groups": {"h100": {"type": "H100-80GB", "nodes": nodes, "gpus_per_node": 8}},
        "replicas": {"uniform": {"group": "h100", "tp": tp, "pp": 1, "dp": dp, "ep": ep,
                                 "cp": cp, **({"etp": etp} if etp != 1 else {})}},
    })


def a2a_flows(trace):
    ops = trace.ops
    return ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX["ep"])]


@pytest.mark.parametrize(("ep", "tp", "dp"), [(8, 1, 8), (4, 2, 8), (2, 2, 4)])
def test_uniform_routing_each_rank_sends_and_receives_the_closed_form(ep, tp, dp):
    trace = generate(moe_plan(ep=ep, tp=tp, dp=dp, nodes=2 if tp * dp > 8 else 1))
    flows = a2a_flows(trace)
    tokens = S // tp  # sequence parallel: b*s/tp tokens per rank
    expect = tokens * H * 2 * K * (ep - 1) // ep  # bf16
    colls = trace.collectives[trace.collectives["kind"] == "all_to_all"]
    # 2 layers x 4 exchanges (dispatch, combine, and both backward) x micro-batches x groups
    assert len(colls) == 2 * 4 * 2 * (dp * tp // ep)
    for _, grp in flows.groupby("collective"):
        sent = grp.groupby("rank")["bytes"].sum()
        recv = grp.groupby("dst")["bytes"].sum()
        assert len(sent) == ep and (sent == expect).all()
        assert len(recv) == ep and (recv == expect).all()
        assert grp["bytes"].sum() == colls.set_index("collective").loc[
            grp["collective"].iloc[0], "bytes"]


def test_skewed_routing_conserves_totals_and_is_uneven():
    spec = MoESpec(num_experts=16, top_k=2, expert_ffn_hidden=8, routing="zipf",
                   zipf_exponent=1.2)
    c = routing_counts(spec, layer=3, tokens=1000, members=4, seed=7)
    assert (c.sum(axis=1) == 1000 * 2).all()  # every token's k picks are routed
    assert (c <= 1000).all()  # no expert picked twice by one token
    assert c.sum(axis=0).max() > 3 * c.sum(axis=0).min()
    assert popularity(spec, 3, 7).max() <= 0.5 + 1e-12  # capped at 1/k
    again = routing_counts(spec, layer=3, tokens=1000, members=4, seed=7)
    assert np.array_equal(c, again)  # deterministic for a seed
    assert not np.array_equal(c, routing_counts(spec, layer=3, tokens=1000, members=4, seed=8))
    # in the trace: an uneven all-to-all-v whose totals still equal the assignments sent off-rank
    trace = generate(moe_plan(moe={"routing": "zipf", "zipf_exponent": 1.5}))
    flows = a2a_flows(trace)
    per_coll = flows.groupby("collective")["bytes"].sum()
    sent = flows.groupby(["collective", "rank"])["bytes"].sum()
    assert sent.max() > 1.5 * sent.min()
    colls = trace.collectives.set_index("collective")
    assert (per_coll == colls.loc[per_coll.index, "bytes"]).all()
    # expert compute follows the load: the busiest rank's experts take longest
    exp = trace.ops[(trace.ops["kind"] == KIND_COMPUTE) & (trace.ops["layer_start"] == 0)]
    assert exp.groupby("rank")["duration_ns"].sum().nunique() > 1


def test_capacity_factor_drops_at_the_source():
    spec = MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=8, routing="zipf",
                   zipf_exponent=2.0, capacity_factor=1.0)
    c = routing_counts(spec, layer=0, tokens=800, members=2, seed=0)
    assert c.max() == 800 * 2 // 8  # ceil(1.0 * T k / E)
    assert (c.sum(axis=1) < 1600).all()


def test_closed_form_alltoall_time_on_one_nvswitch_server():
    """8 ranks on one NVSwitch: every flow of a rank shares its link (450 GB/s), so the
    exchange takes the NCCL delay + 2 hops of scale-up latency + sent bytes / 450 GB/s."""
    plan = moe_plan()
    trace = generate(plan)
    tl = run(plan, trace=trace)
    ops = trace.ops.join(tl.frame.set_index("op_id")[["start_ns", "end_ns"]], on="op_id")
    c0 = ops[ops["collective"] == trace.collectives.query("kind == 'all_to_all'")
             ["collective"].iloc[0]]
    flows = c0[c0["kind"] == KIND_FLOW]
    assert not (c0["kind"] == KIND_BARRIER).any()
    sent = S * H * 2 * K * 7 / 8
    bw = 450.0  # H100 scale-up GB/s = bytes per ns
    delay = (RING_BASE_LATENCY_US[2] + RING_STEP_LATENCY_US["nvlink"][2]) * 1e3 + (
        sent / bw * (1 / NVLINK_BW_EFFICIENCY - 1))
    # NCCL's delay is every flow's start latency (all are first-step flows of their sender)
    assert (flows["duration_ns"] == round(delay)).all()
    first_byte = flows["start_ns"] + flows["duration_ns"]
    assert first_byte.min() == first_byte.max()  # every sender is ready at once
    span = flows["end_ns"].max() - first_byte.min()
    latency = 2 * plan.network.scale_up.latency_us * 1e3
    assert span == pytest.approx(sent / bw + latency, rel=1e-6)


class _Info:
    def __init__(self, servers: list[int]) -> None:
        self.server = np.array(servers)
        self.scaleup_GBps = np.full(len(servers), 450.0)


def test_hierarchical_lowering_aggregates_per_rail():
    g = 8  # 2 servers x 4 members
    m = np.full((g, g), 100, dtype=np.int64)
    np.fill_diagonal(m, 0)
    info = _Info([0, 0, 0, 0, 1, 1, 1, 1])
    ex = lower_alltoall(m, list(range(g)), info, "hierarchical")  # type: ignore[arg-type]
    cross = ex.step == 1
    # one forwarded flow per (proxy, its rail peer on the other server): 4 x 2
    assert cross.sum() == 8
    assert (info.server[ex.src[cross]] != info.server[ex.dst[cross]]).all()
    assert (ex.src[cross] % 4 == ex.dst[cross] % 4).all()  # rail aligned
    assert ex.nbytes[cross].sum() == 2 * 4 * 4 * 100  # every cross-server byte, once
    assert (info.server[ex.src[~cross]] == info.server[ex.dst[~cross]]).all()
    direct = lower_alltoall(m, list(range(g)), info, "direct")  # type: ignore[arg-type]
    assert direct.nbytes.sum() == m.sum() and len(direct.src) == g * (g - 1)


def test_hierarchical_plan_runs_and_moves_fewer_cross_server_flows():
    plan_d = moe_plan(ep=16, tp=2, dp=8, nodes=2, moe={"num_experts": 16})
    plan_h = moe_plan(ep=16, tp=2, dp=8, nodes=2,
                      moe={"num_experts": 16, "alltoall": "hierarchical"})
    td, th = generate(plan_d), generate(plan_h)
    fd, fh = a2a_flows(td), a2a_flows(th)
    assert len(fh) < len(fd)
    assert (fd["bytes"].sum() < fh["bytes"].sum())  # intra-server hops carry bytes twice

    def bars(t):
        o = t.ops
        return o[(o["kind"] == KIND_BARRIER) & (o["phase"] == PHASE_INDEX["ep"])]
    # direct: every sender's delay is its flows' start latency (no barrier); hierarchical:
    # every sender forwards too, so each keeps its delay barrier (its second call's gate
    # waits on it) and each forwarding proxy has one more (its second NCCL call)
    exchanges = len(td.collectives.query("kind == 'all_to_all'"))
    assert len(bars(td)) == 0
    fl = td.ops[(td.ops["kind"] == KIND_FLOW) & (td.ops["phase"] == PHASE_INDEX["ep"])]
    timed = fl[fl["duration_ns"] > 0]
    assert len(timed) == len(fl)  # every direct flow is a first-step flow
    assert timed.groupby("collective")["rank"].nunique().eq(16).all()
    assert len(bars(th)) == exchanges * (16 + 16)
    assert run(plan_h).makespan_ns > 0


@pytest.mark.parametrize(("kw", "msg"), [
    ({"ep": 3, "tp": 2, "dp": 4}, r"ep: must be 1 or a multiple of the stage's tp 2"),
    ({"ep": 16, "tp": 1, "dp": 8}, r"ep: must be at most model.moe.num_experts 8"),
    ({"ep": 2, "tp": 2, "dp": 4, "sequence_parallel": False},
     r"tp: an MoE model with tp > 1 needs training.sequence_parallel: true"),
])
def test_ep_plan_errors(kw, msg):
    with pytest.raises(PlanError, match=msg):
        moe_plan(**kw)


def test_ep_needs_an_moe_model():
    d = {"name": "x", "model": "tiny-gpt", "training": {"global_batch": 8, "micro_batch": 1},
         "device_groups": {"h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 8}},
         "replicas": {"uniform": {"group": "h100", "tp": 1, "pp": 1, "dp": 8, "ep": 8}}}
    with pytest.raises(PlanError, match=r"replicas\.uniform\.ep: needs model\.moe"):
        plan_from_dict(d)


def test_expert_gradients_sync_over_the_expert_data_parallel_group():
    plan = moe_plan(ep=8, tp=1, dp=16, nodes=2)
    trace = generate(plan)
    colls = trace.collectives
    dp = colls[(colls["phase"] == PHASE_INDEX["dp"]) & (colls["sync_group"] == -1)]
    # one ring per EP position (8), over the same position of the 2 EP groups
    assert len(dp) == 8
    assert sorted(dp["ranks"]) == sorted(f"{p},{p + 8}" for p in range(8))
    expert = 3 * H * 1024  # one expert's parameters
    # 2 MoE layers x 1 expert x fp32 gradients (grad_reduce_dtype auto, bf16 parameters)
    assert (dp["bytes"] == 2 * 1 * expert * 4).all()
    flows = trace.ops[trace.ops["collective"].isin(dp["collective"])
                      & (trace.ops["kind"] == KIND_FLOW)]
    # an all-reduce ring of n = 2 members: each sends 2 (n - 1) / n of the ring's bytes
    assert int(flows["bytes"].sum()) == 8 * 2 * (2 * expert * 4)


def test_moe_metrics_report_load_exchange_time_and_straggler():
    from xsim_adapters.metrics.moe import (
        exchange_times,
        expert_ops,
        expert_stragglers,
        layer_exchange_summary,
    )
    from xsim_adapters.workload.comm.alltoall import expert_load

    plan = moe_plan(moe={"routing": "zipf", "zipf_exponent": 1.5})
    trace = generate(plan)
    tl = run(plan, trace=trace)
    load = expert_load(plan)
    assert len(load) == 2 * E  # 2 layers x 8 experts, one EP group
    assert (load.groupby("layer")["tokens"].sum() == 8 * S * K).all()  # 8 ranks x T x k
    assert load["rank_load_factor"].max() > 1.2
    times = exchange_times(trace, tl)
    assert len(times) == len(trace.collectives.query("kind == 'all_to_all'"))
    assert ((times["exposed_ns"] >= 0) & (times["exposed_ns"] <= times["span_ns"])).all()
    assert set(layer_exchange_summary(times)["layer"]) == {0, 1}
    # 8 ranks x 2 layers x (fwd, bwd) x 2 micro-batches expert ops; the hot rank straggles
    assert len(expert_ops(trace)) == 8 * 2 * 2 * 2
    st = expert_stragglers(trace, tl)
    assert (st["straggler_ns"] > 0).all()
    balanced = moe_plan()
    bt = generate(balanced)
    assert (expert_stragglers(bt, run(balanced, trace=bt))["straggler_ns"] < 1).all()


def test_by_speed_placement_follows_peak_times_efficiency():
    from xsim_adapters.workload.compute.routing import expert_counts

    spec = MoESpec(num_experts=60, top_k=4, expert_ffn_hidden=8, placement="by_speed")
    h100, a100 = 989 * 0.803, 312 * (271.2 / 312)
    counts = expert_counts(spec, [h100] * 8 + [a100] * 8)
    assert sum(counts) == 60
    ideal = [60 * s / (8 * h100 + 8 * a100) for s in [h100] * 8 + [a100] * 8]
    assert all(abs(c - x) < 1 for c, x in zip(counts, ideal, strict=True))
    assert min(counts[:8]) > max(counts[8:])
    uniform = MoESpec(num_experts=64, top_k=4, expert_ffn_hidden=8)
    assert expert_counts(uniform, [h100] * 8 + [a100] * 8) == [4] * 16


def test_full_recompute_repeats_the_forward_exchanges():
    trace = generate(moe_plan(recompute="full"))
    colls = trace.collectives[trace.collectives["kind"] == "all_to_all"]
    assert len(colls) == 2 * 6 * 2  # layers x (fwd 2, recompute 2, bwd 2) x micro-batches
    ops = trace.ops
    rec = ops[(ops["phase"] == PHASE_INDEX["recompute"]) & (ops["kind"] == KIND_COMPUTE)]
    assert len(rec) == 8 * 2 * 2 * 4  # ranks x layers x micro-batches x (attn, pre, experts, post)


def _h100_a100_pair() -> Any:
    """One H100 (NIC 400 Gb/s) and one A100 (NIC 200 Gb/s) server, one GPU each, one EP group
    of 2; ``by_speed`` gives the H100 6 of the 8 experts, so the A100 sends 3x what it gets."""
    return plan_from_dict({
        "name": "moe-pair",
        "model": {"layers": 1, "hidden": H, "ffn_hidden": 2048, "heads": 8, "seq_len": 4096,
                  "vocab": 32000, "moe": {"num_experts": E, "top_k": K,
                                          "expert_ffn_hidden": 1024, "placement": "by_speed"}},
        "training": {"global_batch": 2, "micro_batch": 1},
        "device_groups": {"h100": {"type": "H100-80GB", "nodes": 1, "gpus_per_node": 1},
                          "a100": {"type": "A100-80GB", "nodes": 1, "gpus_per_node": 1}},
        "network": {"scale_out": {"topology": "leaf_spine", "link_gbps": 400,
                                  "latency_us": 1.0}},
        "replicas": [{"uniform": {"group": "h100", "tp": 1, "pp": 1, "dp": 1, "ep": 2}},
                     {"uniform": {"group": "a100", "tp": 1, "pp": 1, "dp": 1, "ep": 2}}],
    })


def test_a_member_finishes_its_alltoall_only_when_its_own_sends_are_done():
    """NCCL runs an all-to-all as one grouped send/receive kernel per rank: the kernel (and the
    expert GEMMs waiting on its output) ends when the rank's receives *and* its sends are done,
    and the next exchange on the same communicator queues behind it. Closed form on the
    H100 + A100 pair: the A100 dispatches 4096 x 2 x 6/8 tokens x 1024 x 2 B = 12,582,912 B
    over its 25 GB/s NIC (2 hops of 1 us, after its start latency), while it receives only a
    third of that; its experts start when that send ends, not when its receive does."""
    plan = _h100_a100_pair()
    trace = generate(plan)
    tl = run(plan, trace=trace)
    ops = trace.ops.join(tl.frame.set_index("op_id")[["start_ns", "end_ns"]], on="op_id")
    first = trace.collectives.query("kind == 'all_to_all'")["collective"].min()
    c0 = ops[(ops["collective"] == first) & (ops["kind"] == KIND_FLOW)].set_index("rank")
    out_a100 = c0.loc[1]
    assert out_a100["bytes"] == 4096 * K * 6 // 8 * H * 2
    assert c0.loc[0, "bytes"] == 4096 * K * 2 // 8 * H * 2
    # trace schema 2: the flow's start latency (NCCL's per-call cost, its duration_ns) runs
    # from its start before its first byte
    assert out_a100["duration_ns"] > 0
    send_end = (out_a100["start_ns"] + out_a100["duration_ns"] + out_a100["bytes"] / 25.0
                + 2 * 1000.0)
    assert out_a100["end_ns"] == pytest.approx(send_end, rel=1e-9)
    assert c0.loc[0, "end_ns"] < send_end - 300_000  # its receive ended long before
    succ = trace.deps.groupby("pred")["succ"].apply(list)
    experts = [s for s in succ[int(out_a100["op_id"])] if ops.at[s, "rank"] == 1]
    assert len(experts) == 1 and ops.at[experts[0], "kind"] == KIND_COMPUTE
    assert ops.at[experts[0], "start_ns"] == pytest.approx(send_end, rel=1e-9)
    # the same rule everywhere: no member's next compute starts before its own sends end
    flows = ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX["ep"])]
    for op_id, row in flows.iterrows():
        nxt = [s for s in succ[op_id] if ops.at[s, "rank"] == row["rank"]
               and ops.at[s, "kind"] == KIND_COMPUTE]
        assert len(nxt) == 1 and ops.at[nxt[0], "start_ns"] >= row["end_ns"]


def test_waiting_on_a_slower_ep_peer_is_straggler_wait_with_the_peer_as_culprit():
    """pp = 1, so nothing is pipeline bubble: the H100 waits on the A100 (slower pre and expert
    blocks) at the exchanges, and that time is straggler wait (EP) caused by the A100. Closed
    form of the first dispatch: the H100 waits from the end of its pre block to the end of the
    A100's (the A100's NCCL latency after that is communication of the exchange)."""
    from xsim_adapters.api import metrics

    plan = _h100_a100_pair()
    trace = generate(plan)
    m = metrics(trace, run(plan, trace=trace))
    r = m.ranks.set_index("rank")
    assert r.loc[0, "breakdown_bubble_ns"] == 0 and r.loc[0, "bubble_ns"] == 0
    assert r.loc[0, "breakdown_straggler_wait_ns"] > 0.1 * r.loc[0, "iteration_time_ns"]
    parts = [c for c in r.columns if c.startswith("breakdown_")]
    assert (r[parts].sum(axis=1) == r["iteration_time_ns"]).all()
    assert r.loc[1, "caused_wait_ns"] == r.loc[0, "straggler_wait_ns"]
    assert r.loc[0, "straggler_ep_ns"] > 0 and r.loc[0, "straggler_cp_ns"] == 0
    ep = m.stragglers[(m.stragglers["kind"] == "ep") & (m.stragglers["waiter"] == 0)]
    first = ep.sort_values("collective").iloc[0]
    assert first["culprit"] == 1
    tf = m.timeline
    comp = tf[(tf["kind"] == KIND_COMPUTE) & (tf["phase"] == PHASE_INDEX["fwd"])]
    # the exchange's flows (trace schema 2: NCCL's latency is their start latency) begin after
    # the rank's pre block: the last forward compute ending before the rank's first flow of it
    fl = tf[(tf["kind"] == KIND_FLOW) & (tf["collective"] == first["collective"])]
    pre_end = {int(x): int(comp[(comp["rank"] == x) & (comp["end_ns"] <= fl.loc[
        fl["rank"] == x, "start_ns"].min())]["end_ns"].max()) for x in (0, 1)}
    assert first["wait_ns"] == pre_end[1] - pre_end[0] > 0


def test_expert_tensor_parallel_closed_form():
    """ep 4, etp 2 on TP 2 (sequence parallel), 16 H100s: an expert block is 8 ranks (4
    replicas); EP groups are the ranks of one ETP position ([0,2,4,6], [1,3,5,7]), ETP groups
    the TP pairs, each EP position holds 2 of the 8 experts split 2 ways. Balanced routing, T =
    1024 / 2 = 512 tokens per rank, top-2: the dispatch sends 512 x 2 x 3/4 token copies per
    rank within its EP group; after it every rank holds 1024 copies, and the ETP all-gather-v
    sends them to its partner (1024 x 1024 x 2 B); each rank computes 2 experts on all 2048
    copies routed to them at half width (the FLOPs of ep 8 with one full expert); the experts'
    gradients sync over the 2 blocks (rings of 2) with half an expert per rank."""
    plan = moe_plan(ep=4, tp=2, dp=8, nodes=2, moe={"num_experts": 8}, etp=2)
    trace = generate(plan)
    colls = trace.collectives
    tok = S // 2 * H * 2  # one rank's tokens x hidden x bf16
    a2a = colls[colls["kind"] == "all_to_all"]
    assert set(a2a["ranks"]) == {"0,2,4,6", "1,3,5,7", "8,10,12,14", "9,11,13,15"}
    flows = a2a_flows(trace)
    sent = flows[flows["collective"].isin(a2a["collective"])].groupby(
        ["collective", "rank"])["bytes"].sum()
    assert (sent == tok * K * 3 // 4).all()
    etp_c = colls[colls["algorithm"] == "etp_ring_v(etp=2)"]
    assert set(etp_c["kind"]) == {"all_gather", "reduce_scatter"}
    assert set(etp_c["ranks"]) == {f"{2 * i},{2 * i + 1}" for i in range(8)}
    etp_f = flows[flows["collective"].isin(etp_c["collective"])]
    assert set(etp_f["bytes"]) == {tok * K}
    # 2 layers x 2 micro-batches x 4 passes (fwd AG + RS, bwd AG + RS) x 8 ETP groups
    assert len(etp_c) == 2 * 2 * 4 * 8
    exp = trace.ops[(trace.ops["kind"] == KIND_COMPUTE) & (trace.ops["phase"] == 0)
                    & (trace.ops["layer_start"] == 0) & (trace.ops["microbatch"] == 0)]
    ref = generate(moe_plan(ep=8, tp=2, dp=8, nodes=2, moe={"num_experts": 8}))
    rexp = ref.ops[(ref.ops["kind"] == KIND_COMPUTE) & (ref.ops["phase"] == 0)
                   & (ref.ops["layer_start"] == 0) & (ref.ops["microbatch"] == 0)]
    assert exp.groupby("rank")["flops"].sum().to_numpy() == pytest.approx(
        rexp.groupby("rank")["flops"].sum().to_numpy(), rel=1e-12)
    dp = colls[(colls["phase"] == PHASE_INDEX["dp"]) & (colls["sync_group"] == -1)]
    # 2 layers x 2 experts x half-width experts, fp32 gradients (grad_reduce_dtype auto)
    assert len(dp) == 8 and (dp["bytes"] == 2 * 2 * 3 * H * (1024 // 2) * 4).all()
    from xsim_adapters.feasibility.memory import expert_params_per_device

    assert expert_params_per_device(plan, 0, 0) == (2 * 2 * 3 * H * 512, 2)
    assert run(plan, trace=trace).makespan_ns > 0


def test_ep_and_cp_on_one_stage():
    """ep 8 and cp 2 on 8 H100s (tp 1): the EP group folds over both CP ranks of 4 replicas
    pairs, each rank routes its s / cp = 512 tokens: it dispatches 512 x 2 x 7/8 copies; the K/V
    ring runs between CP pairs; both exchanges are in the trace and the iteration completes."""
    plan = moe_plan(ep=8, tp=1, dp=8, cp=2)
    trace = generate(plan)
    flows = a2a_flows(trace)
    sent = flows.groupby(["collective", "rank"])["bytes"].sum()
    assert (sent == (S // 2) * H * 2 * K * 7 // 8).all()
    o = trace.ops
    cpf = o[(o["kind"] == KIND_FLOW) & (o["phase"] == PHASE_INDEX["cp"])]
    assert set(zip(cpf["rank"], cpf["dst"], strict=True)) == {(2 * i + a, 2 * i + 1 - a)
                                                             for i in range(4) for a in (0, 1)}
    from xsim_adapters.feasibility.memory import stage_memory

    assert stage_memory(plan, 0, 0).activations < stage_memory(
        moe_plan(ep=8, tp=1, dp=8, global_batch=16), 0, 0).activations
    assert run(plan, trace=trace).makespan_ns > 0


@pytest.mark.parametrize(("kw", "msg"), [
    ({"ep": 4, "tp": 2, "dp": 4, "etp": 3}, r"etp: must divide the stage's tp 2 \(got 3\)"),
    ({"ep": 1, "tp": 2, "dp": 4, "etp": 2}, r"etp: needs ep > 1"),
    ({"ep": 3, "tp": 4, "dp": 2, "etp": 2, "moe": {"num_experts": 6}},
     r"ep: ep x etp 6 must be a multiple of the stage's tp 4"),
])
def test_etp_plan_errors(kw, msg):
    with pytest.raises(PlanError, match=msg):
        moe_plan(**kw)
