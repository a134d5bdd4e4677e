"""Pipeline schedules: orders (Megatron's interleaved, ZB-H1), DAG properties and closed-form
bubbles on the flow backend with compute-only traces."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from helpers.gen import A100, H100, make_plan, topo_order

import xsim_adapters as xs
from xsim_adapters.metrics.ranks import rank_metrics
from xsim_adapters.plan.model import ModelSpec
from xsim_adapters.trace.schema import (
    KIND_BARRIER,
    KIND_COMPUTE,
    KIND_FLOW,
    LAYER_EMBEDDING,
    PHASE_INDEX,
    Trace,
)
from xsim_adapters.workload import generate
from xsim_adapters.workload.estimate import estimate_ops
from xsim_adapters.workload.schedule import BWD, FWD, WGRAD, replica_chunks, stage_order

EIGHT = ModelSpec(
    "eight", layers=8, hidden=256, ffn_hidden=688, heads=8, kv_heads=4, seq_len=128, vocab=1024
)


def names(order: np.ndarray) -> list[str]:
    return [f"{'FBW'[k]}{c}.{m}" for k, c, m in order]


# ---------------------------------------------------------------- orders


def test_interleaved_order_is_megatrons() -> None:
    # pp 2, v 2, m 4, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 chunk forwards; the k-th forward
    # runs chunk (k mod 4) // 2 on micro-batch (k // 4)*2 + k mod 2, backwards mirror the chunk.
    want = "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 B0.2 B0.3"
    assert names(stage_order("interleaved", 0, 2, 4, 2)) == want.split()
    # last stage: warm-up (v-1)*pp = 2
    want1 = "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3"
    assert names(stage_order("interleaved", 1, 2, 4, 2)) == want1.split()
    # m == pp: Megatron runs every forward first
    o = stage_order("interleaved", 1, 2, 2, 3)
    assert (o[:6, 0] == FWD).all() and (o[6:, 0] == BWD).all()


def test_zb_h1_order_defers_w_by_the_stage_index() -> None:
    # the last stage (3) defers three: all its W passes fill the end
    want3 = "F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 W0.0 W0.1 W0.2"
    assert names(stage_order("zb_h1", 3, 4, 3)) == want3.split()
    want = "F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 W0.0 B0.2 W0.1 B0.3 W0.2 W0.3"
    assert names(stage_order("zb_h1", 1, 4, 4)) == want.split()
    # stage 0 defers nothing: W right after its B
    o = names(stage_order("zb_h1", 0, 4, 5))
    assert [o[i + 1] for i, x in enumerate(o) if x[0] == "B"] == [f"W0.{j}" for j in range(5)]


def _simulate(orders: list[np.ndarray], pp: int, nv: int, t: dict[int, float]) -> float:
    """List-schedule the per-stage orders with times ``t[kind]`` per chunk; the makespan, or an
    AssertionError if the orders deadlock. Dependencies: a chunk's forward after the previous
    virtual stage's, its backward after the next virtual stage's backward and its own forward,
    W after B."""
    done: dict[tuple[int, int, int, int], float] = {}
    idx, clock = [0] * pp, [0.0] * pp
    last_v = pp * nv - 1
    progress = True
    while progress:
        progress = False
        for s in range(pp):
            while idx[s] < len(orders[s]):
                k, c, m = (int(x) for x in orders[s][idx[s]])
                vs = c * pp + s
                deps = []
                if k == FWD and vs > 0:
                    deps.append((FWD, (vs - 1) % pp, (vs - 1) // pp, m))
                if k == BWD:
                    deps.append((FWD, s, c, m))
                    if vs < last_v:
                        deps.append((BWD, (vs + 1) % pp, (vs + 1) // pp, m))
                if k == WGRAD:
                    deps.append((BWD, s, c, m))
                if any(d not in done for d in deps):
                    break
                clock[s] = max([clock[s]] + [done[d] for d in deps]) + t[k]
                done[(k, s, c, m)] = clock[s]
                idx[s] += 1
                progress = True
    assert idx == [len(o) for o in orders], "deadlock"
    return max(clock)


CASES = [
    (sched, pp, m, v)
    for sched, v in (
        ("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("interleaved", 2), ("interleaved", 3)
    )
    for pp, m in ((1, 3), (2, 4), (4, 4), (4, 8), (3, 9), (8, 16), (4, 1))
    if sched != "interleaved" or (pp > 1 and m % pp == 0)
]


@pytest.mark.parametrize(("sched", "pp", "m", "v"), CASES)
def test_orders_are_complete_causal_and_deadlock_free(sched: str, pp: int, m: int, v: int) -> None:
    orders = [stage_order(sched, s, pp, m, v) for s in range(pp)]
    kinds = (FWD, BWD, WGRAD) if sched == "zb_h1" else (FWD, BWD)
    for o in orders:
        rows = [tuple(int(x) for x in r) for r in o]
        assert sorted(rows) == sorted(itertools.product(kinds, range(v), range(m)))
        pos = {r: i for i, r in enumerate(rows)}
        for c, j in itertools.product(range(v), range(m)):
            assert pos[(FWD, c, j)] < pos[(BWD, c, j)]
            if sched == "zb_h1":
                assert pos[(BWD, c, j)] < pos[(WGRAD, c, j)]
    # unequal times per kind must not matter for deadlock freedom
    for t in ({FWD: 1.0, BWD: 2.0, WGRAD: 1.0}, {FWD: 3.0, BWD: 1.0, WGRAD: 5.0}):
        _simulate(orders, pp, v, t)


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_unit_time_makespans_match_the_papers(pp: int, m: int) -> None:
    unit = {FWD: 1.0, BWD: 1.0, WGRAD: 1.0}
    f1b = [stage_order("1f1b", s, pp, m) for s in range(pp)]
    assert _simulate(f1b, pp, 1, {FWD: 1.0, BWD: 2.0}) == 3 * m + 3 * (pp - 1)
    zb = [stage_order("zb_h1", s, pp, m) for s in range(pp)]
    assert _simulate(zb, pp, 1, unit) == 3 * m + (pp - 1)  # bubble (p-1)(F+B-W)
    for v in (2, 4):  # chunk times 1/v of the stage's: bubble (p-1)(f+b)/v
        il = [stage_order("interleaved", s, pp, m, v) for s in range(pp)]
        got = _simulate(il, pp, v, {FWD: 1.0 / v, BWD: 2.0 / v})
        assert got == pytest.approx(3 * m + 3 * (pp - 1) / v)


def test_chunks_follow_the_virtual_pipeline() -> None:
    plan = make_plan(
        [[("h100", 0, 1, 0, 4), ("h100", 1, 2, 4, 8)]],
        model=EIGHT,
        training={"schedule": "interleaved", "virtual_stages": 2},
    )
    assert replica_chunks(plan, 0) == [[(0, 2), (4, 6)], [(2, 4), (6, 8)]]
    # heterogeneous: 5 and 3 layers -> chunks of (3, 2) and (2, 1) laid out s0c0 s1c0 s0c1 s1c1
    plan = make_plan(
        [[("h100", 0, 1, 0, 5), ("h100", 1, 2, 5, 8)]],
        model=EIGHT,
        training={"schedule": "interleaved", "virtual_stages": 2},
    )
    assert replica_chunks(plan, 0) == [[(0, 3), (5, 7)], [(3, 5), (7, 8)]]


# ---------------------------------------------------------------- DAG properties


def _hetero_plan(schedule: str, v: int = 1):
    return make_plan(
        [
            [("h100", 0, 2, 0, 5), ("a100", 0, 1, 5, 8)],
            [("h100", 2, 3, 0, 3), ("h100", 3, 4, 3, 6), ("a100", 1, 3, 6, 8)],
        ],
        groups=[("h100", H100, 1, 4), ("a100", A100, 1, 4)],
        model=EIGHT,
        micro_batches=[4, 6],
        training={"schedule": schedule, "virtual_stages": v},
    )


@pytest.mark.parametrize(("schedule", "v"), [("1f1b", 1), ("zb_h1", 1), ("interleaved", 2)])
def test_heterogeneous_dag_is_acyclic_and_runs(schedule: str, v: int) -> None:
    plan = _hetero_plan(schedule, v)
    trace = generate(plan)
    order, _ = topo_order(trace)
    assert len(order) == trace.num_ops  # no cycle: no deadlock on any backend
    tl = xs.run(trace, "flow", topology=xs.build_topology(plan))
    tf = xs.metrics(trace, tl).timeline
    comp = tf[tf["kind"] == KIND_COMPUTE]
    # every forward of a (rank, layer, micro-batch) ends before its backward starts
    key = ["rank", "layer_start", "microbatch"]
    comp = comp[comp["layer_start"] >= 0]  # with zb_h1 the embedding's gradient is a W pass
    f = comp[comp["phase"] == PHASE_INDEX["fwd"]].groupby(key)["end_ns"].max()
    b = comp[comp["phase"] == PHASE_INDEX["bwd"]].groupby(key)["start_ns"].min()
    both = f.to_frame().join(b, how="inner")
    assert len(both) == len(f) and (both["end_ns"] <= both["start_ns"]).all()


def test_interleaved_pp_sends_pair_virtual_stages() -> None:
    plan = make_plan(
        [[("h100", 0, 1, 0, 4), ("h100", 1, 2, 4, 8)]],
        model=EIGHT,
        micro_batches=[4],
        training={"schedule": "interleaved", "virtual_stages": 2},
    )
    trace = generate(plan)
    ops, deps = trace.ops, trace.deps
    pp_flows = ops[(ops["kind"] == KIND_FLOW) & (ops["phase"] == PHASE_INDEX["pp"])]
    # (v*pp - 1) boundaries x 2 directions x 4 micro-batches, one flow each at TP 1
    assert len(pp_flows) == 3 * 2 * 4
    # forward boundaries are the chunk ends 2, 4, 6; the one at layer 4 goes back 1 -> 0
    assert sorted(set(pp_flows["layer_start"])) == [2, 4, 6]
    back = pp_flows[pp_flows["layer_start"] == 4]
    assert set(zip(back["rank"], back["dst"], strict=True)) == {(1, 0), (0, 1)}
    pred = deps.merge(ops[["op_id", "microbatch", "phase", "layer_start"]], left_on="pred",
                      right_on="op_id")
    succ = deps.merge(ops[["op_id", "microbatch", "phase", "layer_start"]], left_on="succ",
                      right_on="op_id")
    for fl in pp_flows.itertuples():
        p = pred[pred["succ"] == fl.op_id]
        s = succ[succ["pred"] == fl.op_id]
        assert len(p) == 1 and len(s) == 1  # one sender block, one receiver block
        assert p["microbatch"].item() == s["microbatch"].item() == fl.microbatch
        if p["phase"].item() == PHASE_INDEX["fwd"]:  # activation: last layer -> next layer
            assert (p["layer_start"].item(), s["layer_start"].item()) == (
                fl.layer_start - 1, fl.layer_start)
        else:  # gradient: first layer of the upper chunk -> last layer of the lower one
            assert p["layer_start"].item() == fl.layer_start
            assert s["layer_start"].item() == fl.layer_start - 1


# ---------------------------------------------------------------- closed-form bubbles


def _compute_only(trace: Trace, head: int, durations: dict[int, int] | None = None) -> Trace:
    """The same DAG with every flow made a zero-time barrier and the embedding and head free
    (equal stages); ``durations`` sets every compute op of a phase to a fixed time."""
    ops = trace.ops.copy()
    fl = ops["kind"] == KIND_FLOW
    ops.loc[fl, "kind"] = KIND_BARRIER
    ops.loc[fl, "bytes"] = 0
    ops.loc[fl, "dst"] = -1
    comp = ops["kind"] == KIND_COMPUTE
    edge = comp & (ops["layer_start"].isin([LAYER_EMBEDDING, head]))
    edge &= ops["phase"] != PHASE_INDEX["optim"]
    ops.loc[edge, "duration_ns"] = 0
    for phase, ns in (durations or {}).items():
        ops.loc[comp & ~edge & (ops["phase"] == phase), "duration_ns"] = ns
    return Trace(ops=ops, deps=trace.deps, collectives=trace.collectives, manifest=trace.manifest)


def _bubble(plan, durations=None) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Per stage (rank order): bubble ns and window ns; and the stage's fwd and bwd time per
    micro-batch (stage 0)."""
    trace = _compute_only(generate(plan), plan.model.layers, durations)
    tl = xs.run(trace, "flow", topology=xs.build_topology(plan))
    rk = rank_metrics(trace, tl)
    ops = trace.ops
    r0 = ops[(ops["rank"] == 0) & (ops["kind"] == KIND_COMPUTE)]
    m = plan.replicas[0].micro_batches
    f = r0.loc[r0["phase"] == PHASE_INDEX["fwd"], "duration_ns"].sum() / m
    back = r0["phase"].isin([PHASE_INDEX["bwd"], PHASE_INDEX["wgrad"]])
    b = r0.loc[back, "duration_ns"].sum() / m
    busy = rk["compute_ns"].to_numpy() - r0.loc[r0["phase"] == PHASE_INDEX["optim"],
                                                 "duration_ns"].sum()
    return rk["bubble_ns"].to_numpy(), rk["bubble_ns"].to_numpy() + busy, f, b


