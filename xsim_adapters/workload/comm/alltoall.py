"""Expert-parallel all-to-all(v): lowering to flows, its NCCL cost, and the MoE planner.

NCCL has no all-to-all kernel: Megatron-Core's token dispatcher calls
``torch.distributed.all_to_all_single``, which NCCL runs as one group of sends and receives,
one pair per peer, all in flight together. Lowerings (``model.moe.alltoall``):

- ``direct``: one flow per (source, destination) member pair with bytes > 0 (own tokens stay
  local, no flow).

Completion: a member's part of the exchange is one NCCL kernel (the grouped sends and
receives), which ends when its receives *and* its sends are done; the compute that consumes the
output waits for that kernel, and the next exchange on the same communicator (the combine after
the dispatch) is queued behind it on the same stream. So a member's next compute waits for every
flow into it and every flow out of it (forwarding proxies included). Without the second half a
slow-NIC member would start its experts, and its combine, while its dispatch sends were still
on the wire: on ``moe-hetero-h100-a100-by-speed`` that made the flow backend (fair sharing) 6.4%
slower than the packet backends, whose sender queues happened to serve the older flows first.
- ``hierarchical``: intra-server exchange first. Member ``i`` sends what it has for member ``j``
  on another server to its proxy: the member on ``i``'s server at ``j``'s position among the
  group's members of ``j``'s server (so the proxy and ``j`` share a rail), together with what
  it has for that proxy itself; each proxy forwards, once everything for it has arrived, one
  flow per destination server (rail-aligned, the sum over its server's members). Needs an equal
  member count on every server of the group; otherwise the group falls back to ``direct``
  (recorded in the collective's ``algorithm``).

NCCL cost (``collectives.nccl_cost``): per member, a start latency on its first-step flows
(trace schema 2, :mod:`.latency`) of the Simple protocol's base latency plus one step latency
of the slowest link type it sends over (the p2p operations of a group run concurrently), plus
the time NCCL's NVLink efficiency adds to its intra-server bytes; a hierarchical proxy keeps
that delay as a timed barrier (its forwarding is gated on it) and pays a second barrier
(Simple base + one network step) before it forwards. Constants from :mod:`.nccl` (their one home).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...plan.model import Plan
from ...plan.moe import expert_params, is_moe_layer, moe_layers_in
from ...plan.parallel import ep_ranks, group_replicas
from ...plan.sizes import tokens_per_microbatch
from ...trace.schema import KIND_BARRIER, PHASE_INDEX
from ..compute.moe_units import MoELayerCost, StageMoE
from ..compute.routing import (
    alltoall_matrix,
    expert_counts,
    experts_time_ns,
    local_tokens,
    owner_of_experts,
    routing_counts,
    side_costs,
)
from .dpsetup import DPSetup, RingRows, sync_rings
from .emit import Emitter, emit_gated
from .etp import emit_etp
from .nccl import NVLINK_BW_EFFICIENCY, RING_BASE_LATENCY_US, RING_STEP_LATENCY_US
from .rings import RankInfo

SIMPLE = 2  # index of the Simple protocol in nccl.PROTOCOLS (p2p runs Simple)


@dataclass(frozen=True)
class Exchange:
    """One all-to-all lowered on ``members`` (global ranks): flows as index arrays."""

    src: np.ndarray  # (F,) member index of each flow's source
    dst: np.ndarray  # (F,) member index of each flow's destination
    nbytes: np.ndarray  # (F,)
    step: np.ndarray  # (F,) 0: first (or only) phase, 1: forwarded by a proxy
    algorithm: str


def lower_alltoall(matrix: np.ndarray, members: list[int], info: RankInfo,
                   method: str) -> Exchange:
    """Flows of an all-to-all whose member i sends ``matrix[i, j]`` bytes to member j."""
    g = len(members)
    server = np.array([int(info.server[r]) for r in members])
    by_server: dict[int, list[int]] = {}
    for j, s in enumerate(server):
        by_server.setdefault(int(s), []).append(j)
    sizes = {len(v) for v in by_server.values()}
    if method != "hierarchical" or len(by_server) < 2 or len(sizes) != 1:
        off = ~np.eye(g, dtype=bool) & (matrix > 0)
        si, di = np.nonzero(off)
        algo = "alltoall:direct" if method == "direct" else "alltoall:hierarchical->direct"
        return Exchange(si, di, matrix[si, di], np.zeros(len(si), dtype=np.int64), algo)
    pos = np.zeros(g, dtype=np.int64)
    for lst in by_server.values():
        for k, j in enumerate(lst):
            pos[j] = k
    first = np.zeros((g, g), dtype=np.int64)  # intra-server flows i -> proxy (or final j)
    second = np.zeros((g, g), dtype=np.int64)  # proxy -> destination on another server
    for i in range(g):
        for j in range(g):
            b = int(matrix[i, j])
            if b <= 0 or i == j:
                continue
            if server[i] == server[j]:
                first[i, j] += b
                continue
            p = by_server[int(server[i])][pos[j]]
            if p != i:
                first[i, p] += b
            second[p, j] += b
    i1, j1 = np.nonzero(first)
    i2, j2 = np.nonzero(second)
    return Exchange(
        np.concatenate([i1, i2]), np.concatenate([j1, j2]),
        np.concatenate([first[i1, j1], second[i2, j2]]),
        np.concatenate([np.zeros(len(i1), np.int64), np.ones(len(i2), np.int64)]),
        "alltoall:hierarchical",
    )


def alltoall_delay_ns(ex: Exchange, members: list[int], info: RankInfo) -> np.ndarray:
    """(G,) NCCL's extra cost per member before its sends (see the module docstring), ns."""
    g = len(members)
    out = np.zeros(g, dtype=np.int64)
    for i in range(g):
        sel = ex.src == i
        if not sel.any():
            continue
        a = members[i]
        peers = [members[int(j)] for j in ex.dst[sel]]
        intra = [info.server[a] == info.server[b] for b in peers]
        link = "nvlink" if all(intra) else "net"
        lat_us = RING_BASE_LATENCY_US[SIMPLE] + RING_STEP_LATENCY_US[link][SIMPLE]
        nv_bytes = float(ex.nbytes[sel][np.array(intra)].sum())
        bw = float(info.scaleup_GBps[a])
        extra = nv_bytes / bw * (1.0 / NVLINK_BW_EFFICIENCY - 1.0) if bw > 0 else 0.0
        out[i] = int(round(lat_us * 1e3 + extra))
    return out


