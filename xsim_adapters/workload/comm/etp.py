"""Expert tensor parallelism: the all-gather-v and reduce-scatter-v around the experts.

With ``etp`` > 1 (Megatron-Core's ``expert_tensor_parallel_size``) each expert's weights are
split ``etp`` ways over an ETP group (``etp`` consecutive ranks of one TP group, one EP
position). Megatron-Core's all-to-all token dispatcher then runs, per MoE layer:

- forward: dispatch all-to-all over the EP group, then an **all-gather-v** over the ETP group
  (``gather_from_sequence_parallel_region`` with the received token counts as split sizes), so
  every ETP rank holds all tokens routed to its experts; the experts run at ``f_e / etp``
  width; a **reduce-scatter-v** sums the partial outputs and returns each rank its own tokens
  (``reduce_scatter_to_sequence_parallel_region``); the combine all-to-all;
- backward: the same pair with the roles swapped (the reduce-scatter's gradient is an
  all-gather and the other way round).

Both are lowered as rings over the ETP group in rank order: in step ``j`` (0..etp-2) ETP rank
``q`` sends to ``q + 1`` the chunk of rank ``q - j`` (all-gather) or the partial sum of the
chunk of rank ``q - j - 1`` (reduce-scatter), a chunk being that rank's received tokens x
hidden x dtype bytes; a step's send waits for the step before's receive. With
``collectives.nccl_cost`` each member first waits a timed barrier of NCCL's ring cost for the
whole gathered size (:func:`.rings.ring_delay_ns`).
"""

from __future__ import annotations

import numpy as np

from ...trace.schema import PHASE_INDEX
from .emit import Emitter, emit_gated
from .rings import ring_delay_ns


def ring_v(chunks: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
    """Flows of a ring ``kind`` (all_gather or reduce_scatter) whose member q owns ``chunks[q]``
    bytes: (src, dst, nbytes, step) member indices, step-major."""
    n = len(chunks)
    src, dst, nb, st = [], [], [], []
    for j in range(n - 1):
        for q in range(n):
            owner = (q - j) % n if kind == "all_gather" else (q - j - 1) % n
            src.append(q)
            dst.append((q + 1) % n)
            nb.append(int(chunks[owner]))
            st.append(j)
    return (np.array(src, np.int64), np.array(dst, np.int64), np.array(nb, np.int64),
            np.array(st, np.int64))


def emit_etp(em: Emitter, ranks: list[int], chunks: np.ndarray, kind: str, layer: int,
             stage: int, start: np.ndarray, end: np.ndarray) -> None:
    """Add one ETP ring ``kind`` per micro-batch over ``ranks`` (global, ring order) whose
    member q owns ``chunks[q]`` bytes. ``start`` (m, n): the op after which member q may
    send; ``end`` (m, n): the op that needs member q's result."""
    tb = em.tb
    m, n = start.shape
    if n < 2 or int(chunks.sum()) == 0:
        tb.add_edges(start, end)
        return
    src, dst, nbytes, step = ring_v(chunks, kind)
    ranks_a = np.asarray(ranks, dtype=np.int64)
    nf = len(src)
    tags = dict(phase=PHASE_INDEX["ep"], stage=stage, layer_start=layer, layer_stop=layer + 1)
    gates = None
    if em.plan.collectives.nccl_cost:  # every member's ring cost stays a timed barrier
        delay = ring_delay_ns(em.info, kind, [ranks], [int(chunks.sum())])
        gates = dict(n=m * n, rank=np.tile(ranks_a, m), duration_ns=delay,
                     replica=np.tile(em.rank_replica[ranks_a], m),
                     microbatch=np.repeat(np.arange(m), n), collective=np.repeat(np.arange(m), n),
                     **tags)
    _, ids, dl = emit_gated(
        tb,
        dict(n=m, kind=kind, phase=tags["phase"], bytes=int(chunks.sum()),
             ranks=",".join(map(str, ranks)), algorithm=f"etp_ring_v(etp={n})", channels=1,
             layer_start=layer, layer_stop=layer + 1),
        dict(n=m * nf, rank=np.tile(ranks_a[src], m), dst=np.tile(ranks_a[dst], m),
             bytes=np.tile(nbytes, m), replica=np.tile(em.rank_replica[ranks_a[src]], m),
             microbatch=np.repeat(np.arange(m), nf), collective=np.repeat(np.arange(m), nf),
             step=np.tile(step, m), **tags),
        gates)
    ids = ids.reshape(m, nf)
    gate = start
    if dl is not None:
        dl = dl.reshape(m, n)
        tb.add_edges(start, dl)
        gate = dl
    for f in range(nf):
        q, j = int(src[f]), int(step[f])
        tb.add_edges(gate[:, q], ids[:, f])
        if j > 0:  # forward what arrived in the step before
            prev = (j - 1) * n + (q - 1) % n
            tb.add_edges(ids[:, prev], ids[:, f])
        # a member's result needs everything it receives and its own sends done
        tb.add_edges(ids[:, f], end[:, int(dst[f])])
        tb.add_edges(ids[:, f], end[:, q])


__all__ = ["emit_etp", "ring_v"]
