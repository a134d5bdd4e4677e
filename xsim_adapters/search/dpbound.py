"""The part of the data-parallel sync no schedule can hide, as floors for the search bound.

The generator's DP sync (:mod:`..workload.comm.dpsync`, ``dp_setup`` in
:mod:`..workload.dp`): one ring per (bucket, chunk) over one rank of every replica; a
member starts its ring when its bucket's gradients are complete (with ``overlap.dp_grad_reduce``
the unit of the bucket's first layer in the rank's last gradient pass of that chunk, else the
rank's last compute op), behind the ring's NCCL delay barrier; every flow a member sends on a
ring channel precedes its last send there, and the member's optimizer waits, through its
barrier, for its tails on every ring. With ZeRO the sync is a reduce-scatter and the updated
parameters come back by an all-gather on the same rings: at the start of the iteration, ring
after ring in layer order on each rank, ahead of the first forward unit that needs them
(``overlap.param_gather``), or after the optimizer step.

Floors used (proofs in docs/search.md#bound):

- **tail**: for a server X, every DP flow that must leave X (:meth:`.comm.Fabric.
  crossing_bytes`) starts after its ring's gate opens (for a ring, after its sender's
  readiness; for a templated algorithm, after the earliest member's); for any time t, the
  flows of the rings whose members are all ready at or after t must cross X's cut after t, so
  the last of them ends at least t + bytes / cut. For ring-lowered collectives its sender's
  optimizer then runs. Rings inside one server bound each member by its own sends and links.
- **ZeRO all-gather first** (``param_gather``): each member's sends on a ring start after its
  previous ring's tails; the forward unit waiting for a bucket cannot start before the rank's
  rings up to that bucket are done, which floors the end of the first forward block.
- **ZeRO all-gather last** (no ``param_gather``): the all-gather bytes into a server cross its
  cut after the earliest optimizer step of the ring's members.

The ring structure (members, servers, algorithms, bytes) depends only on the candidate's
replicas, so it is computed once per structure (:class:`SyncShape`) and reused by every
candidate with other training choices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan.model import Plan
from ..workload.comm.dpsync import Bucket, buckets, chunk_rings, sweep_segments
from ..workload.comm.selection import Choice
from ..workload.schedule import BWD, FWD, WGRAD, replica_chunks
from .comm import CUT_SLACK_BYTES, Fabric, ring_steps
from .pipeline import StageTimes
from .space import Candidate

if TYPE_CHECKING:
    from .bound import Analyzer, StageCost


@dataclass
class BucketSync:
    """What the rings of one bucket must move: ``cut[x]`` = (owner indices on server x, bytes
    out of x of ring-lowered rings, bytes out of x of templated ones, bytes into x of the
    all-gather after the step); ``own[j]``: bytes owner j's rank sends on rings inside one
    server (ring-lowered); ``delay_ns``: the least NCCL delay of its templated rings."""

    bucket: Bucket
    owners: tuple[tuple[int, int], ...]
    chunk: tuple[int, ...]  # per owner: its model chunk holding the bucket
    cut: dict[int, tuple[tuple[int, ...], int, int, int]] = field(default_factory=dict)
    own: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # owner -> (rank, B)
    delay_ns: float = 0.0


@dataclass
class SyncShape:
    """The DP rings of one candidate structure (``kind``: the sync collective)."""

    kind: str
    buckets: list[BucketSync]
    # ZeRO all-gather before the forward: per (replica, stage, bucket index), the least over
    # the stage's ranks of the time (ns) their all-gathers up to that bucket need
    gather: dict[tuple[int, int, int], float]


def _relabel(xs: Sequence[int]) -> tuple[int, ...]:
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(x, len(seen)) for x in xs)


def sync_shape(an: Analyzer, plan: Plan, zero: bool) -> SyncShape:
    """The DP rings of ``plan`` (a candidate plan) as :class:`SyncShape`.

    A bucket's rings are the lcm(tp) chunks of its segment, each over the same rank of every
    owner stage, so their members, servers and algorithms depend on the (segment, chunk) and
    the chunk's bytes only: computed once per (segment, bytes)."""
    fab = an.fabric
    info = fab.info
    kind = "reduce_scatter" if zero else "all_reduce"
    segs = sweep_segments(plan)
    bks = buckets(plan, segs)
    to_full = np.concatenate([fab.offset[g.name] + np.arange(g.num_devices)
                              for g in plan.device_groups]).astype(np.int64)
    rings = chunk_rings(plan, segs, bks)
    members_of: dict[tuple[int, int], np.ndarray] = {}  # (segment, chunk) -> fabric ranks
    for cr in rings:
        key = (bks[cr.bucket].segment, cr.chunk)
        if key not in members_of:
            members_of[key] = to_full[list(cr.members)]
    chunk_of: dict[tuple[int, int, int], int] = {}
    for bk in bks:
        for r, s in segs[bk.segment].owners:
            if (r, s, bk.start) not in chunk_of:
                chunks = replica_chunks(plan, r)[s]
                chunk_of[(r, s, bk.start)] = next(
                    (c for c, (a, b) in enumerate(chunks) if a <= bk.start < b), 0)

    # (segment, chunk, bytes) -> what one ring moves: (sync ring-lowered?, its cut entries,
    # own sends inside one server, templated delay, all-gather sends per member, ag delay)
    ring_cache: dict[tuple[int, int, int], tuple[Any, ...]] = {}

    def ring_facts(seg: int, chunk: int, nbytes: int) -> tuple[Any, ...]:
        key = (seg, chunk, nbytes)
        hit = ring_cache.get(key)
        if hit is not None:
            return hit
        members = members_of[(seg, chunk)]
        n = len(members)
        servers = info.server[members]
        ch = fab.dp_choice(members, kind, nbytes)
        ring = ch.algorithm == "ring"
        delay = float("inf") if ring else float(max(0, ch.delay_ns))
        ag = fab.dp_choice(members, "all_gather", nbytes) if zero else None
        uniq = sorted(set(servers.tolist()))
        cut: list[tuple[int, tuple[int, ...], int, int]] = []
        own = 0
        if len(uniq) == 1:
            if ring:
                own = max(0, ring_steps(kind, n) * (nbytes // n - fab.max_channels)
                          - CUT_SLACK_BYTES)
        else:
            for x in uniq:
                idx = tuple(np.flatnonzero(servers == x).tolist())
                b = fab.crossing_bytes(kind, ring, n, len(idx), nbytes, entering=False)
                into = 0 if ag is None else fab.crossing_bytes(
                    "all_gather", ag.algorithm == "ring", n, len(idx), nbytes, entering=True)
                cut.append((x, idx, b, into))
        ag_cost = np.zeros(n) if ag is None else _gather_cost(fab, members, servers, ag, nbytes)
        hit = (ring, cut, own, delay, ag_cost)
        ring_cache[key] = hit
        return hit

    out: dict[int, BucketSync] = {}
    done: dict[int, float] = {}  # rank -> its all-gathers so far (param_gather), ns
    gather: dict[tuple[int, int, int], dict[int, float]] = {}
    for cr in rings:
        bk = bks[cr.bucket]
        owners = segs[bk.segment].owners
        bs = out.get(cr.bucket)
        if bs is None:
            bs = BucketSync(bk, owners, tuple(chunk_of[(r, s, bk.start)] for r, s in owners),
                            delay_ns=float("inf"))
            out[cr.bucket] = bs
        ring, cut, own, delay, ag_cost = ring_facts(bk.segment, cr.chunk, cr.nbytes)
        bs.delay_ns = min(bs.delay_ns, delay)
        members = members_of[(bk.segment, cr.chunk)].tolist()
        if own:
            for j, y in enumerate(members):
                bs.own.setdefault(j, []).append((y, own))
        for x, idx, b, into in cut:
            _, br, bo, bi = bs.cut.get(x, (idx, 0, 0, 0))
            bs.cut[x] = (idx, br + (b if ring else 0), bo + (0 if ring else b), bi + into)
        if zero:
            for j, y in enumerate(members):
                done[y] = done.get(y, 0.0) + float(ag_cost[j])
                per = gather.setdefault((*owners[j], cr.bucket), {})
                per[y] = max(per.get(y, 0.0), done[y])
    for bs in out.values():
        if bs.delay_ns == float("inf"):
            bs.delay_ns = 0.0
    return SyncShape(kind, [out[i] for i in sorted(out)],
                     {k: min(v.values()) for k, v in gather.items()})


def _gather_cost(fab: Fabric, members: np.ndarray, servers: np.ndarray, ag: Choice,
                 nbytes: int) -> np.ndarray:
    """Per member of a ZeRO all-gather of ``nbytes`` (choice ``ag``): its sends over its own
    links, in ns (the start delay of a templated algorithm plus its bytes beyond the cut slack
    at the member's inter-server rate, or its whole out rate when alone on its server)."""
    n = len(members)
    if ag.algorithm == "ring":
        sent = np.full(n, ring_steps("all_gather", n) * (nbytes // n - fab.max_channels))
        ag_delay = 0.0
    else:
        sent = fab.template_sent(ag, "all_gather", nbytes)
        ag_delay = float(max(0, ag.delay_ns))
    cost = np.zeros(n)
    for j, y in enumerate(members.tolist()):
        here = int((servers == servers[j]).sum())
        cp = fab.caps[y]
        cap = (cp.inter_out if here == 1 else cp.all_out) or cp.all_out
        cost[j] = ag_delay + max(0, int(sent[j]) - CUT_SLACK_BYTES) / cap
    return cost


Costs = dict[tuple[int, int, int], "StageCost"]  # (replica, stage, chunk) -> its blocks


def gather_floors(costs: Costs, c: Candidate, plan: Plan, shape: SyncShape | None
                  ) -> dict[int, list[dict[int, float]]]:
    """ZeRO with ``overlap.param_gather``: per replica, per stage, per chunk, a floor (ns) on
    the end of its first forward block (micro-batch 0): the all-gathers a unit waits for,
    then the rest of the block. Empty without ZeRO, param_gather or data parallelism."""
    # ZeRO-3 (FSDP) gathers per unit and pass instead (workload/fsdp.py): no floor claimed
    if shape is None or not (c.choice.zero_stage in (1, 2)
                             and plan.training.overlap.param_gather):
        return {}
    out: dict[int, list[dict[int, float]]] = {}
    for bi, bs in enumerate(shape.buckets):
        bk = bs.bucket
        fmark = ("fwd", "embedding" if bk.has_embedding else bk.start)
        for (r, s), k in zip(bs.owners, bs.chunk, strict=True):
            t = shape.gather.get((r, s, bi))
            if t is None:
                continue
            blk = costs[(r, s, k)].blocks[FWD]
            begin = blk.marks.get(fmark, (blk.total_ns, blk.total_ns))[0]
            per = out.setdefault(r, [{} for _ in plan.replicas[r].stages])[s]
            per[k] = max(per.get(k, 0.0), t + blk.total_ns - begin)
    return out


def _threshold(items: Sequence[tuple[float, float, bool, float]], cap: float) -> float:
    """max over t of t + (bytes of the items ready at or after t) / cap, over all items, and
    with the least optimizer step of the ring-lowered ones added (items: ready ns, bytes,
    ring-lowered, optimizer ns; ``cap`` in bytes per ns)."""
    if cap <= 0:
        return 0.0
    best = 0.0
    total = ring_total = 0.0
    least_opt = float("inf")
    for ready, nbytes, ring, opt in sorted(items, key=lambda x: -x[0]):
        if nbytes <= 0:
            continue
        total += nbytes
        best = max(best, ready + total / cap)
        if ring:
            ring_total += nbytes
            least_opt = min(least_opt, opt)
            best = max(best, ready + ring_total / cap + least_opt)
    return best


def dp_tail_ns(an: Analyzer, costs: Costs, c: Candidate, plan: Plan,
               times: list[list[StageTimes]], shape: SyncShape | None) -> float:
    """The floor (ns) the DP sync (and, with ZeRO and no ``param_gather``, the all-gather
    after the optimizer) puts on the iteration's end; 0 without data parallelism."""
    if shape is None:
        return 0.0
    ch = c.choice
    fab = an.fabric
    overlap = plan.training.overlap.dp_grad_reduce
    grad = WGRAD if ch.schedule == "zb_h1" else BWD
    opt = {(r, s): float(an.optimizer_ns(ch, st.group, st.tp, st.layers, plan.dp))
           for r, rep in enumerate(plan.replicas) for s, st in enumerate(rep.stages)}
    last: dict[tuple[int, int], float] = {}
    for r, rep in enumerate(plan.replicas):
        for s in range(rep.pp):
            tm = times[r][s]
            kd, k, _ = (int(x) for x in tm.order[-1])
            blk = costs[(r, s, k)].blocks[kd]
            last[(r, s)] = float(tm.start[-1]) + blk.compute_end_ns

    def ready_ns(r: int, s: int, k: int, bk: Bucket) -> float:
        if not overlap:
            return last[(r, s)]
        tm = times[r][s]
        row = tm.last_row(grad, k)
        blk = costs[(r, s, k)].blocks[grad]
        mark = "embedding" if bk.has_embedding else bk.start
        return float(tm.start[row]) + blk.marks.get(mark, (0, 0))[1]

    # ZeRO-3 gathers nothing after the optimizer step (workload/fsdp.py)
    gather_after = ch.zero_stage in (1, 2) and not plan.training.overlap.param_gather
    opt_end = {k: times[k[0]][k[1]].last_end + v for k, v in opt.items()}
    cut: dict[int, list[tuple[float, float, bool, float]]] = {}
    cut_in: dict[int, list[tuple[float, float, bool, float]]] = {}
    own: dict[int, list[tuple[float, float, bool, float]]] = {}
    for bs in shape.buckets:
        rd = [ready_ns(r, s, k, bs.bucket) for (r, s), k in zip(bs.owners, bs.chunk,
                                                                 strict=True)]
        earliest = min(rd) + bs.delay_ns
        first_opt = min(opt_end[o] for o in bs.owners)
        for x, (idx, b_ring, b_other, b_in) in bs.cut.items():
            cut.setdefault(x, []).append((min(rd[i] for i in idx), float(b_ring), True,
                                          min(opt[bs.owners[i]] for i in idx)))
            cut[x].append((earliest, float(b_other), False, 0.0))
            if gather_after:
                cut_in.setdefault(x, []).append((first_opt, float(b_in), False, 0.0))
        for j, sends in bs.own.items():
            for y, sent in sends:
                own.setdefault(y, []).append((rd[j], float(sent), True, opt[bs.owners[j]]))
    best = 0.0
    for x, items in cut.items():
        best = max(best, _threshold(items, float(fab.cut_out[x])))
    for x, items in cut_in.items():
        best = max(best, _threshold(items, float(fab.cut_in[x])))
    for y, items in own.items():
        cp = fab.caps[y]
        best = max(best, _threshold(items, cp.intra_out or cp.all_out))
    return best


__all__ = ["BucketSync", "SyncShape", "dp_tail_ns", "gather_floors", "sync_shape"]