def _pipeline(pp: int, m: int, training: dict, model: ModelSpec = EIGHT):
    per = model.layers // pp
    stages = [("h100", s, s + 1, s * per, (s + 1) * per) for s in range(pp)]
    return make_plan([stages], model=model, micro_batches=[m], training=training)


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 4), (8, 16)])
def test_1f1b_bubble_closed_form(pp: int, m: int) -> None:
    bubble, window, f, b = _bubble(_pipeline(pp, m, {"schedule": "1f1b"}))
    assert bubble[0] == pytest.approx((pp - 1) * (f + b), abs=pp)  # ns rounding per op
    assert bubble[0] / window[0] == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-6)
    gp, _, _, _ = _bubble(_pipeline(pp, m, {"schedule": "gpipe"}))
    assert gp[0] == pytest.approx(bubble[0], abs=pp)  # GPipe: the same bubble


@pytest.mark.parametrize(("pp", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 8, 4), (2, 6, 4)])
def test_interleaved_bubble_closed_form(pp: int, m: int, v: int) -> None:
    model = replace(EIGHT, layers=pp * v)  # one layer per chunk
    plan = _pipeline(pp, m, {"schedule": "interleaved", "virtual_stages": v}, model)
    # equal chunks: every chunk-layer forward 1000 ns, backward 2000 ns (B = 2F as the model)
    dur = {PHASE_INDEX["fwd"]: 1000, PHASE_INDEX["bwd"]: 2000}
    bubble, window, f, b = _bubble(plan, dur)
    # Narayanan et al. SC21 Sec. 2.2.2: bubble time (p-1)(tf+tb)/v, i.e. fraction (p-1)/(v*m)
    assert bubble[0] == pytest.approx((pp - 1) * (f + b) / v, abs=1.0)
    assert bubble[0] / (window[0] - bubble[0]) == pytest.approx((pp - 1) / (v * m))
    plain, _, _, _ = _bubble(_pipeline(pp, m, {"schedule": "1f1b"}, model), dur)
    assert bubble[0] == pytest.approx(plain[0] / v, abs=1.0)


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 4), (8, 16)])
def test_zb_h1_bubble_is_a_third_of_1f1b(pp: int, m: int) -> None:
    # F = B = W per layer: forward 2 ops x 1000, B 2 ops x 1000, W 1 op x 2000
    dur = {PHASE_INDEX["fwd"]: 1000, PHASE_INDEX["bwd"]: 1000, PHASE_INDEX["wgrad"]: 2000}
    zb, _, f, bw = _bubble(_pipeline(pp, m, {"schedule": "zb_h1"}), dur)
    assert bw == pytest.approx(2 * f)
    plain, _, _, _ = _bubble(_pipeline(pp, m, {"schedule": "1f1b"}), {
        PHASE_INDEX["fwd"]: 1000, PHASE_INDEX["bwd"]: 2000})
    assert plain[0] == pytest.approx((pp - 1) * 3 * f, abs=1.0)
    assert zb[0] == pytest.approx((pp - 1) * f, abs=1.0)  # (p-1)(F + B - W)
    assert zb[0] == pytest.approx(plain[0] / 3, abs=1.0)


