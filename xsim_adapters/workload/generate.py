"""``generate(plan) -> Trace``: the workload generator (a pure function of the plan).

Per replica and stage it builds a forward and a backward block template once (see
:mod:`.blocks`), tiles it over the micro-batches with numpy, chains the blocks in the pipeline
schedule's order, then adds the pipeline transfers between stages (:mod:`.comm.reshard`),
the data-parallel gradient sync and the optimizer step (:mod:`.dp`). Op ids are assigned in
construction order, so the same plan always gives identical frames.

Dependencies a backend sees (no implicit ones):
- each rank's compute ops form a chain in run order; a compute op after a TP collective also
  waits for the collective's last flows into and out of its rank;
- a pipeline transfer's flows from a sending rank wait for that rank's block result; the
  receiving rank's block waits for every transfer flow into it; sends are asynchronous (the
  sender's next block does not wait for them);
- a DP bucket's ring starts on each owner when it has finished the backward of the bucket's
  layers for its last micro-batch; each rank's optimizer step waits, through one barrier op per
  rank, for its last block and every DP ring it is part of.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np

from ..plan.attention import tp_gather_width
from ..plan.limits import check_ops
from ..plan.model import Plan, Stage
from ..plan.sizes import activation_bytes
from ..trace.schema import KIND_BARRIER, KIND_FLOW, PHASE_INDEX, Trace
from .blocks import Block, RingSpec, build_block, stage_units, tp_kinds
from .coarsen import Coarsening, decide, ecmp_choice, full
from .comm.alltoall import MoEPlanner
from .comm.context import emit_cp
from .comm.emit import Emitter, StageOps
from .comm.reshard import DEST, SOURCE, algorithm_label, reshard_transfers
from .comm.rings import ring_delay_ns
from .comm.selection import Choice, choose_algorithm
from .compute.moe_units import StageMoE
from .dp import add_dp_and_optimizer
from .estimate import estimate_ops
from .manifest import manifest, plan_digest
from .perturb import apply_perturbations, interval_slowdowns


class _Generator:
    """The build of one trace: stages, pipeline transfers, then (:mod:`.dp`) the DP sync and
    the optimizer, all through one :class:`.comm.emit.Emitter`."""

    def __init__(self, plan: Plan, coarsening: Coarsening | None = None) -> None:
        self.full_plan = plan  # what the manifest describes
        self.coarsening = coarsening or full(plan)
        # what is built: fewer micro-batches when steady-state ones are merged
        plan = self.coarsening.simulated_plan(plan)
        self.plan = plan
        # replica -> the replica whose ops stand for it (itself unless coarsened away)
        self.rep = self.coarsening.representative
        self.em = Emitter.for_plan(plan)
        self.tb = self.em.tb
        self.info = self.em.info
        self.blocks: dict[tuple, tuple[Block, ...]] = {}
        # a CP rank holds s / cp tokens: its TP collectives and pipeline sends carry that much
        self.act_bytes = activation_bytes(plan.model, plan.training.micro_batch,
                                          plan.replicas[0].stages[0].cp)
        self.stage_ops = self.em.stage_ops
        self.chunks = self.em.chunks
        self.moe = MoEPlanner(plan, self.info) if plan.model.moe is not None else None

    def _stage_ring(self, stage: Stage, nbytes: int | None = None) -> RingSpec:
        """The TP ring of a stage for ``nbytes`` per collective (default: the activations);
        with MLA under sequence parallelism also the ring of its latents (``RingSpec.latent``)."""
        plan = self.plan
        if nbytes is None and plan.training.sequence_parallel and stage.tp > 1:
            width = tp_gather_width(plan.model)
            if width != plan.model.hidden:
                lat = self.act_bytes // plan.model.hidden * width
                return replace(self._stage_ring(stage, self.act_bytes),
                               latent=self._stage_ring(stage, lat), latent_bytes=lat)
        nbytes = self.act_bytes if nbytes is None else nbytes
        ranks = list(self.plan.stage_ranks(stage))
        orders, sizes = self.em.ring(ranks, nbytes)
        pos = {r: k for k, r in enumerate(ranks)}
        perm = tuple(tuple(pos[r] for r in o) for o in orders)
        delays: list[tuple[str, int]] = []
        choices: list[tuple[str, Choice]] = []
        for k in tp_kinds(self.plan):
            ch = choose_algorithm(self.plan, self.info, ranks, k, nbytes)
            if ch.algorithm != "ring":
                choices.append((k, ch))
                delays.append((k, ch.delay_ns))
            elif self.plan.collectives.nccl_cost:
                delays.append((k, ring_delay_ns(self.info, k, orders, sizes)))
        return RingSpec(perm, tuple(sizes), ",".join(map(str, perm[0])), self.em.ring_label,
                        tuple(delays), tuple(choices))

    # ---- stages ------------------------------------------------------------------------
    def _blocks(
        self, stage: Stage, layers: tuple[int, int], first: bool, last: bool, ring: RingSpec,
        moe: StageMoE | None = None,
    ) -> tuple[Block, ...]:
        dev = self.plan.device_types[self.plan.group(stage.group).type]
        key = (stage.tp, layers, first, last, dev.name, ring) + ((moe,) if moe else ())
        if key not in self.blocks:
            c, t = self.plan.collectives, self.plan.training
            units = stage_units(
                self.plan, stage, dev, first, last, layers, split_w=t.schedule == "zb_h1",
                moe=moe,
            )
            self.blocks[key] = tuple(
                build_block(
                    u, stage.tp, ring, self.act_bytes, c.granularity, c.chunks, t.overlap.tp_comm,
                    dev.sm_count,
                )
                for u in units
            )
        return self.blocks[key]

    def add_stages(self) -> None:
        plan = self.plan
        for r, rep in enumerate(plan.replicas):
            if self.rep[r] != r:
                continue  # a mirrored replica: its representative's ops stand for it
            m = rep.micro_batches
            chunks = self.chunks[r]
            nv = len(chunks[0])
            for i, st in enumerate(rep.stages):
                ring = self._stage_ring(st)
                moe = self.moe.stage_costs(r, i) if self.moe is not None else None
                ranks = np.asarray(plan.stage_ranks(st), dtype=np.int64)
                label = {ring.label: ",".join(str(ranks[int(x)]) for x in ring.label.split(","))}
                per_copy = {
                    "microbatch": np.arange(m),
                    "replica": np.full(m, r),
                    "stage": np.full(m, i),
                }
                for k, layers in enumerate(chunks[i]):
                    first = i == 0 and k == 0
                    last = i == rep.pp - 1 and k == nv - 1
                    ops = []
                    for blk in self._blocks(st, layers, first, last, ring, moe):
                        base = self.tb.add_tiled(blk.template, m, ranks, per_copy, label)
                        ops.append(StageOps(base, blk))
                    self.stage_ops[(r, i, k)] = tuple(ops)
                self._chain(r, i, self.em.order(r, i))
        for r, q in enumerate(self.rep):
            if q != r:
                for (qq, i, k), blocks in list(self.stage_ops.items()):
                    if qq == q:
                        self.stage_ops[(r, i, k)] = blocks

    def _chain(self, r: int, i: int, order: np.ndarray) -> None:
        """Edges from each block's ends to the next block's head, in schedule order."""
        x, y = order[:-1], order[1:]
        nv = int(order[:, 1].max()) + 1
        xkey = x[:, 0] * nv + x[:, 1]
        ykey = y[:, 0] * nv + y[:, 1]
        pair = xkey * (3 * nv) + ykey
        for p in np.unique(pair):
            sel = pair == p
            xk, yk = int(xkey[sel][0]), int(ykey[sel][0])
            xops = self.stage_ops[(r, i, xk % nv)][xk // nv]
            yops = self.stage_ops[(r, i, yk % nv)][yk // nv]
            ends = xops.ends[x[sel, 2]]  # (s, n, k)
            heads = yops.head[y[sel, 2]]  # (s, n)
            self.tb.add_edges(ends, heads[:, :, None])

    # ---- pipeline transfers --------------------------------------------------------------
    def add_transfers(self) -> None:
        """Pipeline sends between consecutive virtual stages j -> j + 1 (j = chunk * pp + stage):
        the forward activation after the block of j, the activation gradient back after the
        backward (B) block of j + 1. With interleaving the last stage sends chunk k's output
        to the first stage's chunk k + 1."""
        plan = self.plan
        method = plan.collectives.resharding
        for r, rep in enumerate(plan.replicas):
            if self.rep[r] != r:
                continue
            chunks = self.chunks[r]
            for j in range(rep.pp * len(chunks[0]) - 1):
                (i0, k0), (i1, k1) = divmod(j, rep.pp)[::-1], divmod(j + 1, rep.pp)[::-1]
                s0, s1 = rep.stages[i0], rep.stages[i1]
                f0, b0 = self.stage_ops[(r, i0, k0)][:2]
                f1, b1 = self.stage_ops[(r, i1, k1)][:2]
                boundary = chunks[i0][k0][1]
                self._transfer(r, (i0, i1), (s0, s1), f0.ends, f1.head, method, boundary)
                self._transfer(r, (i1, i0), (s1, s0), b1.ends, b0.head, method, boundary)

    def _transfer(
        self,
        replica: int,
        stage_idx: tuple[int, int],
        stages: tuple[Stage, Stage],
        src_ends: np.ndarray,
        dst_heads: np.ndarray,
        method: str,
        boundary: int,
    ) -> None:
        a, b = stages[0].tp, stages[1].tp
        nbytes = self.act_bytes
        trs = reshard_transfers(a, b, nbytes, method)
        m = src_ends.shape[0]
        side_ranks = [self.plan.stage_ranks(stages[0]), self.plan.stage_ranks(stages[1])]
        src = np.array([side_ranks[t.src_side][t.src_idx] for t in trs], dtype=np.int64)
        dst = np.array([side_ranks[t.dst_side][t.dst_idx] for t in trs], dtype=np.int64)
        size = np.array([t.bytes for t in trs], dtype=np.int64)
        stage_tag = np.array([stage_idx[t.src_side] for t in trs], dtype=np.int64)
        self_flow = src == dst  # same rank on both sides: a dependency, not a flow
        phase = PHASE_INDEX["pp" if a == b else "reshard"]
        coll = self.tb.add_collectives(
            m,
            kind="p2p" if a == b else "reshard",
            phase=phase,
            bytes=int(size[~self_flow].sum()),
            ranks=",".join(map(str, side_ranks[0])) + ";" + ",".join(map(str, side_ranks[1])),
            algorithm=algorithm_label(a, b, nbytes, method),
            layer_start=boundary,
            layer_stop=boundary,
        )
        nt = len(trs)
        ids = self.tb.add_ops(
            m * nt,
            kind=np.tile(np.where(self_flow, KIND_BARRIER, KIND_FLOW), m),
            rank=np.tile(src, m),
            dst=np.tile(np.where(self_flow, -1, dst), m),
            bytes=np.tile(np.where(self_flow, 0, size), m),
            phase=phase,
            replica=replica,
            stage=np.tile(stage_tag, m),
            microbatch=np.repeat(np.arange(m), nt),
            layer_start=boundary,
            layer_stop=boundary,
            collective=np.repeat(coll, nt),
            step=np.tile([t.phase_step for t in trs], m),
        ).reshape(m, nt)
        for k, t in enumerate(trs):
            if t.src_side == SOURCE:
                self.tb.add_edges(src_ends[:, t.src_idx, :], ids[:, k, None])
            for k2, t2 in enumerate(trs):
                if t2.phase_step < t.phase_step and (t2.dst_side, t2.dst_idx) == (
                    t.src_side,
                    t.src_idx,
                ):
                    self.tb.add_edges(ids[:, k2], ids[:, k])
            if t.dst_side == DEST:
                self.tb.add_edges(ids[:, k], dst_heads[:, t.dst_idx])

