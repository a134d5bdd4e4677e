"""NCCL's per-member delay as a start latency on a collective's first flows.

The NCCL cost model (:mod:`.nccl`) charges each member of a collective a delay before its first
send: the call's base and per-hop latency plus its protocol cost. Trace schema version 1 wrote
it as one timed barrier per member between the member's readiness and its gate flows (the
flows it sends first, ``RingFlows.start``). Version 2 puts the delay on the gate flows
themselves: a flow's ``duration_ns`` is the time from its last predecessor's end to its first
byte, which every engine honours. That removes one op per member per collective (a third of
the ops of a step-granularity plan) and its edges.

The two are the same schedule exactly when a member's gate flows wait on nothing inside the
collective: then both start transmitting ``delay`` after the member's readiness. That holds
for rings (step 0, or piece 0 of a chunked ring), NVLS and hierarchical lowerings, the EP
all-to-all's first step and every CP ring step; it does not hold for a tree's inner members,
whose first send up waits for their children's data (a barrier starts the delay at the
member's readiness, a start latency would start it when the data arrive). Such members keep
their timed barrier (:func:`latency_members`).
"""

from __future__ import annotations

import numpy as np

from .collectives import RingFlows


def latency_members(rf: RingFlows) -> np.ndarray:
    """(I, n) bool: member m of instance i can take its delay as a start latency on its gate
    flows ``rf.start[i, :, m]``, because none of them has a predecessor inside the lowering."""
    has_pred = np.zeros(rf.size, dtype=bool)
    has_pred[rf.succ] = True
    return ~has_pred[rf.start].any(axis=1)


def gate_latency(rf: RingFlows, delay_ns: np.ndarray | int, members: np.ndarray
                 ) -> np.ndarray:
    """Per flow of ``rf`` (local order), the start latency in ns: ``delay_ns`` (scalar, or per
    instance (I,), or per instance and member (I, n)) on the gate flows of the members in
    ``members`` ((I, n) bool, see :func:`latency_members`), 0 elsewhere."""
    num_i, _, n = rf.start.shape
    d = np.asarray(delay_ns, dtype=np.int64)
    d = np.broadcast_to(d[:, None] if d.ndim == 1 else d, (num_i, n))
    out = np.zeros(rf.size, dtype=np.int64)
    take = np.broadcast_to((members & (d > 0))[:, None, :], rf.start.shape)
    out[rf.start[take]] = np.broadcast_to(d[:, None, :], rf.start.shape)[take]
    return out
