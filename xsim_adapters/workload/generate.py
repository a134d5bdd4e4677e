"""``generate(plan) -> Trace``: the workload generator (a pure function of the plan).

Per replica and stage it builds a forward and a backward block template once (see
:mod:`.blocks`), tiles it over the micro-batches with numpy, chains the blocks in the pipeline
schedule's order, then adds the pipeline transfers between stages (:mod:`.reshard`), the
data-parallel gradient sync (:mod:`.dpsync`) and the optimizer step. Op ids are assigned in
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
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from ..plan.attention import tp_gather_width
from ..plan.limits import check_ops, estimate_ops
from ..plan.model import Plan, Stage
from ..plan.moe import routed_expert_params
from ..plan.parallel import group_replicas, uses_ep
from ..trace.schema import (
    KIND_BARRIER,
    KIND_COMPUTE,
    KIND_FLOW,
    KINDS,
    OPTIONAL_PHASES,
    PHASE_INDEX,
    PHASES,
    SCHEMA_VERSION,
    Trace,
)
from .alltoall import MoEPlanner
from .blocks import Block, RingSpec, build_block, stage_units, tp_kinds
from .builder import BulkBuilder
from .coarsen import Coarsening, decide, ecmp_choice, full
from .compute import ADAM_BYTES_PER_PARAM, optimizer_time_ns, stage_params
from .context import emit_cp
from .dpsync import buckets, chunk_rings, sweep_segments
from .latency import gate_latency, latency_members
from .moe_units import StageMoE
from .perturb import apply_perturbations, interval_slowdowns
from .reshard import DEST, SOURCE, algorithm_label, reshard_transfers
from .rings import (
    RankInfo,
    channel_orders,
    ring_bottleneck_GBps,
    ring_delay_ns,
    ring_order,
    split_bytes,
)
from .schedule import BWD, WGRAD, replica_chunks, stage_order
from .selection import Choice, choose_algorithm, lower_instances

GENERATOR_VERSION = "1"


def plan_digest(plan: Plan) -> str:
    """sha256 (hex) of the canonical JSON form of the validated plan.

    Fields added later are left out at their defaults (no ``perturb`` section, no ``moe``,
    ``ep`` = ``cp`` = 1, ``grad_reduce_dtype: auto``, ``grad_accumulation_fusion: true``,
    ``network.ecmp: flow``, no ``network.transport``), so plans without them keep the digest
    they had before.
    """
    data = _digest_form(asdict(plan))
    if not plan.perturb.active:  # plans without a perturb section keep their earlier digests
        del data["perturb"]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _digest_form(d: dict[str, Any]) -> dict[str, Any]:
    if d["model"].get("moe") is None:
        d["model"].pop("moe", None)
    for key, default in (("grad_reduce_dtype", "auto"), ("grad_accumulation_fusion", True)):
        if d["training"].get(key) == default:
            d["training"].pop(key)
    if d["network"].get("ecmp") == "flow":
        d["network"].pop("ecmp")
    if d["network"].get("transport", 0) is None:
        d["network"].pop("transport")
    for rep in d["replicas"]:
        for st in rep["stages"]:
            for key in ("ep", "cp"):
                if st.get(key) == 1:
                    st.pop(key)
    return d


class _StageOps:
    """Global op ids of one stage's instantiated blocks: arrays indexed (micro-batch, rank)."""

    def __init__(self, base: np.ndarray, blk: Block) -> None:
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