def test_interleaved_dp_sync_follows_the_chunks() -> None:
    model = replace(EIGHT, layers=32)
    plan = make_plan(
        [
            [("h100", 0, 4, 0, 20), ("h100", 4, 8, 20, 32)],
            [("h100", 8, 10, 0, 18), ("h100", 10, 16, 18, 32)],
        ],
        model=model,
        micro_batches=[4, 2],
        training={"schedule": "interleaved", "virtual_stages": 2},
    )
    chunks = [replica_chunks(plan, r) for r in range(2)]
    assert chunks[0] == [[(0, 10), (16, 26)], [(10, 16), (26, 32)]]
    assert chunks[1] == [[(0, 9), (16, 25)], [(9, 16), (25, 32)]]
    trace = generate(plan)
    dp = trace.collectives[trace.collectives["phase"] == PHASE_INDEX["dp"]]
    covered = np.zeros(model.layers, dtype=int)
    for (lo, hi), g in dp.groupby(["layer_start", "layer_stop"]):
        covered[lo:hi] += 1
        for ranks in g["ranks"]:  # every ring member owns the layers in its replica
            for rank in map(int, ranks.split(",")):
                r = int(trace.ops.loc[trace.ops["rank"] == rank, "replica"].iloc[0])
                s = next(i for i, sc in enumerate(chunks[r]) if any(a <= lo < b for a, b in sc))
                assert rank in plan.stage_ranks(plan.replicas[r].stages[s])
    assert covered.tolist() == [1] * model.layers
    assert len(topo_order(trace)[0]) == trace.num_ops


