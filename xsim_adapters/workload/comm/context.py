"""Context parallelism: ring attention costs, marks and the K/V exchange around the CP ring.

With ``cp`` > 1 (Megatron-Core's context parallelism, Transformer Engine's P2P ring attention)
each of the ``cp`` ranks of a CP group holds ``s/cp`` tokens of every sequence: with causal load
balancing the sequence is cut into ``2 cp`` chunks and rank ``i`` holds chunks ``i`` and
``2cp - 1 - i``, so every rank does the same attention work. Per layer and micro-batch:

- compute: everything on the local ``s/cp`` tokens (QKV, out-projection, MLP, norms: the model
  evaluated at ``seq_len / cp``), plus ``cp - 1`` more attention-core steps, each the core of
  the local queries against one received K/V chunk (the same kernel cost as the local core:
  the load balancing makes the steps equal);
- communication: ``cp - 1`` ring steps; in step ``j`` every rank sends the K/V chunk it holds
  (its own in step 1, the one it received in step ``j - 1`` after that) to the next rank of the
  ring, ``2 * b * (s/cp) * kv_heads_per_tp_rank * head_dim * dtype`` bytes (K and V). Step
  ``j``'s core waits for step ``j``'s send/receive pair (both requests, as Transformer Engine
  waits on them), and so does the send that forwards the chunk; step ``j + 1``'s send overlaps
  step ``j``'s core. Backward sends K/V and the partial dK/dV: twice the bytes per step
  (Transformer Engine's backward ring).
  Each step pays NCCL's p2p latency (Simple base + one step of the link type) as a timed
  barrier before the send.

CP ranks hold the same weights; their gradients are reduced with the DP sync (which spans
every replica). Memory: activations of ``s/cp`` tokens (:mod:`xsim_adapters.feasibility.memory`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...plan.attention import attention_dims
from ...plan.model import DeviceType, ModelSpec, Plan, TrainingSpec
from ...plan.sizes import tokens_per_microbatch
from ...trace.schema import PHASE_INDEX
from ..compute.kernels import _attention_core, make_ctx, unit_seconds
from ..compute.passes import attention_core_flops
from .emit import Emitter, emit_gated
from .nccl import RING_BASE_LATENCY_US, RING_STEP_LATENCY_US
from .rings import RankInfo

SIMPLE = 2  # index of the Simple protocol in nccl.PROTOCOLS
# fraction of the local s/cp x s/cp score square one off-diagonal ring step computes, unmasked
# (causal load balancing; Transformer Engine attention.py, AttnFuncWithCPAndKVP2P: half the
# keys when the sender's chunk comes first, else half the queries)
RING_STEP_BLOCKS = 0.5


@dataclass(frozen=True)
class CPCosts:
    """One ring-attention step's core on a rank (ns, forward FLOPs)."""

    cp: int
    step_fwd_ns: int
    step_bwd_ns: int
    step_flops: float


