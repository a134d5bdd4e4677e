"""Tree, NVLS and hierarchical collectives lowered to flows (rings: :mod:`.collectives`).

Every lowering works on member *positions* 0..n-1 of one collective, grouped into servers by a
:class:`Layout`, and returns a :class:`~.collectives.RingFlows` template (instance 0) with the
same contract as a ring: ``start[c, m]`` are member m's gate flows (everything m sends waits on
them, directly or through the flows into m), ``tails[c, m]`` its last received and last sent
flows. :func:`tile` instantiates a template over many instances with identical layout and size.

**tree** (all-reduce; NCCL's double binary tree): per channel c, inside every server a chain over
its members starting at member c//2 (so successive channel pairs leave through successive NICs,
rail-aligned); across servers the binary tree ``t = c % 2`` of NCCL's ``ncclGetDtree`` (tree 1
mirrored, or shifted for an odd server count) links the chain heads. Each channel carries
1/C of the bytes (two trees: each half of them), cut in ``chunks`` pipelined pieces: piece j goes
up (reduce) from the leaves to the root, then down (broadcast); a node forwards piece j up when
piece j of all its children has arrived, down when piece j came from its parent. The root
server's chain runs the other way, so the root is a chain end with one child.

**nvls** (all-reduce with NVLink SHARP): the switch reduces and multicasts; a GPU's link carries
its share of every slice up and its reduced slice down (``multimem.ld_reduce``), then its slice
up and every slice down (``multimem.st``): S + S/m per direction over a server of m GPUs, where a
ring carries 2(m-1)/m·S. Flows are rank to rank, so the switch's work is written as two phases
(A: reduce-scatter, B: all-gather) of pair flows whose bytes give every GPU link exactly that
load: each GPU sends (and receives) ⌊P(m+1)/(2m)⌋ in phase A and the rest of ⌊P(m+1)/m⌋ in
phase B per piece P, spread evenly over its m-1 peers; B from a GPU waits for A into it. On
several servers (NVLSTree) the reduced slice of each GPU is all-reduced between servers by a
ring over the GPUs of one rail (local index) between A and B.

NVLS reduce-scatter and all-gather (one server, :func:`nvls_rs_ag_flows`): every GPU sends the
buffer spread over its peers in one phase (the switch's S up for a reduce-scatter, S down for an
all-gather).

**hierarchical**: ring reduce-scatter inside each server, ring all-reduce of each GPU's 1/m slice
across servers over its rail, ring all-gather inside each server (reduce-scatter and all-gather
kinds: the two halves of that). Pieces pipeline through the phases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...trace.schema import KIND_BARRIER, KIND_FLOW
from .collectives import RingFlows, ring_flows


@dataclass(frozen=True)
class Layout:
    """Member positions grouped into servers: ``blocks[s]`` lists server s's positions in
    ascending local GPU index (servers in order of first appearance)."""

    blocks: tuple[tuple[int, ...], ...]

    @property
    def n(self) -> int:
        return sum(len(b) for b in self.blocks)

    @property
    def uniform(self) -> bool:
        """Every server holds the same number of members."""
        return len({len(b) for b in self.blocks}) == 1

    def server_of(self) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.int64)
        for s, b in enumerate(self.blocks):
            out[list(b)] = s
        return out


def layout_of(server: np.ndarray, local: np.ndarray) -> Layout:
    """The layout of members with servers ``server`` and local GPU indices ``local``."""
    order: dict[int, list[int]] = {}
    for pos, s in enumerate(np.asarray(server).tolist()):
        order.setdefault(int(s), []).append(pos)
    blocks = tuple(tuple(sorted(b, key=lambda p: (int(local[p]), p))) for b in order.values())
    return Layout(blocks)


class _Graph:
    """A growing flow DAG over member positions."""

    def __init__(self) -> None:
        self.src: list[int] = []
        self.dst: list[int] = []
        self.nbytes: list[int] = []
        self.step: list[int] = []
        self.chan: list[int] = []
        self.pred: list[int] = []
        self.succ: list[int] = []
        self.joins: list[int] = []

    def flow(self, s: int, d: int, b: int, step: int, chan: int) -> int:
        self.src.append(s)
        self.dst.append(d)
        self.nbytes.append(int(b))
        self.step.append(step)
        self.chan.append(chan)
        return len(self.src) - 1

    def edge(self, p: int, s: int) -> None:
        self.pred.append(p)
        self.succ.append(s)

    def join(self, member: int) -> int:
        """A zero-duration barrier of ``member`` (see :class:`RingFlows` ``kind``)."""
        self.joins.append(len(self.src))
        return self.flow(member, member, 0, -1, -1)

    def ring(self, members: list[int], nbytes: int, kind: str, chan: int,
             step0: int) -> tuple[np.ndarray, np.ndarray]:
        """A ring ``kind`` over ``members`` (positions, in ring order), one channel; returns
        (start (n,), tails (n, 2)) as global flow ids, indexed like ``members``."""
        n = len(members)
        rf = ring_flows(np.asarray([members]), np.arange(n)[None, None, :],
                        np.asarray([[nbytes]]), kind)
        base = len(self.src)
        self.src += rf.src.tolist()
        self.dst += rf.dst.tolist()
        self.nbytes += rf.nbytes.tolist()
        self.step += (rf.step + step0).tolist()
        self.chan += [chan] * rf.size
        self.pred += (rf.pred + base).tolist()
        self.succ += (rf.succ + base).tolist()
        return rf.start[0, 0] + base, rf.tails[0, 0] + base

    def done(self, start: np.ndarray, tails: np.ndarray) -> RingFlows:
        z = np.zeros(len(self.src), dtype=np.int64)
        kind = None
        if self.joins:
            kind = np.full(len(self.src), KIND_FLOW, dtype=np.int8)
            kind[self.joins] = KIND_BARRIER
        return RingFlows(
            src=np.asarray(self.src, dtype=np.int64), dst=np.asarray(self.dst, dtype=np.int64),
            nbytes=np.asarray(self.nbytes, dtype=np.int64),
            step=np.asarray(self.step, dtype=np.int64),
            channel=np.asarray(self.chan, dtype=np.int64), instance=z,
            pred=np.asarray(self.pred, dtype=np.int64),
            succ=np.asarray(self.succ, dtype=np.int64),
            start=start[None].astype(np.int64), tails=tails[None].astype(np.int64), kind=kind)


def _cuts(total: int, parts: int) -> list[int]:
    """Integer sizes of ``parts`` equal pieces of ``total`` (floor cut points; sum exact)."""
    c = [total * i // parts for i in range(parts + 1)]
    return [c[i + 1] - c[i] for i in range(parts)]


# ---- tree ------------------------------------------------------------------------------------
def btree_parent(nranks: int, rank: int) -> int:
    """Parent of ``rank`` in NCCL's binary tree over ``nranks`` (``ncclGetBtree``; root 0)."""
    if rank == 0:
        return -1
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= nranks else up