def _random_hetero_plan(seed: int):
    """Two or three replicas of 1-4 stages with random TP (1, 2, 4), layer splits and devices."""
    rng = np.random.default_rng(seed)
    model = replace(EIGHT, layers=16)
    schedule = ["1f1b", "zb_h1", "interleaved", "gpipe"][seed % 4]
    v = 2 if schedule == "interleaved" else 1
    replicas, mbs, used = [], [], {"h100": 0, "a100": 0}
    for _ in range(int(rng.integers(2, 4))):
        pp = int(rng.integers(2 if v > 1 else 1, 5))
        cuts = sorted(rng.choice(np.arange(v, 16 - v + 1, v), pp - 1, replace=False).tolist())
        bounds = [0, *cuts, 16]
        stages = []
        for s in range(pp):
            group = str(rng.choice(["h100", "a100"]))
            tp = int(rng.choice([1, 2, 4]))
            d0 = used[group]
            used[group] += tp
            stages.append((group, d0, d0 + tp, bounds[s], bounds[s + 1]))
        replicas.append(stages)
        mbs.append(pp * int(rng.integers(1, 4)) if v > 1 else int(rng.integers(1, 7)))
    groups = [("h100", H100, 8, 8), ("a100", A100, 8, 8)]
    return make_plan(replicas, groups=groups, model=model, micro_batches=mbs,
                     training={"schedule": schedule, "virtual_stages": v})


@pytest.mark.parametrize("seed", range(12))
def test_random_heterogeneous_plans_have_no_deadlock(seed: int) -> None:
    plan = _random_hetero_plan(seed)
    trace = generate(plan)
    assert len(topo_order(trace)[0]) == trace.num_ops
    assert trace.num_ops <= estimate_ops(plan)  # the size guard's estimate stays an upper bound
    ops = trace.ops
    comp = ops[(ops["kind"] == KIND_COMPUTE) & (ops["phase"] != PHASE_INDEX["optim"])]
    # every replica computes every layer forward for each of its micro-batches, on each TP rank
    for r, rep in enumerate(plan.replicas):
        mine = comp[(comp["replica"] == r) & (comp["phase"] == PHASE_INDEX["fwd"])
                    & comp["layer_start"].between(0, 15)]
        per_rank = sum(2 * st.num_layers * st.tp for st in rep.stages)  # attention + MLP
        assert len(mine) == per_rank * rep.micro_batches
