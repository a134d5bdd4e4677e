"""Communication lower bounds for the search bound: what the links allow, what must move.

Everything is read from the models the simulation itself uses, never restated:

- **Capacities** come from the topology the backends replay (:func:`..topology.build.
  build_topology` of the spec's whole cluster): for each rank, the capacity of its GPU's
  outgoing and incoming links inside its server (tiers ``scale_up`` and ``pcie``) and towards
  other servers (every link but NVLink: the router never sends a flow between servers over
  NVLink, :mod:`..topology.routing`); for each server, its *cut*: the links from a node of the
  server to a node outside it. The flow backend never gives the flows on a link more than its
  capacity, so bytes B that must cross a set of links of total capacity C take at least B / C.
- **TP collectives** of a stage: the algorithm and NCCL delay the generator picks for the
  stage's ring (:func:`..workload.selection.choose_algorithm`, :func:`..workload.rings.
  ring_delay_ns` over the same channel orders), and the bytes each member sends between its
  gate flows and its tails (the flows its next compute waits for): the ring's closed form, or
  counted on the lowered template (:func:`..workload.algorithms.lower`).
- **Pipeline transfers**: the bytes :func:`..workload.reshard.reshard_transfers` sends into each
  destination rank.
- **DP rings** (:mod:`..workload.comm.dpsync`): the bytes a ring must carry across a server's cut.

Explicit ``network.links`` can join any two nodes; their capacity is added to every rank's and
every server's capacity here, which keeps every bound a lower bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..plan.model import Plan
from ..topology.build import build_topology
from ..topology.model import SERVER_TIERS, TIER_SCALE_UP
from ..workload.comm.algorithms import lower
from ..workload.comm.collectives import RingFlows
from ..workload.comm.nccl import ring_steps
from ..workload.comm.reshard import DEST, reshard_transfers
from ..workload.comm.rings import (
    RankInfo,
    channel_orders,
    ring_bottleneck_GBps,
    ring_delay_ns,
    ring_order,
    split_bytes,
)
from ..workload.comm.selection import Choice, choose_algorithm

# A slack in bytes subtracted from every byte count below that is a sum of integer cuts
# (floor(S * i / n) segments, pieces and channels): far below a microsecond on any link, and it
# keeps the counts lower bounds whatever the rounding of the lowering.
CUT_SLACK_BYTES = 1 << 16


@dataclass(frozen=True)
class Caps:
    """Link capacities of one rank's GPU node, bytes per ns (out of / into the GPU)."""

    intra_out: float  # links inside its server (NVLink, PCIe)
    inter_out: float  # every link but NVLink (what a flow to another server can leave by)
    all_out: float
    intra_in: float
    inter_in: float
    all_in: float


