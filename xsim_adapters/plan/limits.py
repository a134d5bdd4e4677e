"""Limits that bound the work a plan can cause, checked before anything large is built.

A plan is user input and may be hostile: a few bytes of YAML can ask for a hundred million
devices or chunks. Every limit here is documented in docs/plan.md ("Limits") and named in the
error that enforces it, so a refused plan says which limit it hit and by how much.

Three layers:

- the file (:mod:`.loader`): size, YAML nesting depth, alias uses and nodes after alias
  expansion (a "billion laughs" document is refused while it is being composed);
- field ranges (:mod:`.sections`, :mod:`.replicas`): each integer the trace stores fits its
  column's dtype (``int16`` layers, replicas and channels), device counts are bounded;
- the plan as a whole (:func:`check_size`, run by the loader after the plan validated and
  before any trace is generated): estimated op count and memory, longest compute op, largest
  byte count, so that generation can neither run out of memory nor overflow an ``int64``.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from ..errors import PlanError

if TYPE_CHECKING:
    from .model import Plan

# ---- the file
MAX_PLAN_BYTES = 1 << 20  # 1 MiB; the shipped plans are under 5 KB
MAX_YAML_DEPTH = 32  # nesting of mappings and lists; the shipped plans nest 5 deep
MAX_YAML_ALIASES = 100  # uses of `*anchor`
MAX_YAML_NODES = 50_000  # scalars, lists and mappings, aliases expanded (the 1,024-GPU plan: ~300)

# a plan.yaml xsim wrote beside a trace lists every replica and stage: room for 65,536 stages
MAX_STORED_PLAN_BYTES = 64 << 20
MAX_STORED_YAML_NODES = 2_000_000

# ---- field ranges (the trace's integer columns: schema.OP_COLUMNS)
INT16_MAX = (1 << 15) - 1
MAX_DEVICES = 65_536  # all device groups together: 4x the 16,384-GPU design target
MAX_LAYERS = INT16_MAX - 1  # layer_stop of the head op is layers + 1 (int16)
MAX_REPLICAS = INT16_MAX  # replica column (int16)
MAX_CHANNELS = 1024  # channel column is int16; NCCL itself uses at most 32 per collective
MAX_CHUNKS = 4096  # pipelined pieces per ring edge (collectives.granularity: chunked)
MAX_HIDDEN = 1 << 20
MAX_FFN_HIDDEN = 1 << 22
MAX_SEQ_LEN = 1 << 24
MAX_VOCAB = 1 << 24
MAX_BATCH = 1 << 24  # global_batch and micro_batch (sequences)
MAX_FAT_TREE_K = 256  # a k-ary fat tree has 5k^2/4 switches and k^3/4 hosts
MIN_RATE = 1e-3  # smallest TFLOP/s, GB/s or Gb/s a device or link may have
MAX_RATE = 1e9  # largest; beyond it durations round to zero
MAX_TIME_US = 1e12  # latencies and event times (11.6 days)
MAX_CLOCK_MHZ = 1e5  # SM clocks of a device type (100 GHz: far above any part)

# ---- the plan as a whole
MAX_TRACE_OPS = 50_000_000  # ops of one trace (the 1,024-GPU shipped plan has 2.6 million)
# Peak resident memory while generating, writing and replaying a trace, per op: measured 500
# bytes on the 1,024-GPU shipped plan (2.55 M ops, 1.27 GB max RSS for generate + write);
# the estimate uses 600 to leave room for a backend.
BYTES_PER_OP = 600
MAX_EXACT = 1 << 53  # every duration (ns) and byte count stays exact in float64 and int64


def memory_budget_bytes() -> int:
    """What this process may allocate: physical memory, or the address-space limit if lower."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 1 << 40
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return min(phys, soft) if soft != resource.RLIM_INFINITY else phys


