"""Ring collectives lowered to flows, vectorized over many ring instances at once.

Granularity ``step``: a collective of S bytes over n ranks has K steps (all-reduce 2(n-1),
reduce-scatter and all-gather n-1). The buffer is cut into n segments at floor(S*i/n); at each
step every rank sends one segment to its ring successor (the segment index follows the textbook
ring algorithm), so with S divisible by n every rank sends exactly 2(n-1)/n * S for an
all-reduce. Flow (step k, position p) depends on flow (k-1, p-1) (the data it forwards has been
received) and flow (k-1, p) (the rank's own previous send is done).

Granularity ``chunked``: the collective is ``chunks`` pipelined pieces; piece j is a single flow
per ring edge carrying an equal share (integer cut points) of the rank's whole send volume in
``step`` granularity (2(n-1)/n * S for an all-reduce, (n-1)/n * S otherwise, exact per rank).
Piece j on edge p depends on piece j-1 from the ring predecessor and on piece j-1 of its own
edge, so J pieces stream around the ring: far fewer flows than ``step`` with the same bytes per
link. The ``step`` column holds the piece.

Members and orders: instance i has ``members[i]`` (global ranks) and, per channel c, a ring
order ``perm[i, c]`` of member indices. Channel c carries ``sizes[i, c]`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...trace.schema import KIND_FLOW
from .nccl import ring_steps


def num_steps(kind: str, n: int, granularity: str, chunks: int) -> int:
    """Flows per ring edge of one collective: steps (``step``) or pieces (``chunked``)."""
    if n < 2:
        return 0
    if granularity == "chunked":
        return max(1, chunks)
    return ring_steps(kind, n)


def _segment_index(kind: str, n: int) -> np.ndarray:
    """(K, n): the buffer segment position p sends at step k."""
    p = np.arange(n)
    if kind == "all_reduce":
        k = np.arange(2 * (n - 1))[:, None]
        rs = (p[None, :] - k) % n
        ag = (p[None, :] + 1 - (k - (n - 1))) % n
        return np.where(k < n - 1, rs, ag)
    k = np.arange(n - 1)[:, None]
    if kind == "reduce_scatter":
        return (p[None, :] - k) % n
    return (p[None, :] - k) % n  # all_gather: rank p starts owning segment p


@dataclass
class RingFlows:
    """Flows of I ring instances x C channels, laid out [instance][channel][step][position].

    ``start[i, c, m]``: local index of the first flow member m sends on channel c;
    ``tails[i, c, m]``: the two local flows after which member m holds the result on channel c
    (the last flow it receives, the last flow it sends). Edges are local (pred, succ).

    ``kind`` (None: every entry is a flow) marks *joins*: zero-duration barriers of member
    ``src`` (``dst == src``, 0 bytes, step and channel -1) that stand for "all of these before
    any of those" with k + j edges instead of k x j (:func:`.algorithms._nvls_phase`). A join
    never is a gate or a tail.
    """

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    step: np.ndarray
    channel: np.ndarray
    instance: np.ndarray
    pred: np.ndarray
    succ: np.ndarray
    start: np.ndarray
    tails: np.ndarray
    kind: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.src)

    def op_kinds(self) -> np.ndarray | int:
        """The trace ``kind`` of each entry: KIND_FLOW, or KIND_BARRIER for a join."""
        return KIND_FLOW if self.kind is None else self.kind

    def op_dst(self) -> np.ndarray:
        """The trace ``dst`` of each entry (local positions): the flow's, -1 for a join."""
        if self.kind is None:
            return self.dst
        return np.where(self.kind == KIND_FLOW, self.dst, -1)


def ring_flows(
    members: np.ndarray,
    perm: np.ndarray,
    sizes: np.ndarray,
    kind: str,
    granularity: str = "step",
    chunks: int = 4,
) -> RingFlows:
    """Lower I ring collectives (``members`` (I, n), ``perm`` (I, C, n), ``sizes`` (I, C))."""
    members = np.asarray(members, dtype=np.int64)
    perm = np.asarray(perm, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    num_i, num_c, n = perm.shape
    k_steps = num_steps(kind, n, granularity, chunks)
    shape = (num_i, num_c, k_steps, n)
    ids = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    pos = np.arange(n)
    ordered = np.take_along_axis(members[:, None, :], perm, axis=2)  # (I, C, n) ranks
    src = np.broadcast_to(ordered[:, :, None, :], shape)
    dst = np.broadcast_to(np.roll(ordered, -1, axis=2)[:, :, None, :], shape)
    if k_steps == 0:
        nbytes = np.zeros(shape, dtype=np.int64)
    elif granularity == "chunked":
        # What each position sends in ``step`` granularity (exact even when n does not divide
        # S), cut into K equal pieces: every byte of the collective appears in its flows.
        cuts = sizes[..., None] * np.arange(n + 1) // n
        seg = np.diff(cuts, axis=-1)  # (I, C, n)
        idx = np.asarray(_segment_index(kind, n))  # (steps, n)
        total = np.take(seg, idx, axis=2).sum(axis=2)  # (I, C, n)
        pcuts = total[..., None] * np.arange(k_steps + 1) // k_steps  # (I, C, n, K+1)
        nbytes = np.diff(pcuts, axis=-1).transpose(0, 1, 3, 2)  # (I, C, K, n)
    else:
        cuts = sizes[..., None] * np.arange(n + 1) // n
        seg = np.diff(cuts, axis=-1)  # (I, C, n)
        idx = _segment_index(kind, n)  # (K, n)
        nbytes = seg[:, :, idx]
    step = np.broadcast_to(np.arange(k_steps)[None, None, :, None], shape)
    chan = np.broadcast_to(np.arange(num_c)[None, :, None, None], shape)
    inst = np.broadcast_to(np.arange(num_i)[:, None, None, None], shape)
    if k_steps > 1:
        succ = ids[:, :, 1:, :]
        from_prev = np.roll(ids, 1, axis=3)[:, :, :-1, :]  # flow (k-1, p-1)
        own = ids[:, :, :-1, :]
        pred = np.stack([from_prev, own], axis=-1).reshape(-1)
        succ = np.repeat(succ.reshape(-1), 2)
    else:
        pred = succ = np.zeros(0, dtype=np.int64)
    start = np.zeros((num_i, num_c, n), dtype=np.int64)
    tails = np.zeros((num_i, num_c, n, 2), dtype=np.int64)
    if k_steps:
        ii = np.arange(num_i)[:, None, None]
        cc = np.arange(num_c)[None, :, None]
        start[ii, cc, perm] = ids[:, :, 0, :]
        last = ids[:, :, -1, :]
        tails[ii, cc, perm, 0] = last[:, :, (pos - 1) % n]
        tails[ii, cc, perm, 1] = last
    return RingFlows(
        src=src.reshape(-1).copy(),
        dst=dst.reshape(-1).copy(),
        nbytes=np.ascontiguousarray(nbytes).reshape(-1).astype(np.int64),
        step=step.reshape(-1).copy(),
        channel=chan.reshape(-1).copy(),
        instance=inst.reshape(-1).copy(),
        pred=pred,
        succ=succ,
        start=start,
        tails=tails,
    )