class _Generator:
    def __init__(self, plan: Plan, coarsening: Coarsening | None = None) -> None:
        self.full_plan = plan  # what the manifest describes
        self.coarsening = coarsening or full(plan)
        # what is built: fewer micro-batches when steady-state ones are merged
        plan = self.coarsening.simulated_plan(plan)
        self.plan = plan
        # replica -> the replica whose ops stand for it (itself unless coarsened away)
        self.rep = self.coarsening.representative
        self.tb = BulkBuilder()
        self.info = RankInfo(plan)
        self.blocks: dict[tuple, tuple[Block, ...]] = {}
        n = plan.num_ranks
        self.rank_replica = np.full(n, -1, dtype=np.int64)
        self.rank_stage = np.full(n, -1, dtype=np.int64)
        for r, rep in enumerate(plan.replicas):
            for i, st in enumerate(rep.stages):
                rs = list(plan.stage_ranks(st))
                self.rank_replica[rs] = r
                self.rank_stage[rs] = i
        m = plan.model
        # a CP rank holds s / cp tokens: its TP collectives and pipeline sends carry that much
        cp = plan.replicas[0].stages[0].cp
        self.act_bytes = plan.training.micro_batch * (m.seq_len // cp) * m.hidden * m.dtype_bytes
        c = plan.collectives
        self.algorithm = f"ring:{c.ring_order}:{c.granularity}" + (
            f"({c.chunks})" if c.granularity == "chunked" else ""
        )
        # (replica, stage, chunk) -> (forward, backward[, weight-gradient]) ops
        self.stage_ops: dict[tuple[int, int, int], tuple[_StageOps, ...]] = {}
        self.chunks = [replica_chunks(plan, r) for r in range(plan.dp)]
        self.moe = MoEPlanner(plan, self.info) if plan.model.moe is not None else None

    # ---- rings ---------------------------------------------------------------------------
    def _ring(self, ranks: list[int], nbytes: int) -> tuple[list[list[int]], list[int]]:
        """Channel orders (global ranks) and bytes per channel for a ring over ``ranks``."""
        c = self.plan.collectives
        base = ring_order(self.info, ranks, c.ring_order)
        orders = channel_orders(self.info, base, c.channels)
        bws = [ring_bottleneck_GBps(self.info, o) for o in orders]
        return orders, split_bytes(nbytes, bws)

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
        orders, sizes = self._ring(ranks, nbytes)
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
        return RingSpec(perm, tuple(sizes), ",".join(map(str, perm[0])), self.algorithm,
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

    def order(self, replica: int, stage: int) -> np.ndarray:
        """Run order of a stage: rows (kind, chunk, micro-batch), see :mod:`.schedule`."""
        rep = self.plan.replicas[replica]
        t = self.plan.training
        nv = len(self.chunks[replica][0])
        return stage_order(t.schedule, stage, rep.pp, rep.micro_batches, nv)

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
                        ops.append(_StageOps(base, blk))
                    self.stage_ops[(r, i, k)] = tuple(ops)
                self._chain(r, i, self.order(r, i))
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

    # ---- data-parallel sync and optimizer ------------------------------------------------
    def add_dp_and_optimizer(self) -> None:
        """Barriers, DP sync and the optimizer step.

        ZeRO (``training.zero_stage`` >= 1, dp > 1): the DP sync is a reduce-scatter, the
        optimizer steps over 1/dp of the stage's parameters, and an all-gather of the updated
        parameters on the same rings follows: with ``overlap.param_gather`` at the start of the
        iteration ahead of the forward that needs it (see :meth:`_param_gather`), otherwise after
        the optimizer step. Without ZeRO an all-reduce precedes a full step.
        """
        plan = self.plan
        tb = self.tb
        zero = plan.training.zero_stage >= 1 and plan.dp > 1
        barrier_of = np.full(plan.num_ranks, -1, dtype=np.int64)
        optim_of = np.full(plan.num_ranks, -1, dtype=np.int64)
        last_ends: list[tuple[np.ndarray, np.ndarray, Stage, int, int]] = []
        for r, rep in enumerate(plan.replicas):
            if self.rep[r] != r:
                continue
            for i, st in enumerate(rep.stages):
                kind, k, mb = (int(x) for x in self.order(r, i)[-1])
                blk = self.stage_ops[(r, i, k)][kind]
                ranks = np.asarray(plan.stage_ranks(st), dtype=np.int64)
                last_ends.append((blk.ends[mb], blk.last[mb], st, r, i))
                if plan.dp > 1:
                    ids = tb.add_ops(
                        len(ranks),
                        kind=KIND_BARRIER,
                        rank=ranks,
                        phase=PHASE_INDEX["optim"],
                        replica=r,
                        stage=i,
                    )
                    barrier_of[ranks] = ids
                    tb.add_edges(blk.ends[mb], ids[:, None])
        self._mirror_ranks(barrier_of)
        dp = self._dp_setup() if plan.dp > 1 else None
        sync = "reduce_scatter" if zero else "all_reduce"
        if dp is not None:
            tails, _ = self._dp_rings(dp, sync, dp["ready"])
            tb.add_edges(tails, barrier_of[dp["members"]][:, None, :, None])
        edp = self.moe.edp_setup(self) if self.moe is not None and uses_ep(plan) else None
        if edp is not None:  # expert gradients over the expert-data-parallel group
            tails, _ = self._dp_rings(edp, sync, edp["ready"])
            tb.add_edges(tails, barrier_of[edp["members"]][:, None, :, None])
        for ends, last, st, r, i in last_ends:
            ranks = np.asarray(plan.stage_ranks(st), dtype=np.int64)
            dev = plan.device_types[plan.group(st.group).type]
            params: float | np.ndarray = (
                stage_params(plan.model, st.layers) / st.tp / (plan.dp if zero else 1))
            if self.moe is not None and uses_ep(plan):  # experts: own count, EDP-sharded
                edp_n = plan.dp // len(group_replicas(plan, r, i, "ep"))
                routed = routed_expert_params(plan.model, st.layers)
                params = params - routed / st.tp / (plan.dp if zero else 1) + np.array(
                    [self.moe.expert_params_of(r, i, k) for k in range(st.tp)]
                ) / (edp_n if zero else 1)
            ids = tb.add_ops(
                len(ranks),
                kind=KIND_COMPUTE,
                rank=ranks,
                duration_ns=(optimizer_time_ns(params, dev) if not isinstance(params, np.ndarray)
                             else np.array([optimizer_time_ns(float(x), dev) for x in params])),
                phase=PHASE_INDEX["optim"],
                replica=r,
                stage=i,
                layer_start=st.layers[0],
                layer_stop=st.layers[1],
            )
            optim_of[ranks] = ids
            tb.add_edges(last, ids)
            if plan.dp > 1:
                tb.add_edges(barrier_of[ranks], ids)
            else:
                tb.add_edges(ends, ids[:, None])
        self._mirror_ranks(optim_of)
        if dp is not None and zero:
            if plan.training.overlap.param_gather:
                self._param_gather(dp)
            else:
                self._dp_rings(dp, "all_gather", optim_of[dp["members"]])
        if edp is not None and zero:  # experts' all-gather after the step (not overlapped)
            self._dp_rings(edp, "all_gather", optim_of[edp["members"]])

    def _mirror_ranks(self, per_rank: np.ndarray) -> None:
        """A mirrored replica's ranks take the ops of their representative's matching ranks
        (same stage, same TP index) in ``per_rank`` (op id per global rank), in place."""
        plan = self.plan
        for r, q in enumerate(self.rep):
            if q != r:
                for st, sq in zip(plan.replicas[r].stages, plan.replicas[q].stages, strict=True):
                    per_rank[list(plan.stage_ranks(st))] = per_rank[list(plan.stage_ranks(sq))]

    def _param_gather(self, dp: dict[str, Any]) -> None:
        """ZeRO all-gather overlapped with the forward (Megatron-Core ``overlap_param_gather``).

        One simulated iteration stands for the steady state: it begins with the all-gather of
        the parameters the previous iteration's optimizer updated (one all-gather per iteration,
        as without overlap). Each rank issues its buckets' all-gathers in forward (layer) order,
        the next when the previous has arrived (Megatron dispatches bucket k + 1 when bucket k's
        forward pre-hook waits on k); the first forward of a bucket's first layer (or of the
        embedding) waits for that bucket's all-gather on its rank.
        """
        tails, starts = self._dp_rings(dp, "all_gather", None)
        members = dp["members"]  # (I, n); member j belongs to replica j
        prev = np.full(members.shape, -1, dtype=np.int64)
        seen: dict[int, int] = {}
        for i in range(members.shape[0]):  # rings are in bucket (layer) order
            for j, rank in enumerate(members[i]):
                prev[i, j] = seen.get(int(rank), -1)
                seen[int(rank)] = i
        ii, jj = np.nonzero(prev >= 0)
        if len(ii):
            pred = tails[prev[ii, jj], :, jj, :].reshape(len(ii), 1, -1)
            self.tb.add_edges_valid(pred, starts[ii, :, jj][:, :, None])
        need = dp["first_fwd"]  # (I, n)
        self.tb.add_edges(tails.transpose(0, 2, 1, 3).reshape(*need.shape, -1), need[:, :, None])

    def _sync_choices(self, members: Sequence[int], orders: list[list[int]],
                      grads: tuple[int, Any], params: tuple[int, Any],
                      choices: dict[str, list[Choice]], delays: dict[str, list[int]],
                      picked: dict[tuple, Choice], seen: dict[tuple, int]) -> None:
        """Append one ring's algorithm (NCCL's tuner pick) and NCCL delay per sync kind to
        ``choices`` / ``delays``: all-reduce and reduce-scatter move the gradients ``grads``
        (bytes, per-channel sizes), ZeRO's all-gather the parameters ``params``. ``picked``
        and ``seen`` cache the picks by server shape and the delays by ring layout."""
        plan, info = self.plan, self.info
        mem = np.asarray(members, dtype=np.int64)
        shape = (tuple(info.group[mem]), tuple(np.unique(info.server[mem],
                                                         return_inverse=True)[1]),
                 tuple(info.local[mem]))
        for kd in choices:
            nb, ksz = params if kd == "all_gather" else grads
            if (kd, *shape, nb) not in picked:
                picked[(kd, *shape, nb)] = choose_algorithm(plan, info, list(members), kd, nb)
            ch = picked[(kd, *shape, nb)]
            choices[kd].append(ch)
            if plan.collectives.nccl_cost:
                key = (kd, tuple(map(tuple, orders)), tuple(ksz))
                if key not in seen:
                    seen[key] = ring_delay_ns(info, kd, orders, ksz)
                delays[kd].append(seen[key] if ch.algorithm == "ring" else ch.delay_ns)

    def _dp_setup(self) -> dict[str, Any] | None:
        """Rings of the DP sync (members, orders, bytes) and each member's readiness op.

        Readiness: with ``overlap.dp_grad_reduce``, the member's last weight-gradient pass of the
        bucket's first layer (or the embedding); otherwise the stage's last compute op of the
        iteration (every bucket after the whole backward, as Megatron without overlap).
        """
        plan = self.plan
        segs = sweep_segments(plan)
        bks = buckets(plan, segs)
        rings = chunk_rings(plan, segs, bks)
        if not rings:
            return None
        members = np.array([cr.members for cr in rings], dtype=np.int64)  # (I, n)
        perms, sizes, gsizes, labels = [], [], [], []
        dp_kinds = ("all_reduce", "reduce_scatter", "all_gather")
        delays: dict[str, list[int]] = {k: [] for k in dp_kinds}
        choices: dict[str, list[Choice]] = {k: [] for k in dp_kinds}
        seen: dict[tuple, int] = {}
        picked: dict[tuple, Choice] = {}
        info = self.info
        # ``channels: auto`` may open more rings for some DP rings than for others; the
        # vectorized lowering wants one channel count, so rings with fewer repeat theirs
        # (the same NIC load, the bytes split over the copies)
        ring_orders = [self._ring(list(cr.members), cr.nbytes) for cr in rings]
        width = max(len(o) for o, _ in ring_orders)
        for cr, (orders, sz) in zip(rings, ring_orders, strict=True):
            bott: list[float] = []
            if len(orders) < width:
                orders = [orders[i % len(orders)] for i in range(width)]
                bott = [ring_bottleneck_GBps(info, o) for o in orders]
                sz = split_bytes(cr.nbytes, bott)
            # gradients (all-reduce, reduce-scatter) in the gradient format; ZeRO's all-gather
            # of the updated parameters in the model dtype, on the same rings
            if cr.param_nbytes == cr.nbytes:
                gsz = sz
            elif bott:
                gsz = split_bytes(cr.param_nbytes, bott)
            else:
                gsz = self._ring(list(cr.members), cr.param_nbytes)[1]
            pos = {rk: k for k, rk in enumerate(cr.members)}
            perms.append([[pos[rk] for rk in o] for o in orders])
            sizes.append(sz)
            gsizes.append(gsz)
            labels.append(",".join(map(str, orders[0])))
            self._sync_choices(cr.members, orders, (cr.nbytes, sz), (cr.param_nbytes, gsz),
                               choices, delays, picked, seen)
        grad_kind = WGRAD if plan.training.schedule == "zb_h1" else BWD
        last_op: dict[tuple[int, int], np.ndarray] = {}  # (r, s) -> last compute ids (n,)
        last_grad: dict[tuple[int, int, int], int] = {}  # (r, s, chunk) -> last grad micro-batch
        for r, rep in enumerate(plan.replicas):
            for s in range(rep.pp):
                order = self.order(r, s)
                kind, c, mb = (int(x) for x in order[-1])
                last_op[(r, s)] = self.stage_ops[(r, s, c)][kind].last[mb]
                for row in order[order[:, 0] == grad_kind]:  # in run order: the last one wins
                    last_grad[(r, s, int(row[1]))] = int(row[2])
        overlap_grads = plan.training.overlap.dp_grad_reduce
        ready = np.zeros(members.shape, dtype=np.int64)
        first_fwd = np.zeros(members.shape, dtype=np.int64)
        for k, cr in enumerate(rings):
            bk = bks[cr.bucket]
            mark = "embedding" if bk.has_embedding else bk.start
            fmark = ("fwd", mark)
            for j, (r, s) in enumerate(segs[bk.segment].owners):
                local = cr.member_local[j]
                c = self._chunk_of(r, s, bk.start)
                ops = self.stage_ops[(r, s, c)]
                if overlap_grads:
                    ready[k, j] = ops[grad_kind].marks[mark][last_grad[(r, s, c)], local]
                else:
                    ready[k, j] = last_op[(r, s)][local]
                first_fwd[k, j] = ops[0].marks[fmark][0, local]
        bk_of = np.array([cr.bucket for cr in rings], dtype=np.int64)
        return {
            "members": members,
            "perm": np.array(perms, dtype=np.int64),
            "sizes": np.array(sizes, dtype=np.int64),
            "gather_sizes": np.array(gsizes, dtype=np.int64),
            "gather_nbytes": np.array([cr.param_nbytes for cr in rings], dtype=np.int64),
            "delays": {k: np.array(v, dtype=np.int64) for k, v in delays.items() if v},
            "choices": choices,
            "labels": np.array(labels, dtype=object),
            "nbytes": np.array([cr.nbytes for cr in rings], dtype=np.int64),
            "chunk": np.array([cr.chunk for cr in rings], dtype=np.int64),
            "sync_group": np.array([bks[b].segment for b in bk_of], dtype=np.int64),
            "layer_start": np.array([bks[b].start for b in bk_of], dtype=np.int64),
            "layer_stop": np.array([bks[b].stop for b in bk_of], dtype=np.int64),
            "ready": ready,
            "first_fwd": first_fwd,
        }

    def _chunk_of(self, replica: int, stage: int, layer: int) -> int:
        chunks = self.chunks[replica][stage]
        if len(chunks) == 1:
            return 0
        for c, (a, b) in enumerate(chunks):
            if a <= layer < b:
                return c
        raise ValueError(f"replicas[{replica}].stages[{stage}] holds no layer {layer}")

    def _dp_rings(
        self, dp: dict[str, Any], kind: str, start_after: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Emit one ``kind`` collective per DP ring; member j of ring i starts after
        ``start_after[i, j]`` (None: no predecessor). Returns the global tails (I, C, n, 2) and
        gate flows (I, C, n) (a member whose delay stays a timed barrier has that barrier at
        channel 0 and -1 elsewhere: add edges into them with ``add_edges_valid``)."""
        tb = self.tb
        c = self.plan.collectives
        # ZeRO's parameter all-gather moves model-dtype bytes (when the setup says so)
        gather = kind == "all_gather" and "gather_sizes" in dp
        sizes = dp["gather_sizes"] if gather else dp["sizes"]
        nbytes = dp["gather_nbytes"] if gather else dp["nbytes"]
        rf, algos, chans = lower_instances(
            dp["members"], dp["perm"], sizes, nbytes, dp["choices"][kind], kind,
            c.granularity, c.chunks, self.algorithm, int(dp["perm"].shape[1]))
        delay = dp.get("delays", {}).get(kind)
        timed = delay is not None and rf.size > 0 and bool((delay > 0).any())
        folded = latency_members(rf) if timed else None
        coll = tb.add_collectives(
            len(dp["members"]),
            kind=kind,
            phase=PHASE_INDEX["dp"],
            bytes=nbytes,
            ranks=dp["labels"],
            algorithm=algos,
            channels=chans,
            sync_group=dp["sync_group"],
            layer_start=dp["layer_start"],
            layer_stop=dp["layer_stop"],
            chunk=dp["chunk"],
        )
        ids = tb.add_ops(
            rf.size,
            kind=rf.op_kinds(),
            rank=rf.src,
            dst=rf.op_dst(),
            bytes=rf.nbytes,
            # NCCL latency and protocol cost: a start latency on each member's gate flows
            duration_ns=gate_latency(rf, delay, folded) if folded is not None else 0,
            phase=PHASE_INDEX["dp"],
            replica=self.rank_replica[rf.src],
            stage=self.rank_stage[rf.src],
            layer_start=dp["layer_start"][rf.instance],
            layer_stop=dp["layer_stop"][rf.instance],
            collective=coll[rf.instance],
            step=rf.step,
            channel=rf.channel,
        )
        base = int(ids[0]) if len(ids) else 0
        tb.add_edges(rf.pred + base, rf.succ + base)
        starts = rf.start + base
        if folded is not None and not folded.all():
            # gate flows that wait inside the collective (a tree's inner members) keep a timed
            # barrier from the member's readiness (workload/latency.py)
            ii, mm = np.nonzero(~folded)
            mem = dp["members"][ii, mm]
            dl = tb.add_ops(
                len(ii),
                kind=KIND_BARRIER,
                rank=mem,
                duration_ns=delay[ii],
                phase=PHASE_INDEX["dp"],
                replica=self.rank_replica[mem],
                stage=self.rank_stage[mem],
                layer_start=dp["layer_start"][ii],
                layer_stop=dp["layer_stop"][ii],
                collective=coll[ii],
            )
            tb.add_edges(dl[:, None], starts[ii, :, mm])
            starts = starts.copy()
            starts[ii, :, mm] = -1  # what waits before the ring waits before the barrier
            starts[ii, 0, mm] = dl
        if start_after is not None:
            tb.add_edges_valid(start_after[:, None, :], starts)
        return rf.tails + base, starts

    # ---- output -------------------------------------------------------------------------
    def manifest(
        self, ops_kind: np.ndarray, ops_phase: np.ndarray, num_deps: int
    ) -> dict[str, Any]:
        plan = self.full_plan  # the plan asked for (a coarsened trace stands for all of it)
        ranks = []
        for rank in range(plan.num_ranks):
            g, d, node = plan.rank_info(rank)
            ranks.append(
                {
                    "rank": rank,
                    "group": g.name,
                    "node": node,
                    "device_type": g.type,
                    "local": d % g.gpus_per_node,
                }
            )
        kinds = np.bincount(ops_kind, minlength=len(KINDS))
        phases = np.bincount(ops_phase, minlength=len(PHASES))
        c, t, m = plan.collectives, plan.training, plan.model
        mbs = sum(rep.micro_batches for rep in plan.replicas)
        return {
            "schema_version": SCHEMA_VERSION,
            "plan_name": plan.name,
            "plan_digest": plan_digest(plan),
            "generator": {
                "version": GENERATOR_VERSION,
                "schedule": t.schedule,
                "resharding": c.resharding,
                "channels": c.channels or "auto",
                "granularity": c.granularity,
                "chunks": c.chunks,
                "ring_order": c.ring_order,
                "dp_bucket_layers": c.dp_bucket_layers,
                "sequence_parallel": t.sequence_parallel,
                "recompute": t.recompute,
                "virtual_stages": t.virtual_stages,
                "overlap": asdict(t.overlap),
                "adam_bytes_per_param": ADAM_BYTES_PER_PARAM,
                "zero_stage": t.zero_stage,
            },
            "ranks": ranks,
            "coarsening": self.coarsening.to_manifest(plan),
            "op_counts": {
                "by_kind": {k: int(kinds[i]) for i, k in enumerate(KINDS)},
                "by_phase": {p: int(phases[i]) for i, p in enumerate(PHASES)
                             if p not in OPTIONAL_PHASES or phases[i]},
            },
            "num_ops": int(len(ops_kind)),
            "num_deps": int(num_deps),
            "groups": [g.name for g in plan.device_groups],
            "device_types": {
                name: {
                    "peak_tflops": dt.peak_tflops,
                    "hbm_GBps": dt.hbm_GBps,
                    "scaleup_GBps": dt.scaleup_GBps,
                    "nic_gbps": dt.nic_gbps,
                    "efficiency": dt.efficiency,
                }
                for name, dt in sorted(plan.device_types.items())
            },
            "workload": {
                "global_batch": t.global_batch,
                "micro_batch": t.micro_batch,
                "seq_len": m.seq_len,
                # a CP group's cp replicas share each sequence (cp is one per plan)
                "tokens_per_iteration": mbs * t.micro_batch * m.seq_len
                // plan.replicas[0].stages[0].cp,
                "schedule": t.schedule,
                "dp": plan.dp,
                "replicas": [
                    {
                        "replica": r,
                        "pp": rep.pp,
                        "tp": [st.tp for st in rep.stages],
                        "micro_batches": rep.micro_batches,
                        "layers": [list(st.layers) for st in rep.stages],
                        "chunks": [[list(c) for c in sc] for sc in self.chunks[r]],
                    }
                    for r, rep in enumerate(plan.replicas)
                ],
            },
        }


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
        gen.moe.emit(gen)
    if plan.replicas[0].stages[0].cp > 1:
        emit_cp(gen)
    gen.add_transfers()
    gen.add_dp_and_optimizer()
    ops, deps, colls = gen.tb.frames()
    perturbed = apply_perturbations(ops, plan.perturb, plan.num_ranks, plan.seed)
    manifest = gen.manifest(ops["kind"].to_numpy(), ops["phase"].to_numpy(), len(deps))
    if perturbed:
        manifest["perturb"] = perturbed
    windows = interval_slowdowns(plan.perturb)
    if windows:  # the backends stretch kernels inside these windows (trace/slowdowns.py)
        manifest["compute_slowdowns"] = windows
    return Trace(ops=ops, deps=deps, collectives=colls, manifest=manifest)
