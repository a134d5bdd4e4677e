"""Expert and context parallelism: the ``ep`` / ``cp`` fields of a stage and their groups.

A stage is one TP group of one replica. Expert parallelism (``ep``) and context parallelism
(``cp``) reach across replicas, as Megatron-Core folds them out of the data-parallel dimension:

- EP group: ``ep`` is 1 (the experts are split over the stage's TP ranks like the dense MLP,
  Megatron's expert TP = TP) or > 1 with expert TP ``etp`` (default 1; it divides ``tp``), and
  ``ep x etp`` a multiple of ``tp``. Then ``g = ep x etp / tp`` consecutive replicas (``r - r %
  g`` on) form one expert block for that stage: their stage ranks, replica-major, are the block
  ranks 0..ep x etp - 1, which Megatron-Core's folded expert mesh orders ETP fastest then EP:
  block rank ``i`` is EP position ``i // etp`` of ETP position ``i % etp``. The EP groups are
  the block ranks of one ETP position (``ep`` each), the ETP groups the ``etp`` consecutive
  ranks of one EP position (inside one TP group). The expert-data-parallel group of a block
  rank is the same block position in every block.
- CP group: ``cp`` consecutive replicas (``r - r % cp`` on) split every sequence ``cp`` ways; the
  ranks at one TP position form one CP ring. A CP group runs the same micro-batches, so the
  batch is split over the ``dp / cp`` CP groups (docs/plan.md); gradients of CP ranks are
  reduced together with DP as Megatron does (the DP sync already spans all replicas).

Members of one group must have the same stage shape (pipeline depth, layers, tp, ep, cp) and
micro-batch count: their collectives are issued in lockstep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import PlanError
from .model import ModelSpec, Plan, TrainingSpec
from .moe import routed_expert_params
from .params import span_params


def check_stage_ep_cp(st: Any, model: ModelSpec, training: TrainingSpec) -> None:
    """Checks of one stage's ``ep`` and ``cp`` against the model (``st``: a raw stage)."""
    moe = model.moe
    if moe is not None and st.tp > 1 and not training.sequence_parallel:
        raise PlanError(
            st.fp("tp"),
            f"an MoE model with tp > 1 needs training.sequence_parallel: true (Megatron-Core "
            f"requires it) (got {st.tp})",
        )
    if st.ep > 1:
        if moe is None:
            raise PlanError(st.fp("ep"), f"needs model.moe: a dense model has no experts "
                                         f"(got {st.ep})")
        if st.tp % st.etp:
            raise PlanError(st.fp("etp"), f"must divide the stage's tp {st.tp} (got {st.etp})")
        if (st.ep * st.etp) % st.tp and st.etp == 1:
            raise PlanError(
                st.fp("ep"),
                f"must be 1 or a multiple of the stage's tp {st.tp} (expert TP is 1 when ep > 1) "
                f"(got {st.ep})",
            )
        if (st.ep * st.etp) % st.tp:
            raise PlanError(
                st.fp("ep"),
                f"ep x etp {st.ep * st.etp} must be a multiple of the stage's tp {st.tp} (an "
                f"expert block covers whole TP groups) (got {st.ep})",
            )
        if moe.expert_ffn_hidden % st.etp:
            raise PlanError(st.fp("etp"), f"must divide model.moe.expert_ffn_hidden "
                                          f"{moe.expert_ffn_hidden} (got {st.etp})")
        if st.ep > moe.num_experts:
            raise PlanError(st.fp("ep"), f"must be at most model.moe.num_experts "
                                         f"{moe.num_experts} (got {st.ep})")
        if moe.placement == "uniform" and moe.num_experts % st.ep:
            raise PlanError(
                st.fp("ep"),
                f"must divide model.moe.num_experts {moe.num_experts} with placement uniform "
                f"(got {st.ep})",
            )
    elif st.etp != 1:
        raise PlanError(st.fp("etp"), f"needs ep > 1 (with ep 1 the experts are split over the "
                                      f"stage's tp like the dense MLP) (got {st.etp})")
    elif moe is not None and moe.expert_ffn_hidden % st.tp:
        raise PlanError(
            st.fp("tp"),
            f"must divide model.moe.expert_ffn_hidden {moe.expert_ffn_hidden} with ep 1 "
            f"(experts split over TP) (got {st.tp})",
        )
    if st.cp > 1:
        if model.seq_len % (2 * st.cp):
            raise PlanError(
                st.fp("cp"),
                f"2 x cp must divide model.seq_len {model.seq_len} (causal load balancing cuts "
                f"the sequence into 2 cp chunks) (got {st.cp})",
            )
        if model.attention is not None and model.attention.sliding_window:
            raise PlanError(st.fp("cp"), f"cannot be combined with model.attention."
                                         f"sliding_window (ring attention over a window is not "
                                         f"built) (got {st.cp})")