class Fabric:
    """Capacities, TP, PP and DP cost floors of one spec's cluster (all its device groups).

    ``plan`` is a Plan of the whole cluster (no replicas needed); candidate plans that leave
    groups idle map their ranks to this plan's ranks with :meth:`full_rank`.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.info = RankInfo(plan)
        self.offset: dict[str, int] = {}
        off = 0
        for g in plan.device_groups:
            self.offset[g.name] = off
            off += g.num_devices
        topo = build_topology(plan)
        links, nodes = topo.links, topo.nodes
        src = links["src"].to_numpy()
        dst = links["dst"].to_numpy()
        bpns = links["gbps"].to_numpy(dtype=np.float64) / 8.0  # bytes per ns
        tier = links["tier"].astype(str).to_numpy()
        server = nodes["domain"].to_numpy()  # NVLink domains: what RankInfo calls servers
        num_nodes = len(nodes)
        explicit = float(bpns[tier == "explicit"].sum())

        def per_node(at: np.ndarray, sel: np.ndarray) -> np.ndarray:
            return np.bincount(at[sel], weights=bpns[sel], minlength=num_nodes) + explicit

        intra = np.isin(tier, SERVER_TIERS)
        inter = tier != TIER_SCALE_UP
        every = np.ones(len(tier), dtype=bool)
        gpu = np.asarray(topo.rank_node, dtype=np.int64)
        self.caps = [
            Caps(*(float(x) for x in vals))
            for vals in zip(per_node(src, intra)[gpu], per_node(src, inter)[gpu],
                            per_node(src, every)[gpu], per_node(dst, intra)[gpu],
                            per_node(dst, inter)[gpu], per_node(dst, every)[gpu], strict=True)
        ]
        if not np.array_equal(server[gpu], self.info.server):
            raise AssertionError("topology and rank info number NVLink domains differently")
        num_servers = int(self.info.server.max()) + 1 if len(gpu) else 0
        crossing = (server[src] >= 0) & (server[src] != server[dst])
        entering = (server[dst] >= 0) & (server[src] != server[dst])
        self.cut_out = np.bincount(server[src][crossing], weights=bpns[crossing],
                                   minlength=num_servers)[:num_servers] + explicit
        self.cut_in = np.bincount(server[dst][entering], weights=bpns[entering],
                                  minlength=num_servers)[:num_servers] + explicit
        c = plan.collectives
        # channels a ring can open: the plan's count, or (auto) one per NIC of a server
        self.max_channels = max(c.channels, max(gr.domain_gpus for gr in plan.device_groups))
        self._tp: dict[tuple[int, int, int, tuple[str, ...]], int] = {}
        self._sent: dict[tuple[str, str, object, int, int, int], np.ndarray] = {}
        self._moved: dict[tuple[str, str, object, int, int, int],
                          tuple[np.ndarray, np.ndarray]] = {}
        self._choice: dict[tuple[object, ...], Choice] = {}
        self._xfer: dict[tuple[int, int, int, int, int, str], int] = {}

    def full_rank(self, group: str, device: int) -> int:
        """This plan's global rank of device ``device`` of group ``group``."""
        return self.offset[group] + device

    # ---- TP ---------------------------------------------------------------------------------
    def tp_gap_ns(self, group: str, lo: int, tp: int, nbytes: int, kinds: tuple[str, ...]
                  ) -> int:
        """A lower bound (ns) on the time from a unit's compute end to the next compute start
        on every rank of the TP group [lo, lo + tp) of ``group``: for each collective kind of
        the unit in turn (reduce-scatter waits for nothing but the compute, all-gather for the
        reduce-scatter's tails on the rank), its NCCL delay barrier plus the bytes the rank
        sends between its gate flows and its tails over its capacity inside the server (a
        templated algorithm: the bytes it sends or receives after any member's gate and before
        its tails, over its outgoing or incoming capacity, :func:`tail_bytes`)."""
        key = (self.offset[group] + lo, tp, nbytes, kinds)
        hit = self._tp.get(key)
        if hit is not None:
            return hit
        if tp < 2 or nbytes <= 0:
            self._tp[key] = 0
            return 0
        plan, info = self.plan, self.info
        ranks = [self.full_rank(group, lo + k) for k in range(tp)]
        c = plan.collectives
        orders = channel_orders(info, ring_order(info, ranks, c.ring_order), c.channels)
        sizes = split_bytes(nbytes, [ring_bottleneck_GBps(info, o) for o in orders])
        gap = np.zeros(tp, dtype=np.float64)
        for kind in kinds:
            ch = choose_algorithm(plan, info, ranks, kind, nbytes)
            if ch.algorithm == "ring":
                delay = ring_delay_ns(info, kind, orders, sizes) if c.nccl_cost else 0
                sent = np.full(tp, float(sum(ring_steps(kind, tp) * (s // tp) for s in sizes)))
                caps = np.array([self.caps[r].intra_out or self.caps[r].all_out for r in ranks])
                gap += max(0, delay) + np.maximum(sent - CUT_SLACK_BYTES, 0.0) / caps
                continue
            # A templated member's later sends may wait on flows into it rather than on its
            # own gate: count from the earliest member's (every member's floor so far is at
            # least gap.min()), sent over the rank's outgoing and received over its incoming
            # capacity (template_moved).
            sent, recv = (x.astype(np.float64) for x in self.template_moved(ch, kind, nbytes))
            cap_out = np.array([self.caps[r].intra_out or self.caps[r].all_out for r in ranks])
            into = np.array([self.caps[r].intra_in or self.caps[r].all_in for r in ranks])
            moved = np.maximum(np.maximum(sent - CUT_SLACK_BYTES, 0.0) / cap_out,
                               np.maximum(recv - CUT_SLACK_BYTES, 0.0) / into)
            gap = np.full(tp, float(gap.min()) + max(0, ch.delay_ns) + float(moved.min()))
        out = int(math.floor(float(gap.min())))
        self._tp[key] = out
        return out

    def template_sent(self, ch: Choice, kind: str, nbytes: int) -> np.ndarray:
        """Bytes each member (position) of a templated collective sends between its gate flows
        and its tails (descendants of one of its gates that are ancestors of one of its
        tails), counted on the lowered template."""
        assert ch.layout is not None
        key = (ch.algorithm, kind, ch.layout, nbytes, ch.channels, ch.chunks)
        hit = self._sent.get(key)
        if hit is None:
            t = lower(ch.algorithm, kind, ch.layout, nbytes, ch.channels, ch.chunks)
            hit = gated_sent_bytes(t)
            self._sent[key] = hit
        return hit

    def template_moved(self, ch: Choice, kind: str, nbytes: int
                       ) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each member (position) of a templated collective sends, and receives, in
        flows that follow some member's gate and precede (or are) one of its own tails
        (:func:`tail_bytes`), counted on the lowered template."""
        assert ch.layout is not None
        key = (ch.algorithm, kind, ch.layout, nbytes, ch.channels, ch.chunks)
        hit = self._moved.get(key)
        if hit is None:
            t = lower(ch.algorithm, kind, ch.layout, nbytes, ch.channels, ch.chunks)
            hit = tail_bytes(t)
            self._moved[key] = hit
        return hit

    # ---- PP ---------------------------------------------------------------------------------
    def transfer_ns(self, src: tuple[str, int, int], dst: tuple[str, int, int], nbytes: int,
                    method: str) -> int:
        """A lower bound (ns) on a pipeline transfer of ``nbytes`` from the TP group ``src``
        (group, first device, tp) to ``dst``: the least, over destination ranks, of the bytes
        sent into the rank over its incoming capacity from where the senders sit."""
        key = (self.offset[src[0]] + src[1], src[2], self.offset[dst[0]] + dst[1], dst[2],
               nbytes, method)
        hit = self._xfer.get(key)
        if hit is None:
            hit = self._transfer_ns(src, dst, nbytes, method)
            self._xfer[key] = hit
        return hit

    def _transfer_ns(self, src: tuple[str, int, int], dst: tuple[str, int, int], nbytes: int,
                     method: str) -> int:
        (ga, la, a), (gb, lb, b) = src, dst
        trs = reshard_transfers(a, b, nbytes, method)
        side = [[self.full_rank(ga, la + k) for k in range(a)],
                [self.full_rank(gb, lb + k) for k in range(b)]]
        best = math.inf
        for j in range(b):
            y = side[DEST][j]
            into = [t for t in trs if t.dst_side == DEST and t.dst_idx == j
                    and side[t.src_side][t.src_idx] != y]
            if not into:
                return 0
            same = {bool(self.info.server[side[t.src_side][t.src_idx]] == self.info.server[y])
                    for t in into}
            cp = self.caps[y]
            cap = (cp.intra_in if same == {True} else cp.inter_in if same == {False}
                   else cp.all_in) or cp.all_in
            best = min(best, max(0, sum(t.bytes for t in into) - CUT_SLACK_BYTES) / cap)
        return 0 if math.isinf(best) else int(math.floor(best))

    # ---- DP ---------------------------------------------------------------------------------
    def dp_choice(self, members: Sequence[int] | np.ndarray, kind: str, nbytes: int
                  ) -> Choice:
        """The algorithm the generator gives a DP ring ``kind`` of ``nbytes`` over ``members``
        (this plan's ranks), cached by the ring's shape as the generator does."""
        info = self.info
        mem = np.asarray(members, dtype=np.int64)
        key = (kind, tuple(info.group[mem]), tuple(np.unique(info.server[mem],
                                                             return_inverse=True)[1]),
               tuple(info.local[mem]), nbytes)
        hit = self._choice.get(key)
        if hit is None:
            hit = choose_algorithm(self.plan, info, [int(x) for x in members], kind, nbytes)
            self._choice[key] = hit
        return hit

    def crossing_bytes(self, kind: str, ring: bool, n: int, here: int, nbytes: int,
                       entering: bool) -> int:
        """Bytes a DP collective over n members must move out of (``entering``: into) a server
        holding ``here`` of them (0 < here < n), per member ``nbytes``.

        A ring crosses the server's boundary at least once in each direction on each channel,
        and a ring edge carries ring_steps(kind, n) segments of floor(channel bytes / n). Any
        other algorithm moves what the collective's result needs at least: an all-reduce every
        element once (the server's combined contribution out, or its result in), a
        reduce-scatter the other members' shards out, an all-gather the server's missing
        shards in (and its own shards out)."""
        if here <= 0 or here >= n or nbytes <= 0:
            return 0
        if ring:
            got = ring_steps(kind, n) * (nbytes // n - self.max_channels)
        elif kind == "all_reduce":
            got = nbytes
        elif kind == "reduce_scatter":
            got = (n - here) * (nbytes // n) if not entering else 0
        else:  # all_gather
            got = (n - here if entering else here) * (nbytes // n)
        return max(0, got - CUT_SLACK_BYTES)


def _reach(t: RingFlows) -> Callable[[list[int], bool], np.ndarray]:
    """``reach(seeds, down)``: the entries of template ``t`` reachable from ``seeds`` (the seeds
    included) along its edges (``down``) or against them."""
    size = t.size
    succ: list[list[int]] = [[] for _ in range(size)]
    pred: list[list[int]] = [[] for _ in range(size)]
    for a, b in zip(t.pred.tolist(), t.succ.tolist(), strict=True):
        succ[a].append(b)
        pred[b].append(a)

    def reach(seeds: list[int], down: bool) -> np.ndarray:
        adj = succ if down else pred
        seen = np.zeros(size, dtype=bool)
        stack = [s for s in seeds if not seen[s]]
        seen[stack] = True
        while stack:
            u = stack.pop()
            for v in adj[u]:
                if not seen[v]:
                    seen[v] = True
                    stack.append(v)
        return seen

    return reach


def gated_sent_bytes(t: RingFlows) -> np.ndarray:
    """Per member position of template ``t``: the bytes of the flows it sends that depend on
    one of its gate flows (``t.start``) and precede one of its tails (``t.tails``). Those
    flows start after the member's gate opens and end before its tails do."""
    n = t.start.shape[2]
    reach = _reach(t)
    out = np.zeros(n, dtype=np.int64)
    for m in range(n):
        down = reach(np.unique(t.start[0, :, m]).tolist(), True)
        up = reach(np.unique(t.tails[0, :, m, :]).tolist(), False)
        out[m] = int(t.nbytes[down & up & (t.src == m)].sum())
    return out


def tail_bytes(t: RingFlows) -> tuple[np.ndarray, np.ndarray]:
    """Per member position m of template ``t``: the bytes of the flows m sends, and of those
    it receives, that depend on some member's gate flow and precede (or are) one of m's tails.

    They are moved after the earliest member's gate opens and before m's tails end, through
    m's outgoing (sent) and incoming (received) links; so from a common lower bound on the
    members' compute ends (every TP rank of a stage runs the same units) m's next op waits at
    least the gate delay plus either count over that capacity. This counts more than
    :func:`gated_sent_bytes` where m's later sends wait on flows into m, not on its own gate
    (NVLS's phase B: 2x the bytes)."""
    n = t.start.shape[2]
    reach = _reach(t)
    down = reach(np.unique(t.start[0]).tolist(), True)
    dst = t.op_dst()
    sent = np.zeros(n, dtype=np.int64)
    recv = np.zeros(n, dtype=np.int64)
    for m in range(n):
        up = down & reach(np.unique(t.tails[0, :, m, :]).tolist(), False)
        sent[m] = int(t.nbytes[up & (t.src == m)].sum())
        recv[m] = int(t.nbytes[up & (dst == m)].sum())
    return sent, recv