def dtree_parents(nranks: int, tree: int) -> list[int]:
    """Parents in tree 0 or 1 of NCCL's double binary tree (``ncclGetDtree``): tree 1 is tree 0
    shifted by one rank for an odd count, mirrored for an even one."""
    if tree == 0:
        return [btree_parent(nranks, r) for r in range(nranks)]
    out = []
    for r in range(nranks):
        if nranks % 2:
            p = btree_parent(nranks, (r - 1) % nranks)
            out.append(-1 if p < 0 else (p + 1) % nranks)
        else:
            p = btree_parent(nranks, nranks - 1 - r)
            out.append(-1 if p < 0 else nranks - 1 - p)
    return out


def tree_flows(layout: Layout, nbytes: int, channels: int = 2, chunks: int = 4) -> RingFlows:
    """All-reduce of ``nbytes`` per member as NCCL's double binary tree (module docstring)."""
    n, num_c, num_j = layout.n, max(1, channels), max(1, chunks)
    g = _Graph()
    start = np.zeros((num_c, n), dtype=np.int64)
    tails = np.zeros((num_c, n, 2), dtype=np.int64)
    pieces = _cuts(nbytes, num_c * num_j)
    nsrv = len(layout.blocks)
    for c in range(num_c):
        srv_parent = dtree_parents(nsrv, c % 2)
        chains = [list(b[(c // 2) % len(b):] + b[:(c // 2) % len(b)]) for b in layout.blocks]
        parent = [-1] * n
        for s, ch in enumerate(chains):
            if srv_parent[s] < 0:  # root server: head -> ... -> last member (the root)
                for k in range(len(ch) - 1):
                    parent[ch[k]] = ch[k + 1]
            else:
                parent[ch[0]] = chains[srv_parent[s]][0]
                for k in range(1, len(ch)):
                    parent[ch[k]] = ch[k - 1]
        root = parent.index(-1)
        children: list[list[int]] = [[] for _ in range(n)]
        for x, p in enumerate(parent):
            if p >= 0:
                children[p].append(x)
        sizes = pieces[c * num_j:(c + 1) * num_j]
        up = [[-1] * num_j for _ in range(n)]
        down = [[-1] * num_j for _ in range(n)]
        for j in range(num_j):
            for x in range(n):
                if x != root:
                    up[x][j] = g.flow(x, parent[x], sizes[j], j, c)
        for j in range(num_j):
            for x in range(n):
                if x != root:
                    down[x][j] = g.flow(parent[x], x, sizes[j], num_j + j, c)
        for x in range(n):
            for j in range(num_j):
                if x != root:
                    for y in children[x]:
                        g.edge(up[y][j], up[x][j])
                    if j:
                        g.edge(up[x][j - 1], up[x][j])
                    p = parent[x]
                    for y in (children[p] if p == root else [p]):
                        g.edge(up[y][j] if p == root else down[p][j], down[x][j])
                    if j:
                        g.edge(down[x][j - 1], down[x][j])
        for x in range(n):
            last = num_j - 1
            if x == root:
                start[c, x] = down[children[x][0]][0]
                tails[c, x] = (up[children[x][-1]][last], down[children[x][-1]][last])
            else:
                start[c, x] = up[x][0]
                sent = down[children[x][-1]][last] if children[x] else up[x][last]
                tails[c, x] = (down[x][last], sent)
    return g.done(start, tails)


# ---- NVLS and hierarchical (intra phase, rail phase, intra phase) ----------------------------
def _nvls_phase(g: _Graph, block: list[int], piece: int, share: int, step: int,
                gate: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """One NVLS phase on a server: every GPU sends ``share`` bytes spread over its peers.
    Returns (start (m-1, m), tails (m-1, m, 2)) indexed by block position."""
    m = len(block)
    part = _cuts(share, m - 1)
    ids = np.zeros((m - 1, m), dtype=np.int64)
    for d in range(1, m):
        for i in range(m):
            ids[d - 1, i] = g.flow(block[i], block[(i + d) % m], part[d - 1], step, d - 1)
    tails = np.zeros((m - 1, m, 2), dtype=np.int64)
    for d in range(1, m):
        for i in range(m):
            tails[d - 1, i] = (ids[d - 1, (i - d) % m], ids[d - 1, i])
    if gate is not None:  # gate[k, i]: ops member i must finish before sending
        for i in range(m):
            before = [int(k) for k in gate[:, i].reshape(-1)]
            after = [int(x) for x in ids[:, i]]
            if worth_a_join(len(before), len(after)):  # all before any: k + j edges
                j = g.join(block[i])
                for k in before:
                    g.edge(k, j)
                for x in after:
                    g.edge(j, x)
            else:
                for k in before:
                    for x in after:
                        g.edge(k, x)
    return ids, tails


#: A join (a zero-duration barrier) costs one op row: 64 bytes, as much as 8 edges of 8 bytes
#: (trace/schema.py), and one event per backend.
JOIN_COST_EDGES = 8


def worth_a_join(before: int, after: int) -> bool:
    """Whether "all ``before`` ops end before any of ``after`` starts" is smaller in a trace as
    a join (before + after edges and one op) than as before x after edges. The timeline is
    the same either way: the join ends when its last predecessor does."""
    return before * after > before + after + JOIN_COST_EDGES


def staged_flows(layout: Layout, nbytes: int, kind: str, intra: str,
                 chunks: int = 4) -> RingFlows:
    """Hierarchical (``intra='ring'``) or NVLS (``intra='nvls'``, all-reduce) lowering of
    ``kind`` over a layout whose servers hold the same number m of members."""
    if not layout.uniform:
        raise ValueError("staged lowering needs the same member count on every server")
    blocks = [list(b) for b in layout.blocks]
    m, nsrv, n = len(blocks[0]), len(blocks), layout.n
    num_j = 1 if nsrv == 1 and intra == "nvls" else max(1, chunks)
    g = _Graph()
    gates = 1 if intra == "ring" else m - 1
    start = np.zeros((gates, n), dtype=np.int64)
    prev: dict[str, np.ndarray] = {}  # phase -> tails of the previous piece, (k, n)
    final = np.zeros((gates, n, 2), dtype=np.int64)
    for j, piece in enumerate(_cuts(nbytes, num_j)):
        slices = _cuts(piece, m)
        done = np.full((0, n), -1, dtype=np.int64)  # what each member's next phase waits on
        phases = _phases(kind, nsrv)
        for ph in phases:
            tails_now: list[tuple[int, np.ndarray, np.ndarray]] = []
            if ph == "rail":
                for k in range(m):
                    rail = [b[k] for b in blocks]
                    rkind = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter",
                             "all_gather": "all_gather"}[kind]
                    st, tl = g.ring(rail, slices[k], rkind, 0, 0)
                    for r, pos in enumerate(rail):
                        tails_now.append((pos, st[r:r + 1], tl[r]))
            else:
                for b in blocks:
                    if intra == "nvls":
                        share = _nvls_share(piece, m, ph)
                        # B from a GPU waits for what came into it (A, or the rail ring)
                        gate = done[0::2, b] if done.size else None
                        st, tl = _nvls_phase(g, b, piece, share, 0, gate)
                        for i, pos in enumerate(b):
                            tails_now.append((pos, st[:, i], tl[:, i].reshape(-1)))
                    else:
                        rkind = "reduce_scatter" if ph == "intra_rs" else "all_gather"
                        st, tl = g.ring(b, piece, rkind, 0, 0)
                        for i, pos in enumerate(b):
                            tails_now.append((pos, st[i:i + 1], tl[i]))
            width = max(len(t[2]) for t in tails_now)
            new_done = np.zeros((width, n), dtype=np.int64)
            for pos, st, tl in tails_now:
                new_done[:, pos] = np.resize(tl, width)
                if intra == "ring" or ph == "rail":  # gate: ring starts (one per member)
                    for k in done[:, pos] if done.size else ():
                        g.edge(int(k), int(st[0]))
                if ph in prev:  # pieces in order on each phase
                    for k in prev[ph][:, pos]:
                        for s in st:
                            g.edge(int(k), int(s))
                if j == 0 and ph == phases[0]:
                    start[:, pos] = np.resize(st, gates)
            prev[ph] = new_done
            done = new_done
        for pos in range(n):
            final[:, pos] = np.resize(done[:, pos], 2 * gates).reshape(gates, 2)
    return g.done(start, final)


def _phases(kind: str, nsrv: int) -> list[str]:
    rail = ["rail"] if nsrv > 1 else []
    if kind == "all_reduce":
        return ["intra_rs", *rail, "intra_ag"]
    if kind == "reduce_scatter":
        return ["intra_rs", *rail]
    return [*rail, "intra_ag"]


def _nvls_share(piece: int, m: int, phase: str) -> int:
    """Bytes a GPU sends in one NVLS phase of a piece: A ⌊P(m+1)/(2m)⌋, B the rest of
    ⌊P(m+1)/m⌋ (see the module docstring)."""
    total = piece * (m + 1) // m
    a = piece * (m + 1) // (2 * m)
    return a if phase == "intra_rs" else total - a


def nvls_rs_ag_flows(layout: Layout, nbytes: int) -> RingFlows:
    """NVLS reduce-scatter or all-gather of a buffer of ``nbytes`` on one server of m GPUs.

    Reduce-scatter: every GPU writes its whole buffer to the switch (S up) and reads its reduced
    slice back (S/m down, ``multimem.ld_reduce``); all-gather: every GPU multicasts its slice
    (S/m up, ``multimem.st``) and receives every slice (S down). Flows are rank to rank, so the
    binding direction is written exactly: every GPU sends S spread evenly over its m-1 peers
    (and so receives S), one phase. The other direction then carries S where the switch moves
    S/m: exact for the collective alone, pessimistic for traffic sharing that direction."""
    if len(layout.blocks) != 1:
        raise ValueError("NVLS reduce-scatter / all-gather runs on one server")
    block = list(layout.blocks[0])
    m, n = len(block), layout.n
    g = _Graph()
    ids, tl = _nvls_phase(g, block, nbytes, nbytes, 0, None)
    start = np.zeros((m - 1, n), dtype=np.int64)
    tails = np.zeros((m - 1, n, 2), dtype=np.int64)
    for i, pos in enumerate(block):
        start[:, pos] = ids[:, i]
        tails[:, pos] = tl[:, i]
    return g.done(start, tails)


def lower(algorithm: str, kind: str, layout: Layout, nbytes: int, channels: int,
          chunks: int) -> RingFlows:
    """The template of ``kind`` over ``layout`` lowered by ``algorithm`` (not ``ring``)."""
    if algorithm == "tree":
        return tree_flows(layout, nbytes, channels, chunks)
    if algorithm == "nvls" and kind != "all_reduce":
        return nvls_rs_ag_flows(layout, nbytes)
    if algorithm == "nvls":
        return staged_flows(layout, nbytes, kind, "nvls", chunks)
    if algorithm == "hierarchical":
        return staged_flows(layout, nbytes, kind, "ring", chunks)
    raise ValueError(f"no lowering for algorithm {algorithm!r}")


def tile(t: RingFlows, members: np.ndarray) -> RingFlows:
    """Instantiate template ``t`` (positions) over ``members`` (I, n) global ranks."""
    members = np.asarray(members, dtype=np.int64)
    num_i = members.shape[0]
    f = t.size
    off = (np.arange(num_i, dtype=np.int64) * f)
    return RingFlows(
        src=members[:, t.src].reshape(-1), dst=members[:, t.dst].reshape(-1),
        nbytes=np.tile(t.nbytes, num_i), step=np.tile(t.step, num_i),
        channel=np.tile(t.channel, num_i), instance=np.repeat(np.arange(num_i), f),
        pred=(off[:, None] + t.pred[None, :]).reshape(-1),
        succ=(off[:, None] + t.succ[None, :]).reshape(-1),
        start=off[:, None, None] + t.start[0][None],
        tails=off[:, None, None, None] + t.tails[0][None],
        kind=None if t.kind is None else np.tile(t.kind, num_i))


def nominal_ns(t: RingFlows, server: np.ndarray, intra_GBps: float, nic_GBps: float) -> float:
    """Time of template ``t``'s flows at nominal rates if every GPU link and NIC stays busy:
    max over members and directions of bytes within the server / ``intra_GBps`` and bytes
    across servers / ``nic_GBps``, ns (the base the protocol's bandwidth cost scales)."""
    same = server[t.src] == server[t.dst]
    n = len(server)
    worst = 0.0
    for sel, rate in ((same, intra_GBps), (~same, nic_GBps)):
        if not sel.any():
            continue
        out = np.bincount(t.src[sel], weights=t.nbytes[sel], minlength=n)
        into = np.bincount(t.dst[sel], weights=t.nbytes[sel], minlength=n)
        worst = max(worst, float(max(out.max(), into.max())) / rate)
    return worst


def merge(parts: list[tuple[np.ndarray, RingFlows]], num_i: int) -> RingFlows:
    """One RingFlows over ``num_i`` instances from parts (instance indices, flows of those
    instances in that order). Gate and tail arrays are widened to the largest channel count by
    repeating a member's own entries (a repeated dependency edge is harmless)."""
    n = parts[0][1].start.shape[2]
    cs = max(p.start.shape[1] for _, p in parts)
    ct = max(p.tails.shape[1] for _, p in parts)
    start = np.zeros((num_i, cs, n), dtype=np.int64)
    tails = np.zeros((num_i, ct, n, 2), dtype=np.int64)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                         ("src", "dst", "nbytes", "step", "channel", "instance",
                                          "pred", "succ")}
    off = 0
    for idx, rf in parts:
        idx = np.asarray(idx, dtype=np.int64)
        for k in ("src", "dst", "nbytes", "step", "channel"):
            cols[k].append(getattr(rf, k))
        cols["instance"].append(idx[rf.instance])
        cols["pred"].append(rf.pred + off)
        cols["succ"].append(rf.succ + off)
        reps_s = -(-cs // rf.start.shape[1])
        reps_t = -(-ct // rf.tails.shape[1])
        start[idx] = np.tile(rf.start + off, (1, reps_s, 1))[:, :cs]
        tails[idx] = np.tile(rf.tails + off, (1, reps_t, 1, 1))[:, :ct]
        off += rf.size
    cat = {k: np.concatenate(v).astype(np.int64) for k, v in cols.items()}
    kind = None
    if any(rf.kind is not None for _, rf in parts):
        kind = np.concatenate([np.full(rf.size, KIND_FLOW, dtype=np.int8) if rf.kind is None
                               else rf.kind for _, rf in parts])
    return RingFlows(start=start, tails=tails, kind=kind, **cat)