def generate(plan: Plan, coarsen: str | Coarsening = "auto") -> Trace:
    """The trace of one training iteration of ``plan`` (pure: same plan and ``coarsen``,
    identical frames).

    ``coarsen``: ``auto`` (default), ``on`` or ``off``: simulate one representative of each
    class of identical replicas and merge steady-state micro-batches (:func:`.coarsen.decide`,
    docs/scale.md), or a :class:`.coarsen.Coarsening` chosen by the caller; the manifest's
    ``coarsening`` says what was done. Raises PlanError if the chosen trace is too large.
    """
    co = coarsen if isinstance(coarsen, Coarsening) else decide(plan, coarsen)
    if co.microbatches is not None:
        trace = _build(plan, co)
        fl = trace.ops["kind"].to_numpy() == KIND_FLOW
        why = ecmp_choice(plan, trace.ops["rank"].to_numpy()[fl], trace.ops["dst"].to_numpy()[fl])
        if why is None:
            return trace
        # a route that depends on op ids: the merged micro-batches would not be the full run's
        co = dataclasses.replace(co, microbatches=None, microbatch_reason=why)
    return _build(plan, co)


def _build(plan: Plan, co: Coarsening) -> Trace:
    """The trace of ``plan`` under coarsening ``co`` (see :func:`generate`)."""
    check_ops(estimate_ops(co.simulated_plan(plan), set(co.representative)))
    gen = _Generator(plan, co)
    gen.add_stages()
    if gen.moe is not None:
        gen.moe.emit(gen.em)
    if plan.replicas[0].stages[0].cp > 1:
        emit_cp(gen.em)
    gen.add_transfers()
    add_dp_and_optimizer(gen.em, gen.rep, gen.moe)
    ops, deps, colls = gen.tb.frames()
    perturbed = apply_perturbations(ops, plan.perturb, plan.num_ranks, plan.seed)
    man = manifest(plan, co, gen.chunks, ops["kind"].to_numpy(), ops["phase"].to_numpy(),
                   len(deps))
    if perturbed:
        man["perturb"] = perturbed
    windows = interval_slowdowns(plan.perturb)
    if windows:  # the backends stretch kernels inside these windows (trace/slowdowns.py)
        man["compute_slowdowns"] = windows
    return Trace(ops=ops, deps=deps, collectives=colls, manifest=man)


__all__ = ["generate", "plan_digest"]