def check_cp_uniform(raw: Sequence[Any]) -> int:
    """Every stage of every replica has one ``cp``, and it divides the replica count."""
    cp = raw[0].stages[0].cp
    for rep in raw:
        for st in rep.stages:
            if st.cp != cp:
                raise PlanError(
                    st.fp("cp"),
                    f"must equal the cp {cp} of the first stage (every stage of a plan uses one "
                    f"context-parallel degree) (got {st.cp})",
                )
    if len(raw) % cp:
        raise PlanError(raw[0].stages[0].fp("cp"),
                        f"must divide the {len(raw)} replicas (got {cp})")
    return int(cp)


def check_groups(raw: Sequence[Any], counts: Sequence[int]) -> None:
    """Members of every EP and CP group have the same stage shape and micro-batch count; with
    EP every stage uses it, and stage i holds the same layers in every replica (the experts'
    gradient sync pairs equal EP positions of all EP groups)."""
    ep_on = raw[0].stages[0].ep > 1
    for rep in raw:
        for i, st in enumerate(rep.stages):
            if (st.ep > 1) != ep_on:
                raise PlanError(
                    st.fp("ep"),
                    f"every stage must use expert parallelism if one does (the first stage has "
                    f"ep {raw[0].stages[0].ep}) (got {st.ep})",
                )
            first = raw[0].stages[i] if i < len(raw[0].stages) else None
            if ep_on and (first is None or len(raw[0].stages) != len(rep.stages)
                          or first.layers != st.layers):
                raise PlanError(
                    st.fp("layers"),
                    "with ep > 1 every replica must split the layers as replica 0 does "
                    f"(got {list(st.layers) if st.layers else None})",
                )
    for r, rep in enumerate(raw):
        for i, st in enumerate(rep.stages):
            for what, size in (("ep", ep_size_in_replicas(st.ep, st.tp, st.etp)),
                               ("cp", st.cp)):
                if size <= 1:
                    continue
                r0 = r - r % size
                if r0 + size > len(raw):
                    raise PlanError(
                        st.fp(what),
                        f"needs replicas {r0}..{r0 + size - 1} for its group but the plan has "
                        f"{len(raw)} (got {getattr(st, what)})",
                    )
                head = raw[r0]
                other = head.stages[i] if i < len(head.stages) else None
                same = (
                    other is not None
                    and len(head.stages) == len(rep.stages)
                    and (other.layers, other.tp, other.ep, other.cp, other.etp)
                    == (st.layers, st.tp, st.ep, st.cp, st.etp)
                    and counts[r0] == counts[r]
                )
                if not same:
                    raise PlanError(
                        st.fp(what),
                        f"its {what} group shares replica {r0}'s stage {i}, so it must match "
                        f"it in pipeline depth, layers, tp, ep, etp, cp and micro-batches "
                        f"(got {getattr(st, what)})",
                    )


def zero3(plan: Plan) -> bool:
    """Whether ``plan`` traces ZeRO-3 / FSDP parameter gathers."""
    return plan.training.zero_stage >= 3 and plan.dp > 1


