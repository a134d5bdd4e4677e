"""The whole-plan size checks: the limits of :mod:`xsim_adapters.plan.limits` that need the
generator's op estimate and cost model, and the what-if events resolved on the built topology.

Run after a plan validated and before any trace is generated (:func:`xsim_adapters.feasibility.
check_plan`), so that generation can neither run out of memory nor overflow an ``int64``.
"""

from __future__ import annotations

from ..errors import PlanError
from ..plan import limits as lim
from ..plan.model import Plan
from ..topology.build import build_topology
from ..workload.coarsen import decide
from ..workload.compute.costs import (
    embedding_cost,
    head_cost,
    layer_costs,
    optimizer_time_ns,
    stage_params,
)
from ..workload.estimate import estimate_ops


def check_size(plan: Plan) -> None:
    """Refuse a valid plan whose trace would be too large or overflow a column (PlanError)."""
    dp = len(plan.replicas)
    if dp > lim.MAX_REPLICAS:
        raise PlanError(
            "replicas",
            f"expected at most {lim.MAX_REPLICAS} replicas, the limit of the trace's int16 replica "
            f"column (got {dp})",
        )
    _check_magnitudes(plan)
    ops = estimate_ops(plan)
    if ops > lim.MAX_TRACE_OPS or ops * lim.BYTES_PER_OP > lim.memory_budget_bytes():
        # identical replicas and steady micro-batches may be coarsened (workload/coarsen.py):
        # bound what is generated then
        co = decide(plan, "auto", ops)
        if co.any_used:
            ops = estimate_ops(co.simulated_plan(plan), set(co.representative))
    lim.check_ops(ops)


def _check_magnitudes(plan: Plan) -> None:
    """Every duration (ns) and byte count the generator computes stays below 2^53."""
    m, t = plan.model, plan.training
    act = t.micro_batch * m.seq_len * m.hidden * m.dtype_bytes
    if act >= lim.MAX_EXACT:
        raise PlanError(
            "model",
            f"one micro-batch's activation is {act:.3g} bytes (micro_batch x seq_len x hidden x "
            f"dtype bytes), over the 2^53-byte limit of the trace's byte counts",
        )
    grads = stage_params(m, (0, m.layers)) * m.dtype_bytes * 16
    if grads >= lim.MAX_EXACT:
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
            if longest >= lim.MAX_EXACT:
                group = plan.group(st.group)
                raise PlanError(
                    f"device_types.{dev.name}",
                    f"one compute op of a stage on group {group.name} would take "
                    f"{longest / 1e9:.3g} s, over the 2^53 ns (104 days) limit of the trace's "
                    "durations",
                )


def check_events(plan: Plan) -> None:
    """Every ``network.events`` entry names a node, link or NIC the plan's topology has (a
    PlanError naming ``network.events[i]`` otherwise), checked by resolving the events on the
    topology the backends will build (seconds at most: 1.4 s at 16,384 GPUs)."""
    build_topology(plan)
