"""Pipeline schedules: the order in which one stage runs its forward and backward work.

An order is an int64 array of rows ``(kind, chunk, micro_batch)``: ``kind`` is :data:`FWD`,
:data:`BWD` (the whole backward, or with ``zb_h1`` only its input-gradient part B) or
:data:`WGRAD` (the weight-gradient part W, ``zb_h1`` only); ``chunk`` is the model chunk of the
stage (always 0 unless ``interleaved``).

Schedules (``training.schedule``):

- ``gpipe``: all forwards 0..m-1, then all backwards 0..m-1.
- ``1f1b``: warm-up of min(pp - stage - 1, m) forwards, then one forward one backward, then the
  cool-down backwards (Megatron-LM's ``forward_backward_pipelining_without_interleaving``).
- ``interleaved``: Megatron-LM's ``forward_backward_pipelining_with_interleaving`` with v =
  ``training.virtual_stages`` model chunks per stage. The k-th forward of a stage runs chunk
  ``(k mod pp*v) // pp`` on micro-batch ``(k // (pp*v))*pp + k mod pp``; the k-th backward
  the chunk ``v - 1 -`` that, on the same micro-batch formula. Warm-up: all m*v forwards when
  m == pp, else min((pp - stage - 1)*2 + (v - 1)*pp, m*v); then one forward one backward; then
  the cool-down backwards. Megatron requires m to be a multiple of pp (checked by the plan).
- ``zb_h1``: ZB-H1 of Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", arXiv:2401.10241,
  Sec. 3.1): the 1F1B order with every backward split into B (input gradient, on the critical
  path: it is what the upstream stage waits for) and W (weight gradient). Stage s defers its W
  passes by s: W of micro-batch j runs right after B of micro-batch j + s, the last s run at the
  end and fill the cool-down bubble. The deferral keeps at most pp micro-batches in flight on
  every stage (as 1F1B's stage 0), and with equal F = B = W times the bubble is (pp - 1)·F,
  a third of 1F1B's (pp - 1)·(F + B + W).

Model chunks (:func:`chunk_layers`): with ``interleaved`` a stage's layer range as written
gives its layer count n_s; each stage's count is split into v near-equal chunk sizes (the
remainder to its earlier chunks), and the model's layers are laid out along the virtual
pipeline: virtual stage j = k*pp + s (chunk k of stage s) holds the next n_{s,k} layers. With
equal stages this is Megatron's assignment (chunk k of stage s holds the layers of virtual
stage k*pp + s); the first virtual stage holds layer 0 (stage 0, with the embedding) and the
last holds the last layer (stage pp - 1, with the head), as the written ranges say.
"""

from __future__ import annotations

import numpy as np

from ..errors import PlanError
from ..plan.layout import even_split
from ..plan.model import Plan

FWD, BWD, WGRAD = 0, 1, 2
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb_h1")


def stage_order(
    schedule: str, stage: int, pp: int, micro_batches: int, virtual_stages: int = 1
) -> np.ndarray:
    """Run order of stage ``stage`` (0-based) of a ``pp``-deep pipeline: rows (kind, chunk, mb).

    ``virtual_stages`` is used by ``interleaved`` only; with pp == 1 ``interleaved`` runs as
    ``1f1b`` (one stage has nothing to interleave with).
    """
    m = micro_batches
    if schedule == "gpipe":
        rows = [(FWD, 0, j) for j in range(m)] + [(BWD, 0, j) for j in range(m)]
    elif schedule == "1f1b" or (schedule == "interleaved" and pp == 1):
        rows = _one_f_one_b(stage, pp, m)
    elif schedule == "interleaved":
        rows = _interleaved(stage, pp, m, virtual_stages)
    elif schedule == "zb_h1":
        rows = _zb_h1(stage, pp, m)
    else:
        raise PlanError(
            "training.schedule", f"expected one of {', '.join(SCHEDULES)} (got {schedule!r})"
        )
    return np.array(rows, dtype=np.int64).reshape(-1, 3)


def _one_f_one_b(stage: int, pp: int, m: int) -> list[tuple[int, int, int]]:
    w = min(pp - stage - 1, m)
    rows = [(FWD, 0, i) for i in range(w)]
    for j in range(m - w):
        rows.append((FWD, 0, w + j))
        rows.append((BWD, 0, j))
    rows.extend((BWD, 0, j) for j in range(m - w, m))
    return rows


def _interleaved(stage: int, pp: int, m: int, v: int) -> list[tuple[int, int, int]]:
    total = m * v
    group = pp * v

    def chunk(k: int, forward: bool) -> int:
        c = (k % group) // pp
        return c if forward else v - 1 - c

    def mb(k: int) -> int:
        return (k // group) * pp + k % pp

    warmup = total if m == pp else min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    rows = [(FWD, chunk(k, True), mb(k)) for k in range(warmup)]
    for k in range(total - warmup):
        f = k + warmup
        rows.append((FWD, chunk(f, True), mb(f)))
        rows.append((BWD, chunk(k, False), mb(k)))
    rows.extend((BWD, chunk(k, False), mb(k)) for k in range(total - warmup, total))
    return rows


def _zb_h1(stage: int, pp: int, m: int) -> list[tuple[int, int, int]]:
    w = min(pp - stage - 1, m)
    rows = [(FWD, 0, i) for i in range(w)]
    pending: list[int] = []  # micro-batches whose W is deferred, oldest first

    def backward(j: int) -> None:
        rows.append((BWD, 0, j))
        pending.append(j)
        if len(pending) > stage:
            rows.append((WGRAD, 0, pending.pop(0)))

    for j in range(m - w):
        rows.append((FWD, 0, w + j))
        backward(j)
    for j in range(m - w, m):
        backward(j)
    rows.extend((WGRAD, 0, j) for j in pending)
    return rows


def replica_chunks(plan: Plan, replica: int) -> list[list[tuple[int, int]]]:
    """Layer ranges ``[a, b)`` of every model chunk of every stage of ``replica``.

    One chunk per stage (its written range) unless ``training.schedule`` is ``interleaved``
    and the replica has at least two stages; then ``training.virtual_stages`` chunks laid out
    along the virtual pipeline as the module docstring says.
    """
    rep = plan.replicas[replica]
    v = plan.training.virtual_stages
    if plan.training.schedule != "interleaved" or rep.pp < 2:
        return [[st.layers] for st in rep.stages]
    sizes = [even_split(st.num_layers, v) for st in rep.stages]
    out: list[list[tuple[int, int]]] = [[] for _ in rep.stages]
    start = 0
    for k in range(v):
        for s in range(rep.pp):
            out[s].append((start, start + sizes[s][k]))
            start += sizes[s][k]
    return out


def replica_virtual_stages(plan: Plan, replica: int) -> int:
    """Model chunks per stage that ``replica`` runs (1 unless interleaved with pp >= 2)."""
    return len(replica_chunks(plan, replica)[0])
