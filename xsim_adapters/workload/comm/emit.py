"""The typed emitter: the trace builder, the per-rank tags, the built stages' op ids, and the
one way to emit a lowered collective with its NCCL cost.

A lowered collective is three things added in this order (so op ids follow construction):
its collective rows, its flows (the gate flows, a member's first sends, carry NCCL's latency
and protocol cost as their start latency, :mod:`.latency`), then one timed barrier per member
whose delay cannot be a start latency (a tree's inner members, a hierarchical all-to-all's
proxies, every expert-TP ring member). :func:`emit_gated` does exactly that; every collective
of the trace goes through it: TP (:mod:`..blocks`, via :func:`emit_lowered`), DP and expert DP
(:meth:`Emitter.lowered`), EP (:mod:`.alltoall`), CP (:mod:`.context`) and ETP (:mod:`.etp`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...plan.model import Plan
from ...trace.schema import KIND_BARRIER, KIND_FLOW
from ..builder import BulkBuilder
from ..schedule import replica_chunks, stage_order
from .collectives import RingFlows
from .latency import gate_latency, latency_members
from .rings import RankInfo, channel_orders, ring_bottleneck_GBps, ring_order, split_bytes


class BlockIds(Protocol):
    """Where to attach dependencies to a block template (:class:`..blocks.Block`): local op
    ids per local rank."""

    @property
    def head(self) -> np.ndarray: ...  # (n,) first compute op of each rank
    @property
    def last(self) -> np.ndarray: ...  # (n,) last compute op of each rank
    @property
    def tails(self) -> np.ndarray: ...  # (n, k) ops after which each rank holds the result
    @property
    def marks(self) -> dict[object, np.ndarray]: ...


class StageOps:
    """Global op ids of one stage's instantiated blocks: arrays indexed (micro-batch, rank)."""

    def __init__(self, base: np.ndarray, blk: BlockIds) -> None:
        """``base``: first op id of each micro-batch copy; ``blk``: its :class:`..blocks.Block`."""
        self.head = base[:, None] + blk.head[None, :]
        self.last = base[:, None] + blk.last[None, :]
        self.tails = base[:, None, None] + blk.tails[None, :, :]
        only_last = blk.tails.shape[1] == 1 and np.array_equal(blk.tails[:, 0], blk.last)
        # Everything after which a rank's block is done: its last compute and its last flows.
        self.ends = (
            self.last[:, :, None]
            if only_last
            else np.concatenate([self.last[:, :, None], self.tails], axis=2)
        )
        self.marks = {k: base[:, None] + v[None, :] for k, v in blk.marks.items()}


