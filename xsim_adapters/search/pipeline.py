"""A pipeline's earliest schedule under lower-bound costs: the backbone of the search bound.

The generator chains every block (one micro-batch's forward, backward or weight-gradient pass
of one model chunk on one stage) in the schedule's run order on each rank
(:func:`..workload.schedule.stage_order`), and joins consecutive virtual stages: the forward of
virtual stage j + 1 waits for the forward of j (through the pipeline transfer of its
activation), the backward (B) of j waits for the backward of j + 1 (through the transfer of its
gradient). No other edge orders blocks. So if every block lasts at least its cost and every
transfer at least its floor, the earliest start of every block in this dependency graph (its
longest path from the iteration's start) is a lower bound on when the simulation can start it,
and likewise for its end: a backend starts an op no earlier than its predecessors end.

:func:`earliest_schedule` computes those times for one replica: a topological sweep over the
stages' run orders (O(blocks)); a forward block may also carry a floor on its end (the ZeRO
parameter all-gathers its units wait for).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..workload.schedule import BWD, FWD, WGRAD, stage_order


@dataclass(frozen=True)
class StageTimes:
    """Lower bounds (ns) for one stage of one replica: the run order's rows (kind, chunk,
    micro-batch), each row's earliest start and end."""

    order: np.ndarray  # (rows, 3)
    start: np.ndarray  # (rows,) float
    end: np.ndarray  # (rows,) float
    last: dict[tuple[int, int], int] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for i, (kind, chunk) in enumerate(self.order[:, :2].tolist()):
            self.last[(kind, chunk)] = i

    @property
    def last_end(self) -> float:
        return float(self.end[-1]) if len(self.end) else 0.0

    def last_row(self, kind: int, chunk: int) -> int:
        """Index of the last row of ``kind`` on ``chunk`` (-1 if none)."""
        return self.last.get((kind, chunk), -1)


def earliest_schedule(schedule: str, pp: int, m: int, v: int,
                      cost: Sequence[Mapping[tuple[int, int], int]],
                      fwd_xfer: Sequence[int], bwd_xfer: Sequence[int],
                      fwd0_floor: Sequence[Mapping[int, float]] | None = None
                      ) -> list[StageTimes]:
    """Earliest start and end of every block of a replica of ``pp`` stages, ``m`` micro-batches
    and ``v`` model chunks per stage under ``schedule``.

    ``cost[s][(kind, chunk)]``: a lower bound (ns) on the block's duration on stage s (its
    compute and the TP collectives its rank waits for); ``fwd_xfer[j]`` / ``bwd_xfer[j]``:
    floors (ns) of the activation transfer from virtual stage j to j + 1 and of the gradient
    transfer from j + 1 back to j (virtual stage j = chunk * pp + stage); ``fwd0_floor[s][c]``:
    a floor on the end of stage s's first forward of chunk c (micro-batch 0).
    """
    orders = [stage_order(schedule, s, pp, m, v) for s in range(pp)]
    nv = int(max(int(o[:, 1].max()) for o in orders)) + 1 if pp else 1
    virt = pp * nv
    done_f = np.full((virt, m), -1.0)
    done_b = np.full((virt, m), -1.0)
    starts = [np.zeros(len(o)) for o in orders]
    ends = [np.zeros(len(o)) for o in orders]
    pos = [0] * pp
    clock = [0.0] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(pp):
            o = orders[s]
            while pos[s] < len(o):
                kind, c, mb = (int(x) for x in o[pos[s]])
                j = c * pp + s
                ready = clock[s]
                if kind == FWD and j > 0:
                    dep = done_f[j - 1, mb]
                    if dep < 0:
                        break
                    ready = max(ready, dep + fwd_xfer[j - 1])
                elif kind == BWD and j < virt - 1:
                    dep = done_b[j + 1, mb]
                    if dep < 0:
                        break
                    ready = max(ready, dep + bwd_xfer[j])
                end = ready + cost[s][(kind, c)]
                if kind == FWD and mb == 0 and fwd0_floor is not None:
                    end = max(end, fwd0_floor[s].get(c, 0.0))
                if kind == FWD:
                    done_f[j, mb] = end
                elif kind == BWD:
                    done_b[j, mb] = end
                starts[s][pos[s]] = ready
                ends[s][pos[s]] = end
                clock[s] = end
                pos[s] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise AssertionError(f"{schedule}: pipeline order deadlocks (pp {pp}, m {m})")
    return [StageTimes(o, st, en) for o, st, en in zip(orders, starts, ends, strict=True)]


__all__ = ["BWD", "FWD", "WGRAD", "StageTimes", "earliest_schedule"]