def check_fsdp(plan: Plan) -> None:
    """ZeRO-3's gathers are collectives per unit, pass and micro-batch over every replica, so
    every replica must reach them in the same order: the same stage split (and, with pipeline
    parallelism, the same micro-batch count). Otherwise one-line :class:`PlanError` (a real
    FSDP job would deadlock; the trace would have a cycle)."""
    if not zero3(plan):
        return
    shard = plan.training.fsdp.hsdp_shard
    if shard == 1:
        raise PlanError("training.fsdp.hsdp_shard", "must be 0 (shard over every replica) or "
                        "at least 2 (got 1)")
    if shard and plan.dp % shard:
        raise PlanError("training.fsdp.hsdp_shard", f"must divide the {plan.dp} replicas "
                        f"(got {shard})")
    rep0 = plan.replicas[0]
    cuts0 = [st.layers for st in rep0.stages]
    for r, rp in enumerate(plan.replicas):
        cuts = [st.layers for st in rp.stages]
        if cuts != cuts0:
            raise PlanError(f"replicas[{r}]", (
                f"training.zero_stage 3 (FSDP) needs every replica to split the layers as "
                f"replicas[0] does, its gathers run in the same order on every replica "
                f"(stages hold {_cuts(cuts)} here, {_cuts(cuts0)} in replicas[0])"))
        if rp.pp > 1 and rp.micro_batches != rep0.micro_batches:
            raise PlanError(f"replicas[{r}]", (
                f"training.zero_stage 3 (FSDP) with pipeline parallelism needs the same "
                f"micro-batch count in every replica ({rp.micro_batches} here, "
                f"{rep0.micro_batches} in replicas[0])"))


def _cuts(cuts: list[tuple[int, int]]) -> str:
    return " ".join(f"[{a}, {b})" for a, b in cuts)


def fsdp_shard_size(plan: Plan) -> int:
    """Replicas one ZeRO-3 shard spans: ``training.fsdp.hsdp_shard``, or all of them."""
    return plan.training.fsdp.hsdp_shard or plan.dp


def uses_ep(plan: Plan) -> bool:
    """True if the plan's stages run expert parallelism (then every stage does)."""
    return plan.model.moe is not None and plan.replicas[0].stages[0].ep > 1


def dp_synced_params(plan: Plan, layers: tuple[int, int]) -> int:
    """Parameters of layers ``[a, b)`` whose gradients the (dense) DP sync carries: all of them,
    less the routed experts under EP (those sync over the expert-data-parallel group)."""
    p = span_params(plan.model, layers)
    return p - routed_expert_params(plan.model, layers) if uses_ep(plan) else p


def ep_size_in_replicas(ep: int, tp: int, etp: int = 1) -> int:
    """How many replicas one expert block (``ep x etp`` ranks) spans (1 without EP)."""
    return ep * etp // tp if ep > 1 else 1


def group_replicas(plan: Plan, replica: int, stage: int, what: str) -> list[int]:
    """Replicas whose stage ``stage`` forms the ``what`` (``ep`` or ``cp``) group of ``replica``."""
    st = plan.replicas[replica].stages[stage]
    size = ep_size_in_replicas(st.ep, st.tp, st.etp) if what == "ep" else st.cp
    r0 = replica - replica % size
    return list(range(r0, r0 + size))


def ep_ranks(plan: Plan, replica: int, stage: int) -> list[int]:
    """Global ranks of the expert block of ``replicas[replica].stages[stage]`` in block order
    (with etp 1: its EP group in EP order; else EP group ``t`` is ``[t::etp]``)."""
    st = plan.replicas[replica].stages[stage]
    if st.ep <= 1:
        return list(plan.stage_ranks(st))
    ranks: list[int] = []
    for r in group_replicas(plan, replica, stage, "ep"):
        ranks.extend(plan.stage_ranks(plan.replicas[r].stages[stage]))
    return ranks


__all__ = ["check_cp_uniform", "check_fsdp", "check_groups", "check_stage_ep_cp",
           "dp_synced_params", "ep_ranks", "ep_size_in_replicas", "fsdp_shard_size",
           "group_replicas", "uses_ep", "zero3"]