def estimate_ops(plan: Plan, simulated: Collection[int] | None = None) -> int:
    """An upper estimate of the ops :func:`xsim_adapters.workload.generate` makes for ``plan``.

    ``simulated``: the replicas whose stages are generated (a coarsened trace,
    :mod:`xsim_adapters.workload.coarsen`; None: all); the DP sync is counted whole either way.

    Counts compute units per stage and micro-batch, the TP ring flows of each unit, pipeline
    transfers (at most tp_a * tp_b flows each way per boundary and micro-batch), the DP sync
    (per bucket: lcm(TPs) chunk rings of ``2 (dp - 1)`` steps x dp ranks x channels), and the
    optimizer step and barriers. Exact formulas are in :mod:`xsim_adapters.workload`; this is
    within a small factor above them (tests/test_attack.py checks it on the shipped plans).
    """
    from ..workload.comm.collectives import num_steps
    from ..workload.schedule import replica_chunks

    c, t = plan.collectives, plan.training
    # ``channels: auto`` opens one ring per NIC the members of a server use: a ring inside a
    # server has one; a DP ring has at most one member per replica on a server
    gpn = max(g.domain_gpus for g in plan.device_groups)  # NICs of a server or an NVL rack
    chans = c.channels or min(gpn, _replicas_per_server(plan))
    kinds = ("reduce_scatter", "all_gather") if t.sequence_parallel else ("all_reduce",)
    # compute ops per unit and rank (tp_comm cuts a unit in three), and per layer without
    # collectives (selective recompute, the W passes of zb_h1)
    per_unit = 3 if t.overlap.tp_comm else 1
    zb = t.schedule == "zb_h1"
    per_layer = int(t.recompute == "selective") + int(zb)
    total = 0
    boundaries: set[int] = set()
    for r, rep in enumerate(plan.replicas):
        chunks = replica_chunks(plan, r)
        v = len(chunks[0])
        boundaries.update(b for sc in chunks for rng in sc for b in rng)
        if simulated is not None and r not in simulated:
            continue
        for i, st in enumerate(rep.stages):
            n_layers = st.layers[1] - st.layers[0]
            units = 4 * n_layers * (1.5 if t.recompute == "full" else 1.0) + 4 * v
            # TP ring flows of one unit: steps x ranks x channels, per collective kind (NCCL's
            # delay rides on the first flows; only a tree's inner members keep a barrier)
            flows = sum(
                num_steps(k, st.tp, c.granularity, c.chunks) * st.tp * (
                    c.channels or _tp_ring_channels(plan, st))
                for k in kinds
            )
            flows += _nvls_joins(plan, st, c.chunks) if "all_reduce" in kinds else 0
            per_mb = units * (per_unit * st.tp + flows)
            per_mb += _ep_cp_ops_per_rank(plan, st) * st.tp
            per_mb += (per_layer * n_layers + (2 * v if zb else 0)) * st.tp
            # transfers to the next virtual stage: v per stage, the last stage wraps v - 1 times
            sends = v if i < rep.pp - 1 else v - 1
            per_mb += 2 * st.tp * rep.stages[(i + 1) % rep.pp].tp * sends
            total += int(per_mb) * rep.micro_batches
    dp = len(plan.replicas)
    big_l = math.lcm(*(st.tp for rep in plan.replicas for st in rep.stages))
    buckets = math.ceil(plan.model.layers / max(1, c.dp_bucket_layers)) + len(boundaries)
    steps = num_steps("all_reduce", dp, c.granularity, c.chunks)
    # (ZeRO's all-gather rings as many again)
    total += 2 * buckets * big_l * steps * chans * dp
    return total + 4 * plan.num_ranks


def _nvls_joins(plan: Plan, st: Any, chunks: int) -> int:
    """Joins an NVLS all-reduce of the stage's TP group may add (upper): one per member and
    piece where NVLS can run (NVLink SHARP on an NVSwitch server) and a join is worth it
    (:func:`xsim_adapters.workload.algorithms.worth_a_join`)."""
    from ..workload.comm.algorithms import worth_a_join

    g = plan.group(st.group)
    m = min(st.tp, g.domain_gpus)  # members per NVLink domain (a server or a rack)
    if not (plan.device_types[g.type].nvls and plan.server_spec(g).fabric == "nvswitch"
            and worth_a_join(m - 1, m - 1)):
        return 0
    return st.tp * (1 if st.tp <= g.domain_gpus else max(1, chunks))


def _tp_ring_channels(plan: Plan, st: Any) -> int:
    """``channels: auto`` for a stage's TP ring: 1 on one server, else its most members on a
    server (one ring per NIC)."""
    gpn = plan.group(st.group).domain_gpus  # NCCL's node: a server or an NVL rack
    d0, d1 = st.devices
    first, last = d0 // gpn, (d1 - 1) // gpn
    if first == last:
        return 1
    return max(min(d1, (s + 1) * gpn) - max(d0, s * gpn) for s in range(first, last + 1))


def _replicas_per_server(plan: Plan) -> int:
    """The most replicas that have a GPU on one server (DP-ring members a server holds)."""
    from ..workload.comm.rings import RankInfo

    server = RankInfo(plan).server
    count: dict[int, int] = {}
    for rep in plan.replicas:
        for s in {int(x) for st in rep.stages for x in server[list(plan.stage_ranks(st))]}:
            count[s] = count.get(s, 0) + 1
    return max(count.values(), default=1)


