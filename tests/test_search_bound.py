"""The search bound's parts against closed forms and the generator's own traces: the pipeline's
earliest schedule, the TP collective floor, the DP crossing bytes, and "bound <= simulated" on
random plans of the richer spaces (interleaved, split groups, ZeRO, sequence parallel)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import yaml

from xsim_adapters import api
from xsim_adapters.feasibility import plan_from_dict
from xsim_adapters.search import spec_from_dict
from xsim_adapters.search.bnb import enumerate_space
from xsim_adapters.search.bound import Analyzer
from xsim_adapters.search.comm import CUT_SLACK_BYTES, Fabric, ring_steps
from xsim_adapters.search.dpbound import _threshold
from xsim_adapters.search.evaluate import run_candidate
from xsim_adapters.search.pipeline import earliest_schedule
from xsim_adapters.search.space import Choice, plan_dict
from xsim_adapters.trace.schema import KIND_FLOW, PHASE_INDEX
from xsim_adapters.workload.schedule import BWD, FWD, WGRAD

P, M, F, B = 4, 8, 10, 20


def _uniform(kinds: dict[tuple[int, int], int]) -> list[dict[tuple[int, int], int]]:
    return [dict(kinds) for _ in range(P)]


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_earliest_schedule_of_equal_stages_is_the_textbook_pipeline(schedule):
    """(m + p - 1)(F + B) for 1F1B and GPipe without transfers; each later stage ends one
    backward earlier (its last backward is what the stage before it waits for)."""
    t = earliest_schedule(schedule, P, M, 1, _uniform({(FWD, 0): F, (BWD, 0): B}),
                          [0] * (P - 1), [0] * (P - 1))
    assert [s.last_end for s in t] == [(M + P - 1) * (F + B) - i * B for i in range(P)]


def test_earliest_schedule_interleaved_and_zero_bubble_bubbles():
    """Interleaved: m (F + B) + (p - 1)(F + B) / v (Narayanan et al. 2021); ZB-H1 with
    F = B = W: m (F + B + W) + (p - 1) F (Qi et al. 2023, Sec. 3.1)."""
    v = 2
    chunks = {(kind, k): c // v for k in range(v) for kind, c in ((FWD, F), (BWD, B))}
    t = earliest_schedule("interleaved", P, M, v, _uniform(chunks), [0] * (P * v - 1),
                          [0] * (P * v - 1))
    assert t[0].last_end == M * (F + B) + (P - 1) * (F + B) / v
    w = F
    t = earliest_schedule("zb_h1", P, M, 1, _uniform({(FWD, 0): F, (BWD, 0): w,
                                                        (WGRAD, 0): w}),
                          [0] * (P - 1), [0] * (P - 1))
    assert {s.last_end for s in t} == {M * (F + w + w) + (P - 1) * F}


def test_earliest_schedule_adds_transfer_floors_on_the_critical_path():
    """With a transfer floor x on every hop, GPipe's first stage ends exactly 2 (p - 1) x
    later (the last forward goes down, the first backward comes back, once each); 1F1B's at
    least that much (its steady state waits for transfers again)."""
    x = 3
    for schedule in ("gpipe", "1f1b"):
        base = earliest_schedule(schedule, P, M, 1, _uniform({(FWD, 0): F, (BWD, 0): B}),
                                 [0] * (P - 1), [0] * (P - 1))
        t = earliest_schedule(schedule, P, M, 1, _uniform({(FWD, 0): F, (BWD, 0): B}),
                              [x] * (P - 1), [x] * (P - 1))
        extra = t[0].last_end - base[0].last_end
        assert extra == 2 * (P - 1) * x if schedule == "gpipe" else extra >= 2 * (P - 1) * x


SPEC = """
name: floors
model: {layers: 4, hidden: 1024, ffn_hidden: 4096, heads: 16, kv_heads: 16, seq_len: 512,
        vocab: 4096}
training: {global_batch: 8}
device_groups:
  h: {type: H100-80GB, nodes: 2, gpus_per_node: 4}
  a: {type: A100-40GB, nodes: 1, gpus_per_node: 4}