@dataclass(frozen=True)
class GroupRouting:
    """Routing of one expert block (``ep x etp`` ranks of stage ``stage``) per MoE layer.

    Block rank ``i`` is EP position ``i // etp`` of ETP position ``i % etp``
    (:mod:`xsim_adapters.plan.parallel`); with etp 1 the block is the EP group."""

    members: list[int]  # global ranks, block order
    replicas: list[int]
    stage: int
    experts: list[int]  # experts held per EP position
    counts: dict[int, np.ndarray]  # layer -> (ep x etp, E) assignments per block rank
    matrix: dict[int, np.ndarray]  # layer -> (etp, ep, ep) dispatch bytes of each EP group
    etp: int = 1

    def ep_group(self, t: int) -> list[int]:
        """Global ranks of the EP group of ETP position ``t``, in EP order."""
        return self.members[t::self.etp]

    def holder(self, position: int) -> int:
        """First global rank of the ETP group of EP position ``position``."""
        return self.members[position * self.etp]

    def received(self, layer: int) -> np.ndarray:
        """(ep x etp,) token copies each block rank holds after the dispatch (its ETP chunk)."""
        ep = len(self.experts)
        owner = owner_of_experts(self.experts)
        c = self.counts[layer]
        out = np.zeros(ep * self.etp, dtype=np.int64)
        for t in range(self.etp):
            rows = c[t::self.etp]
            for j in range(ep):
                out[j * self.etp + t] = int(rows[:, owner == j].sum())
        return out