def emit_gated(tb: BulkBuilder, coll: dict[str, Any] | np.ndarray, flows: dict[str, Any],
               gates: dict[str, Any] | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Add one lowered collective to ``tb``: ``coll["n"]`` collective rows, ``flows["n"]`` flow
    ops (``duration_ns``: each flow's start latency, NCCL's cost on the gate flows), then, if
    ``gates`` is given, ``gates["n"]`` timed barriers (``duration_ns``: the member's NCCL delay)
    for the members whose delay stays a barrier. Column ``collective`` of ``flows`` / ``gates``
    indexes the new rows. ``coll`` may instead be the ids of rows added before (a collective
    emitted step by step, as CP's ring). Returns (collective ids, flow ids, barrier ids or
    None)."""
    if isinstance(coll, np.ndarray):
        cids = coll
    else:
        c = dict(coll)
        cids = tb.add_collectives(c.pop("n"), **c)
    f = dict(flows)
    f.setdefault("kind", KIND_FLOW)
    if "collective" in f:
        f["collective"] = cids[f["collective"]]
    fids = tb.add_ops(f.pop("n"), **f)
    gids = None
    if gates is not None:
        g = dict(gates)
        if "collective" in g:
            g["collective"] = cids[g["collective"]]
        gids = tb.add_ops(g.pop("n"), kind=KIND_BARRIER, **g)
    return cids, fids, gids


def emit_lowered(tb: BulkBuilder, rf: RingFlows, members: np.ndarray,
                 delay_ns: np.ndarray | int | None, coll: dict[str, Any],
                 tags: Callable[[np.ndarray, np.ndarray], dict[str, Any]]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Emit the ``I`` instances of ``rf`` over ``members`` ((I, n) ranks of ``tb``) with their
    NCCL cost ``delay_ns`` (scalar, (I,) or None for none) through :func:`emit_gated`.

    ``coll``: the collective-row columns (``n`` = I); ``tags(ranks, instance)``: the op tag
    columns (phase, replica, layers, ...) of ops on ``ranks`` in ``instance``. Returns the
    global tails (I, C, n, 2) and the starts (I, C, n): the gate flows, except that a member
    whose delay stays a timed barrier has that barrier at channel 0 and -1 elsewhere (add
    edges into them with ``add_edges_valid``)."""
    d = None if delay_ns is None else np.asarray(delay_ns, dtype=np.int64)
    timed = d is not None and rf.size > 0 and bool((d > 0).any())
    folded = latency_members(rf) if timed else None
    slow_i, slow_m = (np.nonzero(~folded) if folded is not None and not folded.all()
                      else (None, None))
    gates = None
    if slow_i is not None:
        assert d is not None
        mem = members[slow_i, slow_m]
        gates = dict(n=len(slow_i), rank=mem,
                     duration_ns=np.broadcast_to(d, (len(rf.start),))[slow_i] if d.ndim < 2
                     else d[slow_i, slow_m],
                     collective=slow_i, **tags(mem, slow_i))
    _, ids, dl = emit_gated(tb, coll, dict(
        n=rf.size, kind=rf.op_kinds(), rank=rf.src, dst=rf.op_dst(), bytes=rf.nbytes,
        duration_ns=gate_latency(rf, d, folded) if folded is not None and d is not None else 0,
        collective=rf.instance, step=rf.step, channel=rf.channel,
        **tags(rf.src, rf.instance)), gates)
    base = int(ids[0]) if len(ids) else 0
    tb.add_edges(rf.pred + base, rf.succ + base)
    starts = rf.start + base
    if dl is not None:
        # gate flows that wait inside the collective (a tree's inner members) keep a timed
        # barrier from the member's readiness (workload/comm/latency.py)
        tb.add_edges(dl[:, None], starts[slow_i, :, slow_m])
        starts = starts.copy()
        starts[slow_i, :, slow_m] = -1  # what waits before the ring waits before the barrier
        starts[slow_i, 0, slow_m] = dl
    return rf.tails + base, starts


@dataclass
class Emitter:
    """What every emission step shares: the plan being built, its ranks' link facts, the trace
    builder, each rank's replica and stage tags, and the op ids of the stages built so far."""

    plan: Plan
    info: RankInfo
    tb: BulkBuilder
    rank_replica: np.ndarray  # (num_ranks,) replica of each global rank
    rank_stage: np.ndarray  # (num_ranks,) stage of each global rank
    ring_label: str  # the ``algorithm`` label of a ring under the plan's collectives section
    chunks: list[list[list[tuple[int, int]]]]  # [replica][stage] -> layer ranges (chunks)
    # (replica, stage, chunk) -> (forward, backward[, weight-gradient]) ops
    stage_ops: dict[tuple[int, int, int], tuple[StageOps, ...]] = field(default_factory=dict)

    @classmethod
    def for_plan(cls, plan: Plan) -> Emitter:
        """An emitter with an empty builder for ``plan`` (the plan that is built)."""
        n = plan.num_ranks
        rank_replica = np.full(n, -1, dtype=np.int64)
        rank_stage = np.full(n, -1, dtype=np.int64)
        for r, rep in enumerate(plan.replicas):
            for i, st in enumerate(rep.stages):
                rs = list(plan.stage_ranks(st))
                rank_replica[rs] = r
                rank_stage[rs] = i
        c = plan.collectives
        label = f"ring:{c.ring_order}:{c.granularity}" + (
            f"({c.chunks})" if c.granularity == "chunked" else "")
        return cls(plan, RankInfo(plan), BulkBuilder(), rank_replica, rank_stage, label,
                   [replica_chunks(plan, r) for r in range(plan.dp)])

    def ring(self, ranks: list[int], nbytes: int) -> tuple[list[list[int]], list[int]]:
        """Channel orders (global ranks) and bytes per channel for a ring over ``ranks``."""
        c = self.plan.collectives
        base = ring_order(self.info, ranks, c.ring_order)
        orders = channel_orders(self.info, base, c.channels)
        bws = [ring_bottleneck_GBps(self.info, o) for o in orders]
        return orders, split_bytes(nbytes, bws)

    def order(self, replica: int, stage: int) -> np.ndarray:
        """Run order of a stage: rows (kind, chunk, micro-batch), see :mod:`..schedule`."""
        rep = self.plan.replicas[replica]
        nv = len(self.chunks[replica][0])
        return stage_order(self.plan.training.schedule, stage, rep.pp, rep.micro_batches, nv)

    def last_block(self, replica: int, stage: int) -> tuple[StageOps, int]:
        """The stage's last block of the iteration and the micro-batch it runs."""
        kind, c, mb = (int(x) for x in self.order(replica, stage)[-1])
        return self.stage_ops[(replica, stage, c)][kind], mb

    def tags(self, ranks: np.ndarray, **more: Any) -> dict[str, Any]:
        """Op tag columns of ops on global ``ranks``: their replica and stage, plus ``more``."""
        return dict(replica=self.rank_replica[ranks], stage=self.rank_stage[ranks], **more)


def chunk_of(em: Emitter, replica: int, stage: int, layer: int) -> int:
    """The model chunk of ``replica``'s ``stage`` that holds ``layer``."""
    chunks = em.chunks[replica][stage]
    if len(chunks) == 1:
        return 0
    for c, (a, b) in enumerate(chunks):
        if a <= layer < b:
            return c
    raise ValueError(f"replicas[{replica}].stages[{stage}] holds no layer {layer}")


__all__ = ["chunk_of", "Emitter", "StageOps", "emit_gated", "emit_lowered"]