space: {tp: [4], pp_max: 1}
"""


@pytest.mark.parametrize(("group", "chunks", "per_node"),
                         [("h", 1, 4), ("a", 1, 4), ("h", 2, 8), ("a", 2, 4)])
def test_tp_floor_is_the_traces_delay_plus_the_bytes_a_rank_sends(group, chunks, per_node):
    """The TP floor of a unit equals, read off a generated trace of the same stage, the NCCL
    delay before the collective (the start latency of its first flows) plus the bytes rank 0
    sends in it over rank 0's NVLink capacity (rings; NVLS on the H100 with 32 MB). With 2 chunks
    on half of an 8-GPU server (the 64-GPU spec's H100 TP 4) NVLS's later sends wait on flows
    into the rank, not on its own gate: counted too (the floor before 2026-12-04 had half)."""
    raw = yaml.safe_load(SPEC)
    raw["collectives"] = {"granularity": "chunked", "chunks": chunks}
    raw["device_groups"]["h"]["gpus_per_node"] = per_node  # TP 4 on half a server
    if chunks == 2:  # 32 MB per all-reduce: NCCL's tuner picks NVLS on the H100
        raw["model"].update(hidden=4096, seq_len=4096)
    spec = spec_from_dict(raw)
    an = Analyzer(spec)
    ch = Choice(8, 1, "1f1b", "none", "balanced")
    gap = an.tp_gap_ns(ch, group, 0, 4)
    plan = dict(spec.raw, replicas=[{"stages": [{"group": group, "devices": [0, 4], "tp": 4,
                                                 "layers": [0, 4]}]}])
    plan.pop("space")
    plan["training"] = {"global_batch": 8, "micro_batch": 1}
    p = plan_from_dict(plan)
    r0 = p.stage_ranks(p.replicas[0].stages[0])[0]
    trace = api.generate(p)
    ops = trace.ops
    tp = ops[(ops["phase"] == PHASE_INDEX["tp"]) & (ops["rank"] == r0)]
    coll = int(tp.loc[tp["kind"] == KIND_FLOW, "collective"].iloc[0])
    sent = int(tp.loc[(tp["kind"] == KIND_FLOW) & (tp["collective"] == coll), "bytes"].sum())
    algo = trace.collectives.set_index("collective").loc[coll, "algorithm"]
    assert str(algo).startswith("nvls" if (group, chunks) == ("h", 2) else "ring")
    # trace schema 2: NCCL's per-call cost is the start latency (duration_ns) of the rank's
    # first flows of the collective, one per channel, all equal
    first = tp[(tp["kind"] == KIND_FLOW) & (tp["collective"] == coll)]
    delay = first.loc[first["duration_ns"] > 0, "duration_ns"]
    assert delay.nunique() == 1
    fab = Fabric(p)
    cap = fab.caps[r0].intra_out  # bytes per ns: the GPU's NVSwitch cable
    link = p.device_types[p.group(group).type].scaleup_GBps
    assert cap == pytest.approx(link)  # GB/s = bytes per ns
    assert gap == math.floor(int(delay.iloc[0]) + (sent - CUT_SLACK_BYTES) / cap)
    assert gap > 0


def test_crossing_bytes_closed_forms():
    """A ring crosses a server's boundary at least once per channel (each edge carries
    ring_steps segments); other algorithms move what the result needs."""
    spec = spec_from_dict(yaml.safe_load(SPEC))
    fab = Analyzer(spec).fabric
    n, s, c = 4, 8_000_000, fab.max_channels
    assert ring_steps("all_reduce", n) == 6 and ring_steps("all_gather", n) == 3
    ring = fab.crossing_bytes("all_reduce", True, n, 1, s, entering=False)
    assert ring == 6 * (s // n - c) - CUT_SLACK_BYTES
    assert fab.crossing_bytes("all_reduce", False, n, 1, s, False) == s - CUT_SLACK_BYTES
    assert fab.crossing_bytes("reduce_scatter", False, n, 1, s, False) == \
        3 * (s // n) - CUT_SLACK_BYTES
    assert fab.crossing_bytes("all_gather", False, n, 1, s, True) == \
        3 * (s // n) - CUT_SLACK_BYTES
    assert fab.crossing_bytes("all_reduce", True, n, 0, s, False) == 0  # no member here
    assert fab.crossing_bytes("all_reduce", True, n, n, s, False) == 0  # every member here
    # the cut of a server: its 4 NICs at the type's rate (H100: 400 Gb/s each)
    assert fab.cut_out[0] == pytest.approx(4 * 400 / 8)


def test_threshold_takes_the_latest_start_that_still_moves_the_most():
    """max over t of t + bytes ready at or after t / cap; a ring-lowered item adds its
    optimizer step."""
    items = [(0.0, 100.0, False, 0.0), (50.0, 10.0, False, 0.0)]
    assert _threshold(items, 1.0) == max(0 + 110, 50 + 10)
    assert _threshold([(50.0, 10.0, True, 7.0)], 2.0) == 50 + 5 + 7


RICH = """
name: rich2
model: {layers: 8, hidden: 256, ffn_hidden: 704, heads: 4, kv_heads: 2, seq_len: 128,
        vocab: 512}
