"""The op-count estimate of a plan's trace, per kind, before anything large is built.

:func:`estimate_ops` is what the size and memory guard (:func:`.limits.check_size`,
``workload.generate``) and ``coarsen: auto`` (:mod:`xsim_adapters.workload.coarsen`) decide on.
It counts the ops :func:`xsim_adapters.workload.generate` emits, kind by kind, with the
generator's own choices (ring orders and channels, the collective algorithm NCCL's tuner picks,
the resharding transfers, the all-to-all lowering), but never builds anything per micro-batch:

- ``stages``: per simulated replica, stage, model chunk and micro-batch, the compute ops of the
  block units (:func:`xsim_adapters.workload.blocks.stage_units`: attention and MLP per layer,
  ring-attention steps with CP, three MoE units under EP, recompute, zero-bubble W passes,
  embedding and head; three pieces per unit with ``overlap.tp_comm``);
- ``tp``: the TP collectives after those units, as lowered (ring steps x ranks x channels, or
  the flows of the NVLS / tree / hierarchical template, plus a tree's inner members' delay
  barriers);
- ``pp``: pipeline sends and reshards
  (:func:`xsim_adapters.workload.comm.reshard.reshard_transfers`);
- ``ep``: the MoE all-to-alls (and ETP rings) of **every** expert block, and ``cp``: the CP
  K/V ring of **every** CP group: a coarsened trace keeps them whole, like the DP rings;
- ``dp``: the dense DP sync rings and the expert-DP rings (ZeRO's all-gather too), always whole;
- ``optim``: the barrier and optimizer step per simulated rank.

tests/test_estimate_bounds.py checks ``0.5 <= estimate / ops <= 2`` on every shipped plan of
up to 64 GPUs and on random plans of every parallelism kind; docs/plan.md#limits has the
ratios measured on all shipped plans.

The work is bounded by the plan's size, not the trace's: collectives are lowered once per
distinct shape (cached), and a collective whose ring bound exceeds :data:`EXACT_MAX_FLOWS`
is counted by the ring formula (its trace is refused anyway).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..plan.model import Plan, Stage

# Above this many flows in one collective (ring bound), or members in one all-to-all, the
# count is the closed form rather than the lowering itself: building it could cost what the
# guard protects, and a plan with such a collective is far over MAX_TRACE_OPS anyway.
EXACT_MAX_FLOWS = 1 << 20
EXACT_MAX_A2A_MEMBERS = 512
# DP (segment, chunk) rings whose algorithm and channels are looked up one by one (and at most
# EXACT_MAX_FLOWS members over them); beyond, every ring is counted by the ring formula.
EXACT_MAX_DP_RINGS = 4096

KINDS = ("stages", "tp", "pp", "ep", "cp", "dp", "optim")


def estimate_ops(plan: Plan, simulated: Collection[int] | None = None) -> int:
    """The ops :func:`xsim_adapters.workload.generate` makes for ``plan`` (estimated: within a
    factor 2 either way, tests/test_estimate_bounds.py).

    ``simulated``: the replicas whose stages are generated (a coarsened trace, see
    :mod:`xsim_adapters.workload.coarsen`; None: all). The DP sync, the expert all-to-alls and
    the CP rings are counted whole either way, as the generator keeps them whole.
    """
    return sum(estimate_by_kind(plan, simulated).values())


def estimate_by_kind(plan: Plan, simulated: Collection[int] | None = None) -> dict[str, int]:
    """:func:`estimate_ops` split by :data:`KINDS` (ops)."""
    return _Counter(plan).count(simulated)


class _Counter:
    """Op counts of one plan's trace, with the generator's choices cached by shape."""

    def __init__(self, plan: Plan) -> None:
        from .comm.rings import RankInfo

        self.plan = plan
        self.info = RankInfo(plan)
        m = plan.model
        cp = plan.replicas[0].stages[0].cp
        self.act_bytes = plan.training.micro_batch * (m.seq_len // cp) * m.hidden * m.dtype_bytes
        self.cache: dict[tuple, int] = {}

    def count(self, simulated: Collection[int] | None) -> dict[str, int]:
        """Ops per kind (:data:`KINDS`)."""
        from .schedule import replica_chunks

        plan = self.plan
        out = dict.fromkeys(KINDS, 0)
        for r, rep in enumerate(plan.replicas):
            if simulated is not None and r not in simulated:
                continue
            chunks = replica_chunks(plan, r)
            nv = len(chunks[0])
            m = rep.micro_batches
            for i, st in enumerate(rep.stages):
                tp_ops = {k: self.collective(st, k, self.act_bytes) for k in self.tp_kinds()}
                for k, layers in enumerate(chunks[i]):
                    first, last = i == 0 and k == 0, i == rep.pp - 1 and k == nv - 1
                    comp, coll = self.block_ops(st, layers, first, last, tp_ops)
                    out["stages"] += comp * m
                    out["tp"] += coll * m
                n_ranks = st.tp * (2 if plan.dp > 1 else 1)  # optimizer (+ barrier)
                out["optim"] += n_ranks
            for j in range(rep.pp * nv - 1):
                a, b = rep.stages[j % rep.pp].tp, rep.stages[(j + 1) % rep.pp].tp
                out["pp"] += 2 * m * self.transfers(a, b)
        out["ep"] = self.ep_ops()
        out["cp"] = self.cp_ops()
        out["dp"] = self.dp_ops() + self.edp_ops()
        return out

    # ---- stages ------------------------------------------------------------------------
    def tp_kinds(self) -> tuple[str, ...]:
        t = self.plan.training
        return ("reduce_scatter", "all_gather") if t.sequence_parallel else ("all_reduce",)

    def block_ops(self, st: Stage, layers: tuple[int, int], first: bool, last: bool,
                  tp_ops: dict[str, int]) -> tuple[int, int]:
        """(compute ops, TP collective ops) of one micro-batch of a model chunk of a stage:
        every block (forward, backward, W) as :func:`.blocks.stage_units` lays it out and
        :func:`.blocks.build_block` lowers it."""
        plan, t = self.plan, self.plan.training
        n = st.tp
        coll = sum(tp_ops.values()) if n > 1 else 0  # a unit's TP collectives
        pieces = 3 if t.overlap.tp_comm and n > 1 else 1  # a split unit (GEMM shares, kinds)
        ep = plan.model.moe is not None and st.ep > 1
        # (compute ops, collective units) of: the attention block (with CP: the local block
        # and cp - 1 ring steps, the collectives after the last), a dense / an MoE MLP
        attn = (st.cp * n, 1) if st.cp > 1 else (pieces * n, 1)
        dense = (pieces * n, 1)
        moe_mlp = (3 * n, 0) if ep else (n, 1)
        n_layers = layers[1] - layers[0]
        n_moe = self.moe_layers(st, layers)
        n_dense = n_layers - n_moe
        passes = 3 if t.recompute == "full" else 2  # fwd, [recompute], bwd
        comp = passes * (n_layers * attn[0] + n_dense * dense[0] + n_moe * moe_mlp[0])
        units = passes * (n_layers * attn[1] + n_dense * dense[1] + n_moe * moe_mlp[1])
        per_layer = int(t.recompute == "selective") + int(t.schedule == "zb_h1")
        comp += per_layer * n_layers * n  # selective core, W pass: no collective
        if first:  # embedding forward (+ TP collective) and its gradient
            comp, units = comp + 2 * n, units + 1
        if last:  # head forward, head backward (+ TP collective), its W pass under zb_h1
            comp, units = comp + (3 if t.schedule == "zb_h1" else 2) * n, units + 1
        return comp, units * coll

    def collective(self, st: Stage, kind: str, nbytes: int) -> int:
        """Ops of one TP collective ``kind`` of ``nbytes`` over the stage's ranks."""
        return self.group_collective(list(self.plan.stage_ranks(st)), kind, nbytes, 0)

    def group_collective(self, ranks: Sequence[int], kind: str, nbytes: int,
                         width: int) -> int:
        """Ops of one collective ``kind`` of ``nbytes`` per member over ``ranks``, as the
        generator lowers it: a ring (steps x members x channels; ``width`` > 0: that many
        channels) or the template of the algorithm NCCL's tuner picks, plus the delay barriers
        of members whose first sends wait inside it (a tree's inner members)."""
        import numpy as np

        from .comm.collectives import num_steps
        from .comm.rings import channel_orders, ring_order

        plan, info = self.plan, self.info
        c = plan.collectives
        n = len(ranks)
        if n < 2:
            return 0
        steps = num_steps(kind, n, c.granularity, c.chunks)
        mem = np.asarray(ranks, dtype=np.int64)
        shape = (kind, nbytes, width, tuple(info.group[mem]), tuple(info.local[mem]),
                 tuple(np.unique(info.server[mem], return_inverse=True)[1]))
        if shape in self.cache:
            return self.cache[shape]
        if steps * n * max(1, c.channels, width) > EXACT_MAX_FLOWS:
            ops = steps * n * max(1, c.channels, width)
        else:
            chans = width or len(channel_orders(info, ring_order(info, ranks, c.ring_order),
                                                c.channels))
            ops = self._lowered(ranks, kind, nbytes, steps * n * chans)
        self.cache[shape] = ops
        return ops

    def _lowered(self, ranks: Sequence[int], kind: str, nbytes: int, ring_ops: int) -> int:
        from .comm.algorithms import lower
        from .comm.latency import latency_members
        from .comm.selection import choose_algorithm

        ch = choose_algorithm(self.plan, self.info, ranks, kind, nbytes)
        if ch.algorithm == "ring" or ch.layout is None:
            return ring_ops
        rf = lower(ch.algorithm, kind, ch.layout, nbytes, ch.channels, ch.chunks)
        barriers = int((~latency_members(rf)).sum()) if ch.delay_ns > 0 else 0
        return int(rf.size) + barriers

    def transfers(self, a: int, b: int) -> int:
        """Ops of one pipeline send between stages of TP ``a`` and ``b`` (flows, and a
        barrier where a rank sends to itself)."""
        from .comm.reshard import reshard_transfers

        key = ("pp", a, b)
        if key not in self.cache:
            method = self.plan.collectives.resharding
            self.cache[key] = (a * b if a * b > EXACT_MAX_FLOWS
                               else len(reshard_transfers(a, b, self.act_bytes, method)))
        return self.cache[key]

    # ---- expert and context parallelism -----------------------------------------------
    def moe_layers(self, st: Stage, layers: tuple[int, int]) -> int:
        """MoE layers of the chunk ``layers`` that the stage routes (those of its written
        range, as :class:`xsim_adapters.workload.comm.alltoall.MoEPlanner` routes them)."""
        from ..plan.moe import is_moe_layer

        if self.plan.model.moe is None:
            return 0
        lo, hi = max(layers[0], st.layers[0]), min(layers[1], st.layers[1])
        key = ("moe", lo, hi)  # cached: a plan may repeat a 32k-layer stage 32k times
        if key not in self.cache:
            self.cache[key] = sum(is_moe_layer(self.plan.model, x) for x in range(lo, hi))
        return self.cache[key]

    def ep_ops(self) -> int:
        """The dispatch and combine all-to-alls (and ETP rings) of every expert block: per
        MoE layer, pass (forward, [recompute], backward) and micro-batch, two exchanges."""
        from ..plan.parallel import ep_size_in_replicas
        from .schedule import replica_chunks

        plan = self.plan
        if plan.model.moe is None:
            return 0
        passes = 3 if plan.training.recompute == "full" else 2
        total = 0
        for r0, rep in enumerate(plan.replicas):
            chunks = None
            for i, st in enumerate(rep.stages):
                if st.ep <= 1 or r0 % ep_size_in_replicas(st.ep, st.tp, st.etp):
                    continue
                chunks = chunks or replica_chunks(plan, r0)
                n_moe = sum(self.moe_layers(st, layers) for layers in chunks[i])
                if n_moe:
                    total += n_moe * passes * 2 * rep.micro_batches * self._exchange_ops(r0, i)
        return total

    def _exchange_ops(self, r0: int, i: int) -> int:
        """Ops of one dispatch (or combine) of the expert block of ``replicas[r0]`` stage
        ``i``, one micro-batch: the all-to-all of each ETP position's EP group and, with
        ``etp`` > 1, a join per block rank and the ETP rings."""
        from ..plan.parallel import ep_ranks

        plan = self.plan
        st = plan.replicas[r0].stages[i]
        members = ep_ranks(plan, r0, i)
        e = st.etp
        nccl = plan.collectives.nccl_cost
        ops = sum(self._a2a(members[t::e]) for t in range(e))
        if e > 1:  # joins, then one ring-v per EP position: (etp - 1) x etp flows (+ delays)
            ops += len(members) + st.ep * ((e - 1) * e + (e if nccl else 0))
        return ops

    def _a2a(self, members: list[int]) -> int:
        """Ops of one all-to-all over ``members``: a flow per pair that exchanges tokens
        (every pair: routing sends every member some), and under ``hierarchical`` the
        lowering's proxy flows and, with NCCL cost, a proxy's two delay barriers."""
        import numpy as np

        from .comm.alltoall import lower_alltoall

        g = len(members)
        method = self.plan.model.moe.alltoall  # type: ignore[union-attr]
        if method != "hierarchical" or g > EXACT_MAX_A2A_MEMBERS:
            return g * (g - 1)
        key = ("a2a", tuple(self.info.server[members].tolist()))
        if key not in self.cache:
            ex = lower_alltoall(np.ones((g, g), dtype=np.int64), members, self.info, method)
            proxies = len(np.unique(ex.src[ex.step > 0]))
            self.cache[key] = len(ex.src) + (2 * proxies if self.plan.collectives.nccl_cost
                                             else 0)
        return self.cache[key]

    def cp_ops(self) -> int:
        """The K/V ring of every CP group: per layer, pass and micro-batch, ``cp - 1`` steps
        of one flow per member (``cp x tp`` members)."""
        plan = self.plan
        cp = plan.replicas[0].stages[0].cp
        if cp <= 1:
            return 0
        passes = 3 if plan.training.recompute == "full" else 2
        total = 0
        for r0 in range(0, plan.dp, cp):
            rep = plan.replicas[r0]
            for st in rep.stages:
                total += ((st.layers[1] - st.layers[0]) * passes * (cp - 1) * cp * st.tp
                          * rep.micro_batches)
        return total

    # ---- data-parallel sync ------------------------------------------------------------
    def _sync_kinds(self) -> tuple[str, ...]:
        t = self.plan.training
        zero = t.zero_stage >= 1 and self.plan.dp > 1
        return ("reduce_scatter", "all_gather") if zero else ("all_reduce",)

    def _dense_sync_kinds(self) -> tuple[str, ...]:
        """The dense DP rings' collectives, one entry per emission: ZeRO-3 gathers every unit
        per micro-batch before its forward and (reshard after forward) its backward."""
        from .fsdp import fsdp_micro_batches, zero3

        plan = self.plan
        if not zero3(plan):
            return self._sync_kinds()
        passes = 2 if plan.training.fsdp.reshard_after_forward else 1
        return ("reduce_scatter",) + ("all_gather",) * (passes * fsdp_micro_batches(plan))

    def dp_ops(self) -> int:
        """The dense DP sync: per bucket, one ring per TP chunk (:mod:`.dpsync`), every ring as
        wide as the widest (the generator repeats the channels of narrower ones)."""
        from .comm.collectives import num_steps
        from .comm.dpsync import buckets, sweep_segments
        from .comm.rings import channel_orders, ring_order

        plan, info, c = self.plan, self.info, self.plan.collectives
        if plan.dp < 2:
            return 0
        segs = sweep_segments(plan)
        # every bucket of a segment has the same chunk rings; buckets by (grad, param) bytes
        sizes: dict[int, dict[tuple[int, int], int]] = {}
        for bk in buckets(plan, segs):
            per = sizes.setdefault(bk.segment, {})
            per[(bk.nbytes, bk.param_nbytes)] = per.get((bk.nbytes, bk.param_nbytes), 0) + 1
        lcms = [math.lcm(*(plan.replicas[r].stages[x].tp for r, x in seg.owners))
                 for seg in segs]
        if self._hsdp():
            return self._hsdp_ops(segs, sizes, lcms)
        # the rings are looked at one by one while that costs no more than the generator's
        # own DP setup of a small plan; beyond, the ring formula with the first ring's width
        exact = (sum(lcms) <= EXACT_MAX_DP_RINGS
                 and sum(lcms) * plan.dp <= EXACT_MAX_FLOWS)
        rings: list[tuple[int, int, list[int]]] = []  # (segment, chunks, members of a chunk)
        for si, seg in enumerate(segs):
            stages = [plan.replicas[r].stages[x] for r, x in seg.owners]
            for ch in range(lcms[si] if exact else 1):
                rings.append((si, lcms[si], [plan.stage_ranks(st)[ch * st.tp // lcms[si]]
                                             for st in stages]))
            if not exact:
                break
        width = max(len(channel_orders(info, ring_order(info, mem, c.ring_order), c.channels))
                    for _, _, mem in rings)
        total = 0
        if not exact:
            for si, big_l in enumerate(lcms):
                for _, count in sizes.get(si, {}).items():
                    total += big_l * count * sum(
                        num_steps(k, plan.dp, c.granularity, c.chunks) * plan.dp * width
                        for k in self._dense_sync_kinds())
            return total
        for si, big_l, mem in rings:
            for (nb, pnb), count in sizes.get(si, {}).items():
                for kind in self._dense_sync_kinds():
                    b = (pnb if kind == "all_gather" else nb) // big_l
                    total += count * self.group_collective(mem, kind, b, width)
        return total

    def _hsdp(self) -> bool:
        from ..plan.parallel import fsdp_shard_size
        from .fsdp import zero3

        return zero3(self.plan) and fsdp_shard_size(self.plan) < self.plan.dp

    def _hsdp_ops(self, segs: list, sizes: dict[int, dict[tuple[int, int], int]],
                  lcms: list[int]) -> int:
        """HSDP (:func:`.fsdp.hsdp_sync`): every chunk ring cut into shard groups (the
        reduce-scatter and the gathers) and replicate groups (the shard's all-reduce), each set
        as wide as its widest ring; always ring by ring."""
        from ..plan.parallel import fsdp_shard_size
        from .comm.rings import channel_orders, ring_order

        plan, info, c = self.plan, self.info, self.plan.collectives
        n = fsdp_shard_size(plan)
        shard = [list(range(g * n, (g + 1) * n)) for g in range(plan.dp // n)]
        repl = [list(range(k, plan.dp, n)) for k in range(n)]
        rings: list[tuple[int, int, list[int]]] = []
        for si, seg in enumerate(segs):
            stages = [plan.replicas[r].stages[x] for r, x in seg.owners]
            for ch in range(lcms[si]):
                rings.append((si, lcms[si], [plan.stage_ranks(st)[ch * st.tp // lcms[si]]
                                             for st in stages]))

        def width(groups: list[list[int]]) -> int:
            return max(len(channel_orders(info, ring_order(info, [mem[x] for x in g],
                                                           c.ring_order), c.channels))
                       for _, _, mem in rings for g in groups)

        ws, wr = width(shard), width(repl)
        total = 0
        for si, big_l, mem in rings:
            for (nb, pnb), count in sizes.get(si, {}).items():
                for g in shard:
                    for kind in self._dense_sync_kinds():
                        b = (pnb if kind == "all_gather" else nb) // big_l
                        total += count * self.group_collective([mem[x] for x in g], kind, b, ws)
                for g in repl:
                    total += count * self.group_collective([mem[x] for x in g], "all_reduce",
                                                           nb // big_l // n, wr)
        return total

    def edp_ops(self) -> int:
        """The expert-data-parallel rings under EP: per stage and expert-block position, a ring
        over that position in every block (sync, and ZeRO's all-gather)."""
        from ..plan.moe import expert_params, moe_layers_in
        from ..plan.parallel import ep_ranks, ep_size_in_replicas, uses_ep

        plan = self.plan
        if not uses_ep(plan):
            return 0
        rep0 = plan.replicas[0]
        g = ep_size_in_replicas(rep0.stages[0].ep, rep0.stages[0].tp, rep0.stages[0].etp)
        heads = list(range(0, plan.dp, g))
        if len(heads) < 2:
            return 0
        grad = plan.training.grad_reduce_bytes(plan.model.dtype_bytes)
        total = 0
        for i, st in enumerate(rep0.stages):
            n_moe = moe_layers_in(plan.model, st.layers)
            if not n_moe:
                continue
            params = expert_params(plan.model, st.etp) * n_moe  # one expert (and more: bytes)
            groups = [ep_ranks(plan, h, i) for h in heads]
            for p in range(st.ep * st.etp):
                mem = [grp[p] for grp in groups]
                for kind in self._sync_kinds():
                    nb = params * (plan.model.dtype_bytes if kind == "all_gather" else grad)
                    total += self.group_collective(mem, kind, nb, 0)
        return total


__all__ = ["KINDS", "estimate_by_kind", "estimate_ops"]