class MoEPlanner:
    """Routing, per-stage costs and the all-to-all emission of a plan's MoE layers."""

    def __init__(self, plan: Plan, info: RankInfo) -> None:
        self.plan = plan
        self.info = info
        self.groups: dict[tuple[int, int], GroupRouting] = {}

    def group(self, replica: int, stage: int) -> GroupRouting:
        """The EP group of ``replicas[replica].stages[stage]`` with its routing (cached)."""
        reps = group_replicas(self.plan, replica, stage, "ep")
        key = (reps[0], stage)
        if key not in self.groups:
            self.groups[key] = self._route(reps, stage)
        return self.groups[key]

    def _route(self, reps: list[int], stage: int) -> GroupRouting:
        plan = self.plan
        moe = plan.model.moe
        assert moe is not None
        st = plan.replicas[reps[0]].stages[stage]
        members = ep_ranks(plan, reps[0], stage) if st.ep > 1 else [plan.stage_ranks(st)[0]]
        etp = st.etp if st.ep > 1 else 1
        speeds = []
        for r in members[::etp]:  # one per EP position (its ETP group shares a TP group)
            g, _, _ = plan.rank_info(r)
            dt = plan.device_types[g.type]
            speeds.append(dt.sustained_tflops)
        ex = expert_counts(moe, speeds)
        owner = owner_of_experts(ex)
        # ep 1: one "member" (the TP group) routes all b*s tokens; ep > 1: each its local ones
        tokens = local_tokens(plan, st.tp, st.cp) if st.ep > 1 else (
            tokens_per_microbatch(plan.model, plan.training.micro_batch, st.cp))
        tb = plan.model.hidden * plan.model.dtype_bytes
        counts, matrix = {}, {}
        for layer in range(*st.layers):
            if is_moe_layer(plan.model, layer):
                c = routing_counts(moe, layer, tokens, len(members), plan.seed)
                counts[layer] = c
                matrix[layer] = np.stack([alltoall_matrix(c[t::etp], owner, tb)
                                          for t in range(etp)])
        return GroupRouting(members, reps, stage, ex, counts, matrix, etp)

    def stage_costs(self, replica: int, stage: int) -> StageMoE | None:
        """The MoE layer costs of one stage's local ranks (None: no MoE layer in it)."""
        plan = self.plan
        if plan.model.moe is None:
            return None
        st = plan.replicas[replica].stages[stage]
        gr = self.group(replica, stage)
        if not gr.counts:
            return None
        dev = plan.device_types[plan.group(st.group).type]
        side = side_costs(plan, dev, local_tokens(plan, st.tp, st.cp), 1)
        first_expert = np.concatenate([[0], np.cumsum(gr.experts)])
        if st.ep > 1:  # EP position of each local rank (its ETP group computes its experts)
            offset = gr.replicas.index(replica) * st.tp
            local = [(offset + k) // gr.etp for k in range(st.tp)]
        else:
            local = [0]
        items = []
        for layer, c in gr.counts.items():
            fwd, bwd, fl = [], [], []
            for j in local:
                # every block rank's tokens for EP position j reach its whole ETP group
                load = c[:, first_expert[j]:first_expert[j + 1]].sum(axis=0)
                tp = gr.etp if st.ep > 1 else st.tp
                ns_f, flops = experts_time_ns(plan, dev, load, tp, False)
                ns_b, _ = experts_time_ns(plan, dev, load, tp, True)
                fwd.append(ns_f)
                bwd.append(ns_b)
                fl.append(flops)
            items.append((layer, MoELayerCost(
                side.pre_fwd_ns, side.post_fwd_ns, side.pre_bwd_ns, side.post_bwd_ns,
                side.pre_flops, tuple(fwd), tuple(bwd), tuple(fl))))
        return StageMoE(st.ep, tuple(items))

    # ---- expert gradients -------------------------------------------------------------
    def expert_params_of(self, replica: int, stage: int, local: int) -> int:
        """Routed-expert parameters held by local rank ``local`` of a stage (ep > 1)."""
        plan = self.plan
        st = plan.replicas[replica].stages[stage]
        gr = self.group(replica, stage)
        j = (gr.replicas.index(replica) * st.tp + local) // gr.etp  # its EP position
        return (gr.experts[j] * expert_params(plan.model, gr.etp)
                * moe_layers_in(plan.model, st.layers))

    def edp_setup(self, em: Emitter) -> DPSetup | None:
        """Rings of the expert-data-parallel gradient sync (:class:`.dpsetup.DPSetup`, as the
        dense DP sync's): one ring per (stage, EP position) over that position in every EP
        group; each member is ready after its stage's last compute of the iteration."""
        plan = self.plan
        rep0 = plan.replicas[0]
        g = group_replicas(plan, 0, 0, "ep")
        heads = list(range(0, plan.dp, len(g)))
        if len(heads) < 2:
            return None
        members, grad, param, ready, layers = [], [], [], [], []
        # gradients (all-reduce, reduce-scatter) in the gradient format, as the dense DP sync;
        # ZeRO's all-gather of the updated experts in the model dtype
        grad_bytes = plan.training.grad_reduce_bytes(plan.model.dtype_bytes)
        for i, st in enumerate(rep0.stages):
            groups = [ep_ranks(plan, h, i) for h in heads]
            for p in range(st.ep * st.etp):  # every block position
                r_in, local = divmod(p, st.tp)
                params = self.expert_params_of(r_in, i, local)
                if params * grad_bytes <= 0:
                    continue
                members.append([grp[p] for grp in groups])
                grad.append(params * grad_bytes)
                param.append(params * plan.model.dtype_bytes)
                layers.append(st.layers)
                row = []
                for h in heads:
                    blk, mb = em.last_block(h + r_in, i)
                    row.append(int(blk.last[mb][local]))
                ready.append(row)
        if not members:
            return None
        # the algorithm NCCL's tuner picks and its delay, as for the dense DP sync
        perm, sizes, gsizes, labels, delays, choices = sync_rings(
            em, RingRows(members, grad, param))
        n = len(members)
        return DPSetup(
            members=np.array(members, dtype=np.int64), perm=perm, grad_channel_bytes=sizes,
            param_channel_bytes=gsizes, grad_bytes=np.array(grad, dtype=np.int64),
            param_bytes=np.array(param, dtype=np.int64), delays_ns=delays, choices=choices,
            labels=labels, chunk=np.full(n, -1, dtype=np.int64),
            sync_group=np.full(n, -1, dtype=np.int64),
            layer_start=np.array([lr[0] for lr in layers], dtype=np.int64),
            layer_stop=np.array([lr[1] for lr in layers], dtype=np.int64),
            ready_op=np.array(ready, dtype=np.int64), first_fwd_op=None)

    # ---- emission ------------------------------------------------------------------------
    def emit(self, em: Emitter) -> None:
        """Add the dispatch and combine all-to-alls of every EP group to ``em``'s builder."""
        plan = self.plan
        done: set[tuple[int, int]] = set()
        for r, rep in enumerate(plan.replicas):
            for i, st in enumerate(rep.stages):
                if st.ep <= 1:
                    continue
                gr = self.group(r, i)
                if (gr.replicas[0], i) in done or not gr.matrix:
                    continue
                done.add((gr.replicas[0], i))
                for k in range(len(em.chunks[r][i])):
                    self._emit_chunk(em, gr, k)

    def _mark_ids(self, em: Emitter, gr: GroupRouting, chunk: int, key: tuple) -> np.ndarray | None:
        """(m, G) global op ids of mark ``key`` on every member, or None if no block has it."""
        cols = []
        for r in gr.replicas:
            ops = em.stage_ops[(r, gr.stage, chunk)]
            hit = next((o.marks[key] for o in ops if key in o.marks), None)
            if hit is None:
                return None
            cols.append(hit)
        return np.concatenate(cols, axis=1)

    def _emit_chunk(self, em: Emitter, gr: GroupRouting, chunk: int) -> None:
        for layer in gr.matrix:
            for phase in ("fwd", "recompute", "bwd"):
                pre = self._mark_ids(em, gr, chunk, ("moe", layer, "pre", phase))
                if pre is None:
                    continue
                exp = self._mark_ids(em, gr, chunk, ("moe", layer, "experts", phase))
                post = self._mark_ids(em, gr, chunk, ("moe", layer, "post", phase))
                assert exp is not None and post is not None
                # forward: dispatch pre -> experts, combine experts -> post; backward the
                # gradients go from the token owner (post) to the experts and back to pre
                into, out = (post, pre) if phase == "bwd" else (pre, post)
                self._to_experts(em, gr, layer, into, exp)
                self._from_experts(em, gr, layer, exp, out)

    def _barrier(self, em: Emitter, gr: GroupRouting, layer: int, m: int) -> np.ndarray:
        """(m, G) zero-time joins, one per block rank and micro-batch."""
        ranks = np.asarray(gr.members, dtype=np.int64)
        g = len(ranks)
        return em.tb.add_ops(
            m * g, kind=KIND_BARRIER, rank=np.tile(ranks, m), phase=PHASE_INDEX["ep"],
            replica=np.tile(em.rank_replica[ranks], m), stage=gr.stage,
            microbatch=np.repeat(np.arange(m), g), layer_start=layer, layer_stop=layer + 1,
        ).reshape(m, g)

    def _etp_rings(self, em: Emitter, gr: GroupRouting, layer: int, kind: str, start: np.ndarray,
                   end: np.ndarray) -> None:
        """The all-gather-v or reduce-scatter-v of every ETP group (:mod:`.etp`)."""
        tb_bytes = self.plan.model.hidden * self.plan.model.dtype_bytes
        chunks = gr.received(layer) * tb_bytes
        e = gr.etp
        for j in range(len(gr.experts)):
            grp = slice(j * e, (j + 1) * e)
            emit_etp(em, gr.members[grp], chunks[grp], kind, layer, gr.stage, start[:, grp],
                     end[:, grp])

    def _to_experts(self, em: Emitter, gr: GroupRouting, layer: int, src: np.ndarray,
                    exp: np.ndarray) -> None:
        """Dispatch (or its backward's combine gradient): all-to-all over every EP group, then
        with etp > 1 the all-gather-v of every ETP group."""
        method = self.plan.model.moe.alltoall  # type: ignore[union-attr]
        mats, e = gr.matrix[layer], gr.etp
        if e == 1:
            self._exchange(em, gr, gr.members, layer, mats[0], src, exp, method)
            return
        joined = self._barrier(em, gr, layer, src.shape[0])
        for t in range(e):
            self._exchange(em, gr, gr.ep_group(t), layer, mats[t], src[:, t::e],
                           joined[:, t::e], method)
        self._etp_rings(em, gr, layer, "all_gather", joined, exp)

    def _from_experts(self, em: Emitter, gr: GroupRouting, layer: int, exp: np.ndarray,
                      dst: np.ndarray) -> None:
        """Combine (or the dispatch gradient): with etp > 1 the reduce-scatter-v of every ETP
        group first, then the all-to-all (transposed matrix) over every EP group."""
        method = self.plan.model.moe.alltoall  # type: ignore[union-attr]
        mats, e = gr.matrix[layer], gr.etp
        if e == 1:
            self._exchange(em, gr, gr.members, layer, np.ascontiguousarray(mats[0].T), exp, dst,
                           method)
            return
        joined = self._barrier(em, gr, layer, exp.shape[0])
        self._etp_rings(em, gr, layer, "reduce_scatter", exp, joined)
        for t in range(e):
            self._exchange(em, gr, gr.ep_group(t), layer, np.ascontiguousarray(mats[t].T),
                           joined[:, t::e], dst[:, t::e], method)

    def _exchange(self, em: Emitter, gr: GroupRouting, members: list[int], layer: int,
                  matrix: np.ndarray, src_ops: np.ndarray, dst_ops: np.ndarray,
                  method: str) -> None:
        tb = em.tb
        ex = lower_alltoall(matrix, members, self.info, method)
        m = src_ops.shape[0]
        if len(ex.src) == 0:  # everything stayed local: the experts wait on the own tokens
            tb.add_edges(src_ops, dst_ops)
            return
        ranks = np.asarray(members, dtype=np.int64)
        phase = PHASE_INDEX["ep"]
        nf = len(ex.src)
        first = ex.step == 0
        lat = np.zeros(nf, dtype=np.int64)
        senders = np.unique(ex.src)
        if self.plan.collectives.nccl_cost:
            # NCCL's cost per sender: a start latency on its first-step flows; a hierarchical
            # proxy (it forwards in a second step, gated on its own delay) keeps a timed
            # barrier (workload/comm/latency.py)
            delay = alltoall_delay_ns(ex, members, self.info)
            proxy = np.isin(senders, ex.src[~first])
            folded = senders[~proxy & (delay[senders] > 0)]
            on = first & np.isin(ex.src, folded)
            lat[on] = delay[ex.src[on]]
            senders = senders[proxy]
        tags = dict(phase=phase, stage=gr.stage, layer_start=layer, layer_stop=layer + 1)
        gated = self.plan.collectives.nccl_cost and len(senders)
        coll, ids, dl = emit_gated(
            tb,
            dict(n=m, kind="all_to_all", phase=phase, bytes=int(matrix.sum() - np.trace(matrix)),
                 ranks=",".join(map(str, members)), algorithm=ex.algorithm, channels=1,
                 layer_start=layer, layer_stop=layer + 1),
            dict(n=m * nf, rank=np.tile(ranks[ex.src], m), dst=np.tile(ranks[ex.dst], m),
                 bytes=np.tile(ex.nbytes, m), duration_ns=np.tile(lat, m),
                 replica=np.tile(em.rank_replica[ranks[ex.src]], m),
                 microbatch=np.repeat(np.arange(m), nf), collective=np.repeat(np.arange(m), nf),
                 step=np.tile(ex.step, m), **tags),
            dict(n=m * len(senders), rank=np.tile(ranks[senders], m),
                 duration_ns=np.tile(delay[senders], m),
                 replica=np.tile(em.rank_replica[ranks[senders]], m),
                 microbatch=np.repeat(np.arange(m), len(senders)),
                 collective=np.repeat(np.arange(m), len(senders)), **tags) if gated else None)
        ids = ids.reshape(m, nf)
        start = src_ops
        if dl is not None:
            dl = dl.reshape(m, len(senders))
            tb.add_edges(src_ops[:, senders], dl)
            start = np.full_like(src_ops, -1)
            start[:, senders] = dl
        for f in np.nonzero(first)[0]:
            s = int(ex.src[f])
            pred = start[:, s] if start[0, s] >= 0 else src_ops[:, s]
            tb.add_edges(pred, ids[:, f])
        # Hierarchical: a proxy forwards once everything sent to it has arrived, in a second
        # NCCL call (its own p2p latency over the network, with collectives.nccl_cost).
        for p in np.unique(ex.src[~first]):
            p = int(p)
            gate = start[:, p] if start[0, p] >= 0 else src_ops[:, p]
            into = np.nonzero(first & (ex.dst == p))[0]
            if self.plan.collectives.nccl_cost:
                fwd_us = RING_BASE_LATENCY_US[SIMPLE] + RING_STEP_LATENCY_US["net"][SIMPLE]
                b2 = tb.add_ops(m, kind=KIND_BARRIER, rank=int(ranks[p]),
                                duration_ns=int(round(fwd_us * 1e3)), phase=phase,
                                replica=int(em.rank_replica[ranks[p]]), stage=gr.stage,
                                microbatch=np.arange(m), layer_start=layer,
                                layer_stop=layer + 1, collective=coll)
                tb.add_edges(gate, b2)
                for k in into:
                    tb.add_edges(ids[:, k], b2)
                gate = b2
            for f in np.nonzero(~first & (ex.src == p))[0]:
                tb.add_edges(gate, ids[:, f])
                if not self.plan.collectives.nccl_cost:
                    for k in into:
                        tb.add_edges(ids[:, k], ids[:, f])
        for q in range(nf):  # a member's kernel ends after its receives and its sends
            tb.add_edges(ids[:, q], dst_ops[:, int(ex.dst[q])])
            tb.add_edges(ids[:, q], dst_ops[:, int(ex.src[q])])


def expert_load(plan: Plan) -> pd.DataFrame:
    """Tokens per expert per MoE layer and micro-batch, per EP group (empty for dense plans):
    the routing :class:`MoEPlanner` lowers, one row per (EP group, stage, layer, expert) with its
    share of the layer's tokens, the EP rank holding it, that rank's tokens and its load against
    the group mean (``rank_load_factor``: the straggler factor of the expert compute)."""
    cols = ["replica_group", "stage", "layer", "expert", "rank", "tokens", "share",
            "rank_tokens", "rank_load_factor"]
    if plan.model.moe is None:
        return pd.DataFrame(columns=cols)
    planner = MoEPlanner(plan, RankInfo(plan))
    rows = []
    for r, rep in enumerate(plan.replicas):
        for i in range(rep.pp):
            gr = planner.group(r, i)
            if gr.replicas[0] != r:
                continue
            owner = np.repeat(np.arange(len(gr.experts)), gr.experts)
            for layer, counts in gr.counts.items():
                tokens = counts.sum(axis=0)
                per_rank = np.bincount(owner, weights=tokens, minlength=len(gr.experts))
                mean = per_rank.mean() if per_rank.mean() > 0 else 1.0
                for e, t in enumerate(tokens):
                    j = int(owner[e])
                    rows.append((r, i, layer, e, gr.holder(j), int(t), t / tokens.sum(),
                                 int(per_rank[j]), per_rank[j] / mean))
    return pd.DataFrame(rows, columns=cols)