training: {global_batch: 8}
device_groups:
  h: {type: H100-80GB, nodes: 2, gpus_per_node: 2}
  a: {type: A100-40GB, nodes: 2, gpus_per_node: 2}
collectives: {granularity: chunked, chunks: 2}
space: {tp: [1, 2], pp_min: 1, pp_max: 4, schedules: [1f1b, interleaved, zb_h1],
        micro_batch: [1, 2], recompute: [none, full], mix_types: true,
        zero_stage: [0, 1], sequence_parallel: [false, true], shapes_per_group: 2}
"""


@pytest.mark.slow  # 10 simulations of small plans
def test_bound_below_simulated_time_on_random_plans_of_the_new_axes():
    """Random candidates over interleaved, groups split into two shapes (and mixed parts
    sharing a group), ZeRO and sequence parallel: full bound <= simulated time, and the
    bound stays informative (>= 0.7 of it)."""
    spec = spec_from_dict(yaml.safe_load(RICH))
    an = Analyzer(spec)
    feasible = [e for e in enumerate_space(spec, an) if e.status == ""]
    assert any(e.cand.choice.schedule == "interleaved" for e in feasible)
    assert any(len({p.groups for p in e.cand.parts}) < len(e.cand.parts) for e in feasible)
    rng = random.Random(29)
    picks = rng.sample(feasible, 10)
    for e in picks:
        row = run_candidate({"plan": plan_dict(spec, e.cand)})
        assert row["error"] == "", (e.cand.key, row["error"])
        lb = an.lower_bound_ns(e.cand)
        assert 0.7 * row["iteration_time_ns"] <= lb <= row["iteration_time_ns"], e.cand.key


def test_full_bound_adds_the_dp_sync_tail_where_dp_dominates():
    """Two replicas on two servers with a slow NIC: the DP sync that must cross the server's
    cut after the last backward lifts the full bound above the pipeline part, and the flow
    backend's time is above both."""
    raw = yaml.safe_load(SPEC)
    raw["device_groups"] = {"h": {"type": "H100-80GB", "nodes": 2, "gpus_per_node": 4,
                                  "nic_gbps": 10}}
    raw["space"] = {"tp": [4], "pp_max": 1, "idle_groups": False}
    spec = spec_from_dict(raw)
    an = Analyzer(spec)
    (e,) = [e for e in enumerate_space(spec, an) if e.status == ""]
    assert sum(p.count for p in e.cand.parts) == 2
    full = an.lower_bound_ns(e.cand)
    assert full > 1.2 * e.lb_ns
    row = run_candidate({"plan": plan_dict(spec, e.cand)})
    assert full <= row["iteration_time_ns"]
    assert np.isclose(full, row["iteration_time_ns"], rtol=0.3)