def local_model(model: ModelSpec, cp: int) -> ModelSpec:
    """The model as one CP rank sees it: ``seq_len / cp`` tokens per sequence."""
    return replace(model, seq_len=model.seq_len // cp)


def cp_costs(local: ModelSpec, training: TrainingSpec, device: DeviceType, tp: int,
             cp: int) -> CPCosts:
    """Cost of one extra ring step (``local`` is :func:`local_model`). With causal load
    balancing (a rank holds chunks i and 2 cp - 1 - i of the 2 cp chunks) every step after
    the first computes half of the local square with no mask: the local queries against the
    earlier half of the received keys, or the later half of the queries against all of them
    (Transformer Engine's ``AttnFuncWithCPAndKVP2P``), at the flash kernel's non-causal rate."""
    c = make_ctx(local, training, device, tp)
    return CPCosts(
        cp,
        int(round(unit_seconds(_attention_core(c, False, RING_STEP_BLOCKS)) * 1e9)),
        int(round(unit_seconds(_attention_core(c, True, RING_STEP_BLOCKS)) * 1e9)),
        attention_core_flops(local, training, tp),
    )


def cp_mark(layer: int, step: int, phase: str, cp: int) -> object:
    """Block mark of ring step ``step`` (0: the local attention block) of ``layer`` in ``phase``.

    The forward local block keeps the generator's ``("fwd", layer)`` mark and the backward's
    last step the mark ``layer`` (DP readiness), so each unit carries one mark."""
    if step == 0 and phase == "fwd":
        return ("fwd", layer)
    if step == cp - 1 and phase == "bwd":
        return layer
    return ("cp", layer, step, phase)


def kv_bytes(plan: Plan, tp: int, cp: int) -> int:
    """K and V of one rank's chunk (one TP rank's KV heads), bytes: what one ring step sends.

    With MLA the ring carries the up-projected K (every head, nope + rope wide) and V (every
    head, v wide), as Megatron-Core's MLA hands them to Transformer Engine's ring attention."""
    m = plan.model
    _, hkv, dqk, dv = attention_dims(m)
    kv_heads = max(1, hkv // tp)
    return tokens_per_microbatch(m, plan.training.micro_batch, cp) * kv_heads * (dqk + dv) * (
        m.dtype_bytes)


def p2p_delay_ns(info: RankInfo, a: int, b: int) -> int:
    """NCCL's latency of one p2p send from rank ``a`` to ``b`` (Simple protocol), ns."""
    link = "nvlink" if info.server[a] == info.server[b] else "net"
    return int(round((RING_BASE_LATENCY_US[SIMPLE] + RING_STEP_LATENCY_US[link][SIMPLE]) * 1e3))


def emit_cp(em: Emitter) -> None:
    """Add the K/V ring exchanges of every CP group to ``em``'s builder (after its stages)."""
    plan: Plan = em.plan
    for r0 in range(0, plan.dp, plan.replicas[0].stages[0].cp):
        rep = plan.replicas[r0]
        for i, st in enumerate(rep.stages):
            if st.cp <= 1:
                continue
            reps = list(range(r0, r0 + st.cp))
            ranks = np.array([plan.stage_ranks(plan.replicas[r].stages[i]) for r in reps])
            for k, layers in enumerate(em.chunks[r0][i]):
                for layer in range(*layers):
                    for phase in ("fwd", "recompute", "bwd"):
                        _emit_ring(em, reps, i, k, layer, phase, ranks, st.tp, st.cp)


def _emit_ring(em: Emitter, reps: list[int], stage: int, chunk: int, layer: int, phase: str,
               ranks: np.ndarray, tp: int, cp: int) -> None:
    """The ring of one layer and pass on every TP position; ``ranks`` is (cp, tp)."""
    marks = []
    for j in range(cp):
        key = cp_mark(layer, j, phase, cp)
        cols = []
        for r in reps:
            ops = em.stage_ops[(r, stage, chunk)]
            hit = next((o.marks[key] for o in ops[1:] if key in o.marks), None) if phase != "fwd" \
                else ops[0].marks.get(key)
            if hit is None:
                return  # no such pass (e.g. no recompute)
            cols.append(hit)
        marks.append(np.stack(cols, axis=1))  # (m, cp, tp)
    plan: Plan = em.plan
    tb = em.tb
    m = marks[0].shape[0]
    nbytes = kv_bytes(plan, tp, cp) * (2 if phase == "bwd" else 1)
    src = ranks.reshape(-1)  # member (x, t) -> flat x * tp + t
    nxt = np.roll(ranks, -1, axis=0).reshape(-1)  # the next rank of the ring, same TP position
    n = len(src)
    pc = PHASE_INDEX["cp"]
    coll: dict[str, Any] | np.ndarray = dict(
        n=m, kind="cp_ring", phase=pc, bytes=nbytes * (cp - 1),
        ranks=",".join(map(str, ranks[:, 0])), algorithm=f"ring_attention:p2p(cp={cp})",
        channels=1, layer_start=layer, layer_stop=layer + 1,
    )
    delay = np.array([p2p_delay_ns(em.info, int(a), int(b)) for a, b in zip(src, nxt,
                                                                              strict=True)])
    prev_in = None  # (m, n) flow of the previous step into each member
    prev_out = None  # (m, n) flow of the previous step out of each member
    replica = em.rank_replica[src]
    for j in range(1, cp):
        common = dict(phase=pc, replica=np.tile(replica, m), stage=stage,
                      microbatch=np.repeat(np.arange(m), n), layer_start=layer,
                      layer_stop=layer + 1, collective=np.repeat(np.arange(m), n), step=j - 1)
        # NCCL's p2p cost: the flow's start latency (workload/comm/latency.py); the first
        # step opens the collective's rows, the later ones add to them
        coll, fl, _ = emit_gated(tb, coll, dict(
            n=m * n, rank=np.tile(src, m), dst=np.tile(nxt, m), bytes=nbytes,
            duration_ns=np.tile(delay, m), **common))
        fl = fl.reshape(m, n)
        tb.add_edges(marks[0].reshape(m, n), fl)  # K/V of the local chunk exist
        if prev_in is not None:
            # forward the chunk received in the step before, once that step's send/receive
            # pair has completed on this rank (TE waits on both requests)
            tb.add_edges(prev_in, fl)
            tb.add_edges(prev_out, fl)
        # the flow from member x lands on x + 1 (same TP position): index shift by tp
        into = np.roll(fl.reshape(m, cp, tp), 1, axis=1).reshape(m, n)
        tb.add_edges(into, marks[j].reshape(m, n))
        tb.add_edges(fl, marks[j].reshape(m, n))
        prev_in, prev_out = into, fl