def _ep_cp_ops_per_rank(plan: Plan, st: Any) -> float:
    """Ops one rank adds per micro-batch for the MoE all-to-alls and the CP ring (upper)."""
    passes = 3 if plan.training.recompute == "full" else 2
    ops = 0.0
    if plan.model.moe is not None and st.ep > 1:
        from .moe import moe_layers_in

        # per MoE layer and pass: 2 extra compute units, 2 exchanges of ep - 1 flows (direct;
        # hierarchical has fewer, plus a proxy's barrier)
        ops += moe_layers_in(plan.model, st.layers) * passes * 2 * st.ep
        if st.etp > 1:  # the ETP all-gather-v and reduce-scatter-v: etp - 1 flows each,
            # a delay barrier each and two joins
            ops += moe_layers_in(plan.model, st.layers) * passes * (2 * st.etp + 2)
    if st.cp > 1:  # per layer and pass: cp - 1 steps of a flow and a core unit
        ops += (st.layers[1] - st.layers[0]) * passes * 2 * (st.cp - 1)
    return ops


def check_size(plan: Plan) -> None:
    """Refuse a valid plan whose trace would be too large or overflow a column (PlanError)."""
    dp = len(plan.replicas)
    if dp > MAX_REPLICAS:
        raise PlanError(
            "replicas",
            f"expected at most {MAX_REPLICAS} replicas, the limit of the trace's int16 replica "
            f"column (got {dp})",
        )
    _check_magnitudes(plan)
    ops = estimate_ops(plan)
    if ops > MAX_TRACE_OPS or ops * BYTES_PER_OP > memory_budget_bytes():
        # identical replicas and steady micro-batches may be coarsened (workload/coarsen.py):
        # bound what is generated then
        from ..workload.coarsen import decide

        co = decide(plan, "auto", ops)
        if co.any_used:
            ops = estimate_ops(co.simulated_plan(plan), set(co.representative))
    check_ops(ops)


def check_ops(ops: int) -> None:
    """Refuse a trace of about ``ops`` ops over :data:`MAX_TRACE_OPS` or the memory budget."""
    if ops > MAX_TRACE_OPS:
        raise PlanError(
            "",
            f"the plan's trace would have about {ops:,} ops, over the limit of "
            f"{MAX_TRACE_OPS:,} (MAX_TRACE_OPS, docs/plan.md#limits); use fewer micro-batches, "
            "channels, chunks or devices",
        )
    need, budget = ops * BYTES_PER_OP, memory_budget_bytes()
    if need > budget:
        raise PlanError(
            "",
            f"the plan's trace of about {ops:,} ops needs about {need / 1e9:.1f} GB "
            f"({BYTES_PER_OP} bytes per op), more than the {budget / 1e9:.1f} GB this process "
            "may use (physical memory or ulimit -v)",
        )


def _check_magnitudes(plan: Plan) -> None:
    """Every duration (ns) and byte count the generator computes stays below 2^53."""
    from ..workload.compute.costs import (
        embedding_cost,
        head_cost,
        layer_costs,
        optimizer_time_ns,
        stage_params,
    )

    m, t = plan.model, plan.training
    act = t.micro_batch * m.seq_len * m.hidden * m.dtype_bytes
    if act >= MAX_EXACT:
        raise PlanError(
            "model",
            f"one micro-batch's activation is {act:.3g} bytes (micro_batch x seq_len x hidden x "
            f"dtype bytes), over the 2^53-byte limit of the trace's byte counts",
        )
    grads = stage_params(m, (0, m.layers)) * m.dtype_bytes * 16
    if grads >= MAX_EXACT:
        raise PlanError(
            "model",
            f"the model's {grads / 16:.3g} bytes of weights are over the 2^53-byte limit of "
            "the trace's byte counts (with optimizer state)",
        )
    seen = set()
    for rep in plan.replicas:
        for st in rep.stages:
            dev = plan.device_types[plan.group(st.group).type]
            key = (st.tp, dev.name, st.layers)
            if key in seen:
                continue
            seen.add(key)
            costs = layer_costs(m, t, dev, st.tp)
            longest = max(
                costs.attn_bwd_ns,
                costs.mlp_bwd_ns,
                2 * head_cost(m, t, dev, st.tp)[0],
                embedding_cost(m, t, dev)[0],
                optimizer_time_ns(stage_params(m, st.layers), dev),
            )
            if longest >= MAX_EXACT:
                group = plan.group(st.group)
                raise PlanError(
                    f"device_types.{dev.name}",
                    f"one compute op of a stage on group {group.name} would take "
                    f"{longest / 1e9:.3g} s, over the 2^53 ns (104 days) limit of the trace's "
                    "durations",
                )
