"""Data-parallel gradient sync, layer-aware: the sweep line over every replica's stage boundaries.

Replicas may split the layers differently. :func:`sweep_segments` collects every stage boundary
of every replica (with ``interleaved`` every model chunk's, see
:func:`.schedule.replica_chunks`), sorts them and sweeps: each maximal layer segment whose
owning stage is the same in every replica is one *sync group*. A segment is cut into buckets of
``collectives.dp_bucket_layers`` layers (the default 1 is one bucket per layer: a Llama layer is
tens of MB to GB of gradients, already at or above the 25-40 MB buckets of PyTorch DDP /
Megatron, and per-layer buckets let the sync of late layers overlap the backward of early
ones). A bucket carries its layers' gradient bytes (+ the embedding in the bucket starting at
layer 0, + the head in the bucket ending at ``model.layers``) in the gradient format
(``training.grad_reduce_bytes``: fp32 for bf16 parameters, as Megatron-LM reduces them) and,
for ZeRO's all-gather of the updated parameters, its parameter bytes in the model dtype.

Multi-ring: with the owners' TP degrees t_r, a bucket is cut into L = lcm(t_r) equal chunks
(integer cut points); chunk c is held in replica r by stage rank c * t_r // L, and all-reduced
on its own ring over those ranks (one per replica), ring order per ``collectives.ring_order``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...plan.model import Plan
from ...plan.parallel import dp_synced_params
from ..compute.costs import embedding_params, head_params
from ..schedule import replica_chunks


@dataclass(frozen=True)
class Segment:
    """Layers [start, stop) owned by the same stage in every replica: one DP sync group."""

    start: int
    stop: int
    owners: tuple[tuple[int, int], ...]  # (replica, stage index), one per replica


def sweep_segments(plan: Plan) -> list[Segment]:
    """The sync groups of ``plan``: maximal layer segments with one owning stage per replica."""
    bounds = {0, plan.model.layers}
    chunks = [replica_chunks(plan, r) for r in range(plan.dp)]
    for rep_chunks in chunks:
        for stage_chunks in rep_chunks:
            for rng in stage_chunks:
                bounds.update(rng)
    points = sorted(bounds)
    segs: list[Segment] = []
    for lo, hi in zip(points[:-1], points[1:], strict=True):
        owners = tuple((r, _owner(chunks[r], r, lo)) for r in range(plan.dp))
        if segs and segs[-1].owners == owners and segs[-1].stop == lo:
            segs[-1] = Segment(segs[-1].start, hi, owners)  # same owners: extend (maximal)
        else:
            segs.append(Segment(lo, hi, owners))
    return segs


def _owner(chunks: list[list[tuple[int, int]]], replica: int, layer: int) -> int:
    for i, stage_chunks in enumerate(chunks):
        if any(a <= layer < b for a, b in stage_chunks):
            return i
    raise ValueError(f"replicas[{replica}]: no stage holds layer {layer}")


@dataclass(frozen=True)
class Bucket:
    """Layers [start, stop) of sync group ``segment``, synchronized together."""

    segment: int
    start: int
    stop: int
    nbytes: int  # gradient bytes of the whole bucket (all TP shards)
    has_embedding: bool
    has_head: bool
    param_nbytes: int = 0  # parameter bytes of the bucket (model dtype): ZeRO's all-gather


def buckets(plan: Plan, segments: list[Segment]) -> list[Bucket]:
    """Cut every segment into buckets of ``collectives.dp_bucket_layers`` layers."""
    model = plan.model
    per = max(1, plan.collectives.dp_bucket_layers)
    grad_bytes = plan.training.grad_reduce_bytes(model.dtype_bytes)
    out = []
    for si, seg in enumerate(segments):
        for lo in range(seg.start, seg.stop, per):
            hi = min(lo + per, seg.stop)
            emb, head = lo == 0, hi == model.layers
            params = dp_synced_params(plan, (lo, hi))
            params += embedding_params(model) if emb else 0
            params += head_params(model) if head else 0
            out.append(Bucket(si, lo, hi, params * grad_bytes, emb, head,
                              params * model.dtype_bytes))
    return out


@dataclass(frozen=True)
class ChunkRing:
    """One all-reduce ring of a bucket: chunk ``chunk`` of ``num_chunks``, over ``members``."""

    bucket: int
    chunk: int
    num_chunks: int
    nbytes: int  # gradient bytes of this chunk
    members: tuple[int, ...]  # global ranks, one per replica, in replica order
    member_local: tuple[int, ...]  # TP index of each member within its stage
    param_nbytes: int = 0  # parameter bytes of this chunk (ZeRO's all-gather)


def chunk_rings(plan: Plan, segments: list[Segment], bucket_list: list[Bucket]) -> list[ChunkRing]:
    """Every (bucket, chunk) ring of the DP sync."""
    out = []
    for bi, bk in enumerate(bucket_list):
        seg = segments[bk.segment]
        stages = [plan.replicas[r].stages[s] for r, s in seg.owners]
        big_l = math.lcm(*(st.tp for st in stages))
        cuts = [bk.nbytes * c // big_l for c in range(big_l + 1)]
        pcuts = [bk.param_nbytes * c // big_l for c in range(big_l + 1)]
        for c in range(big_l):
            local = tuple(c * st.tp // big_l for st in stages)
            members = tuple(plan.stage_ranks(st)[k] for st, k in zip(stages, local, strict=True))
            out.append(ChunkRing(bi, c, big_l, cuts[c + 1] - cuts[c], members, local,
                                 pcuts[c + 1] - pcuts[c]))
    return out
