"""Hand-built traces and timelines with known answers for the metrics tests.

``TraceBuilder`` assembles ops and edges by hand; ``asap_timeline`` times the DAG with every op
starting when its predecessors end (compute takes ``duration_ns``, a flow ``bytes / gbps``),
which is exactly the schedule of an uncontended network, so expected values are closed-form.
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import pandas as pd

from xsim_adapters.testing import handmade
from xsim_adapters.trace.schema import (
    KIND_BARRIER,
    KIND_FLOW,
    Trace,
)
from xsim_adapters.trace.timeline import Timeline


class TraceBuilder(handmade.TraceBuilder):
    """The metrics tests' call style: phase positional, then replica / stage / micro-batch."""

    def __init__(self, ranks: list[tuple[str, str]], peak_tflops: dict[str, float] | None = None,
                 tokens_per_iteration: int = 4096) -> None:
        """``ranks``: (group, device_type) per global rank."""
        super().__init__(ranks, peak_tflops=peak_tflops, tokens_per_iteration=tokens_per_iteration)

    def compute(self, rank: int, dur: int, phase: str, replica: int = 0,  # type: ignore[override]
                stage: int = 0, mb: int = -1, deps: tuple[int, ...] = (),
                flops: float = 0.0) -> int:
        return super().compute(rank, dur, phase=phase, deps=deps, replica=replica, stage=stage,
                               microbatch=mb, flops=flops)

    def flow(self, src: int, dst: int, nbytes: int, phase: str,  # type: ignore[override]
             deps: tuple[int, ...] = (), collective: int = -1, step: int = -1,
             replica: int = -1, stage: int = -1) -> int:
        return super().flow(src, dst, nbytes, phase=phase, deps=deps, collective=collective,
                            step=step, replica=replica, stage=stage)

    def barrier(self, deps: tuple[int, ...], phase: str = "dp") -> int:  # type: ignore[override]
        return super().barrier(phase=phase, deps=deps)


def asap_timeline(trace: Trace, gbps: float = 8.0, backend: str = "asap") -> Timeline:
    """Start every op when its last predecessor ends; flows take bytes*8/gbps ns."""
    ops = trace.ops
    n = len(ops)
    dur = np.where(ops["kind"] == KIND_FLOW, ops["bytes"] * 8.0 / gbps,
                   ops["duration_ns"].astype(float)).astype(float)
    dur[ops["kind"].to_numpy() == KIND_BARRIER] = 0.0
    succs = defaultdict(list)
    indeg = np.zeros(n, dtype=int)
    for p, s in zip(trace.deps["pred"], trace.deps["succ"], strict=True):
        succs[int(p)].append(int(s))
        indeg[int(s)] += 1
    start = np.zeros(n)
    end = np.full(n, np.nan)
    q = deque(np.flatnonzero(indeg == 0).tolist())
    while q:
        o = q.popleft()
        end[o] = start[o] + dur[o]
        for s in succs[o]:
            start[s] = max(start[s], end[o])
            indeg[s] -= 1
            if indeg[s] == 0:
                q.append(s)
    frame = pd.DataFrame({"op_id": np.arange(n, dtype=np.int64), "start_ns": start,
                          "end_ns": end})
    return Timeline(backend=backend, frame=frame, stats={"events": n})


def one_f_one_b(p: int, m: int, f: int, b: int, act_bytes: int = 0,
                flops_per_op: float = 0.0) -> Trace:
    """One replica, ``p`` single-rank stages, ``m`` micro-batches, 1F1B order per stage."""
    tb = TraceBuilder([("g", "H100")] * p)
    fwd: dict[tuple[int, int], int] = {}
    bwd: dict[tuple[int, int], int] = {}
    order = []
    for s in range(p):
        warm = min(p - s - 1, m)
        seq = [("F", i) for i in range(warm)]
        nf, nb = warm, 0
        while nb < m:
            if nf < m:
                seq.append(("F", nf))
                nf += 1
            seq.append(("B", nb))
            nb += 1
        order.append(seq)
    # Create ops in dependency-friendly order by repeated passes.
    pos = [0] * p
    last = [None] * p
    recv_f: dict[tuple[int, int], int] = {}
    recv_b: dict[tuple[int, int], int] = {}
    while any(pos[s] < len(order[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(order[s]):
                k, i = order[s][pos[s]]
                if k == "F":
                    if s > 0 and (s, i) not in recv_f:
                        break
                    deps = [x for x in (last[s], recv_f.get((s, i))) if x is not None]
                    op = tb.compute(s, f, "fwd", 0, s, i, tuple(deps), flops=flops_per_op)
                    fwd[(s, i)] = op
                    if s + 1 < p:
                        recv_f[(s + 1, i)] = tb.flow(s, s + 1, act_bytes, "pp", (op,),
                                                     replica=0, stage=s)
                else:
                    if s < p - 1 and (s, i) not in recv_b:
                        break
                    deps = [x for x in (last[s], recv_b.get((s, i))) if x is not None]
                    op = tb.compute(s, b, "bwd", 0, s, i, tuple(deps), flops=2 * flops_per_op)
                    bwd[(s, i)] = op
                    if s > 0:
                        recv_b[(s - 1, i)] = tb.flow(s, s - 1, act_bytes, "pp", (op,),
                                                     replica=0, stage=s)
                last[s] = op
                pos[s] += 1
                progressed = True
        assert progressed, "1F1B construction deadlocked"
    return tb.build([{"replica": 0, "pp": p, "tp": [1] * p, "micro_batches": m}])


def ring_all_reduce(tb: TraceBuilder, cid: int, ranks: list[int], nbytes: int,
                    ready: dict[int, int], phase: str = "dp") -> list[int]:
    """Ring all-reduce (collective ``cid``); rank r's step-0 flow waits on ``ready[r]``.

    Returns the last op each rank receives (in ring order)."""
    tb.collective(cid, "all_reduce", phase, ranks, nbytes)
    return handmade.ring_all_reduce(tb, ranks, nbytes, ready=ready, phase=phase, collective=cid)
