"""Hand-made test traces: ring collectives lowered op by op into a :class:`TraceBuilder`, flow
for flow as the generator lowers them (:func:`~xsim_adapters.workload.comm.collectives.ring_flows`).

For tests, validation microbenchmarks and bug reproductions that have no plan (a lone ring
all-reduce checked against its closed form). Outside the trace contract: it uses the generator.

>>> tb = TraceBuilder(4)
>>> last = ring_all_reduce(tb, [0, 1, 2, 3], 64 << 20)
>>> trace = tb.build()
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..trace.builder import TraceBuilder
from ..trace.schema import KIND_FLOW
from ..workload.comm.collectives import ring_flows

__all__ = ["TraceBuilder", "ring_all_reduce", "ring_collective"]


def ring_collective(tb: TraceBuilder, ranks: Sequence[int], nbytes: int, *,
                    kind: str = "all_reduce",
                    ready: int | Iterable[int] | Mapping[int, int] = (),
                    phase: str = "dp", collective: int = -1, delay_ns: int = 0,
                    orders: Sequence[Sequence[int]] | None = None,
                    sizes: Sequence[int] | None = None) -> list[int]:
    """Lower a ring ``kind`` collective of ``nbytes`` over ``ranks`` (in ring order) into ``tb``.

    The flows and edges are exactly the generator's (:func:`workload.collectives.ring_flows`,
    step granularity): step k's flow out of a rank waits for step k-1's flow into it (the
    segment it forwards) and for its own step k-1 send (one send at a time). ``orders``: one
    ring order of ``ranks`` per channel (default: ``ranks`` itself) carrying ``sizes`` bytes
    (default: ``nbytes`` split evenly). ``ready``: op ids every first send waits for, or a
    mapping rank -> the op that rank's first send waits for. ``delay_ns`` > 0: each rank's
    first send (on every channel) carries it as its start latency (NCCL's latency and
    protocol cost, as the generator adds it: trace schema 2). Returns, per channel and
    position in ``ranks``, the last flow into that rank (joining all of them also covers
    every rank's last send).
    """
    n = len(ranks)
    orders = [list(ranks)] if orders is None else [list(o) for o in orders]
    num_c = len(orders)
    if sizes is None:
        sizes = [nbytes * (c + 1) // num_c - nbytes * c // num_c for c in range(num_c)]
    pos = {r: k for k, r in enumerate(ranks)}
    perm = np.asarray([[[pos[r] for r in o] for o in orders]], dtype=np.int64)
    rf = ring_flows(np.asarray([list(ranks)], dtype=np.int64), perm,
                    np.asarray([list(sizes)], dtype=np.int64), kind)
    if isinstance(ready, Mapping):
        first = [[ready[r]] if r in ready else [] for r in ranks]
    else:
        common = [ready] if isinstance(ready, int) else list(ready)
        first = [common] * n
    starts = {int(rf.start[0, c, m]): m for c in range(num_c) for m in range(n)} if rf.size else {}
    preds: dict[int, list[int]] = {}
    for p, q in zip(rf.pred.tolist(), rf.succ.tolist(), strict=True):
        preds.setdefault(q, []).append(p)
    ids: list[int] = []
    for j in range(rf.size):
        deps = first[starts[j]] if j in starts else [ids[p] for p in preds.get(j, [])]
        # ``add``, not ``flow``: test subclasses give ``flow`` their own call styles.
        ids.append(tb.add(KIND_FLOW, int(rf.src[j]), phase=phase, deps=deps,
                          dst=int(rf.dst[j]), bytes=int(rf.nbytes[j]), collective=collective,
                          step=int(rf.step[j]), channel=int(rf.channel[j]),
                          duration_ns=delay_ns if j in starts else 0))
    if not rf.size:
        return []
    return [ids[int(t)] for c in range(num_c) for t in rf.tails[0, c, :, 0]]


def ring_all_reduce(tb: TraceBuilder, ranks: Sequence[int], nbytes: int, *,
                    ready: int | Iterable[int] | Mapping[int, int] = (),
                    phase: str = "dp", collective: int = -1) -> list[int]:
    """A ring all-reduce (2(n-1) steps of ``nbytes / n``) lowered by :func:`ring_collective`."""
    return ring_collective(tb, ranks, nbytes, kind="all_reduce", ready=ready, phase=phase,
                           collective=collective)
