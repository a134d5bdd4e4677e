"""Export a trace as Chakra execution traces (ET), ASTRA-sim's workload input.

One protobuf file per rank, ``<prefix>.<rank>.et``, in Chakra's own schema (``et_def.proto``
of the ``mlc-chakra`` package, written with its ``protolib.encodeMessage``): a
``GlobalMetadata`` message, then the rank's nodes in a topological order (every dependency
names an earlier node of the same file). Every file has at least one node (a rank without
work gets one 0-duration ``COMP_NODE`` named ``idle``: ASTRA-sim aborts on a file with no
node to start from), and ``npus`` pads the export with such files for a topology of more
NPUs than the trace has ranks. Beside them ``comm_groups.json`` maps each process group name
used by a collective node (``pg_name``) to its ranks, the file ASTRA-sim takes as
``--comm-group-configuration``.

Mapping (``collectives="coll"``, the default):

- a compute op is a ``COMP_NODE``: ``duration_micros`` (the op's ``duration_ns`` rounded to
  whole microseconds, the schema's unit), ``num_ops`` (its model FLOPs), the exact
  ``duration_ns`` and ``op_kind`` "compute"; a barrier (a join, or a timed delay) is a
  ``COMP_NODE`` with its delay and ``op_kind`` "barrier";
- the flows of a ring collective (all-reduce, reduce-scatter, all-gather) become one
  ``COMM_COLL_NODE`` per member rank: ``comm_type``, ``comm_size`` (the collective's payload
  S per rank, bytes) and ``pg_name`` (its members): ASTRA-sim then runs its own collective
  algorithm over its own topology. The collective's own barriers (NVLS and tree joins, its
  members' NCCL delays) and its flows' start latencies are inside that node too: kept apart
  they form cycles through the node, and ASTRA-sim adds its own collective latency;
- a flow's start latency outside such a node (trace schema 2) is a ``COMP_NODE`` before its
  send, one per collective and member (a member's gate flows of every channel wait on the
  same one: :func:`.latency.latency_as_barriers` with ``per_member``), since ASTRA-sim runs a
  rank's compute nodes one at a time and would add per-channel delays up;
- every other flow (pipeline P2P, resharding) is a ``COMM_SEND_NODE`` on its source and a
  ``COMM_RECV_NODE`` on its destination with ``comm_src``, ``comm_dst``, ``comm_size``
  (bytes) and ``comm_tag`` (the flow's op id);
- a dependency becomes a ``data_deps`` entry on the rank where its successor starts, through
  the predecessor's node on that rank (its own node, the receive of a flow into the rank, or
  the rank's node of the predecessor's collective); any other cross-rank edge travels as a
  1-byte message marked ``notification`` (tags from the number of ops up; ASTRA-sim asserts
  a message has at least one byte), as in the GOAL export (:mod:`.export_goal`). Edges
  inside one collective disappear into its node.

With ``collectives="p2p"`` every flow, ring steps included, is a send/receive pair: our exact
schedule, the GOAL export's graph (with per-member latencies). Every node carries
``is_cpu_op`` = false and the trace's ``op_id`` (-1 for collective, notification and idle
nodes). Attribute value types are the ones Chakra's C++ feeder reads
(``comm_src``/``comm_dst``/``comm_tag`` int32, ``comm_size``, ``comm_type``, ``num_ops``
int64). The graph is held as numpy tables (:class:`ChakraGraphs`) and each rank's nodes are
made, encoded and written one rank at a time; files are written atomically.
"""

from __future__ import annotations

import heapq
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .._atomic import write_atomic, write_text_atomic
from ..errors import BackendUnavailable, XsimError
from .latency import latency_as_barriers
from .schema import KIND_BARRIER, KIND_FLOW, PHASES, Trace
from .slowdowns import refuse_export
from .validate import validate_trace

CHAKRA_HINT = 'pip install "xsim-adapters[chakra]"'
CHAKRA_ET_VERSION = "0.0.4"  # the GlobalMetadata version Chakra's own converters write
COMM_GROUPS_FILE = "comm_groups.json"
# Our ring collectives and Chakra's CollectiveCommType names (et_def.proto).
COLL_TYPES = {"all_reduce": "ALL_REDUCE", "reduce_scatter": "REDUCE_SCATTER",
              "all_gather": "ALL_GATHER"}
INT32_MAX = (1 << 31) - 1  # Chakra's feeder reads comm_src / comm_dst / comm_tag as int32
Mode = Literal["coll", "p2p"]

# Node keys: a kind code in the high bits, an id (op id, collective id or tag) below.
SHIFT = 40
OP, RECV, COLL, NSEND, NRECV, IDLE = range(6)
NOTIFY_BYTES = 1  # ASTRA-sim asserts chunk_size > 0: a notification carries one byte


@dataclass
class ChakraNode:
    """One node of a rank's Chakra graph, before encoding (``deps``: indices of earlier nodes
    of the same rank)."""

    type: str  # COMP_NODE | COMM_SEND_NODE | COMM_RECV_NODE | COMM_COLL_NODE
    name: str
    duration_ns: int = 0
    attrs: dict[str, tuple[str, Any]] = field(default_factory=dict)  # name -> (oneof, value)
    deps: list[int] = field(default_factory=list)


def import_chakra() -> tuple[Any, Any]:
    """(``et_def_pb2``, ``protolib``) of the mlc-chakra package, or BackendUnavailable."""
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils import protolib
    except ImportError:
        raise BackendUnavailable(
            "Chakra export needs the mlc-chakra package (and protobuf), which is not "
            f"installed: {CHAKRA_HINT}"
        ) from None
    return et_def_pb2, protolib


class ChakraGraphs:
    """The per-rank Chakra graphs of a trace as global numpy tables (every node and every
    rank-local edge), turned into one rank's nodes at a time (:meth:`nodes_of`), so an export
    holds Python objects for one rank only. See the module docstring for the mapping."""

    def __init__(self, trace: Trace, collectives: Mode = "coll", npus: int | None = None):
        if collectives not in ("coll", "p2p"):
            raise XsimError(f"collectives: expected one of coll, p2p (got {collectives!r})")
        self.mode = collectives
        trace = latency_as_barriers(trace, per_member=True)
        self.trace = trace
        ops = trace.ops
        n = self.n = len(ops)
        if n and n + 2 * len(trace.deps) > INT32_MAX:
            raise XsimError(f"trace too large for Chakra's int32 message tags ({n:,} ops)")
        self.kind = ops["kind"].to_numpy()
        self.rank = np.maximum(ops["rank"].to_numpy().astype(np.int64), 0)  # owner-less: 0
        self.dst = ops["dst"].to_numpy().astype(np.int64)
        self.nbytes = ops["bytes"].to_numpy()
        self.dur = ops["duration_ns"].to_numpy()
        self.flops = ops["flops"].to_numpy()
        self.phase = ops["phase"].to_numpy()
        self.coll_id = ops["collective"].to_numpy().astype(np.int64)
        self.is_flow = self.kind == KIND_FLOW
        self.ctab = trace.collectives.set_index("collective") if len(trace.collectives) else None
        self._fold()
        self._edges(trace)
        ranks = len(trace.manifest.get("ranks", [])) or int(self.node_rank.max(initial=-1)) + 1
        if npus is not None and npus < ranks:
            raise XsimError(f"npus: must be at least the trace's {ranks} ranks (got {npus})")
        self.num_ranks = max(ranks, npus or 0)
        self._by_rank()

    def _fold(self) -> None:
        """``coll_of`` (per op: the ring collective it is folded into, -1: none; in ``coll``
        mode a ring collective's flows and its own barriers: joins, start latencies) and
        each folded collective's members (the ranks its flows touch)."""
        n = self.n
        self.coll_of = np.full(n, -1, dtype=np.int64)
        if self.mode == "coll" and self.ctab is not None:
            ring = [int(c) for c, k in self.ctab["kind"].items() if k in COLL_TYPES]
            mask = np.isin(self.coll_id, ring) & (self.is_flow | (self.kind == KIND_BARRIER))
            self.coll_of[mask] = self.coll_id[mask]
        f = np.flatnonzero(self.is_flow & (self.coll_of >= 0))
        pairs = np.unique(np.concatenate([self.coll_of[f] << 24 | self.rank[f],
                                          self.coll_of[f] << 24 | self.dst[f]]))
        self.member_keys = pairs  # collective << 24 | rank, sorted
        self.m_coll, self.m_rank = pairs >> 24, pairs & ((1 << 24) - 1)
        folded = np.flatnonzero(self.coll_of >= 0)
        out = ~np.isin(self.coll_of[folded] << 24 | self.rank[folded], pairs)
        if out.any():
            op = int(folded[np.flatnonzero(out)[0]])
            raise XsimError(f"op {op}: rank {self.rank[op]} of collective {self.coll_of[op]} "
                            "sends and receives nothing in it; export with collectives='p2p'")
        cs, first = np.unique(self.coll_of[folded], return_index=True)
        self.first_op = dict(zip(cs.tolist(), folded[first].tolist(), strict=True))
        groups: dict[tuple[int, ...], str] = {}
        self.pg_of: dict[int, str] = {}
        bounds = np.flatnonzero(np.diff(self.m_coll)) + 1
        for c, mem in zip(self.m_coll[np.r_[0, bounds]].tolist() if len(pairs) else [],
                          np.split(self.m_rank, bounds) if len(pairs) else [], strict=True):
            self.pg_of[c] = groups.setdefault(tuple(mem.tolist()), str(len(groups) + 1))
        self.groups = {pg: list(mem) for mem, pg in groups.items()}

    def _local(self, p: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Per (pred op ``p``, rank ``w``): the key of the node on ``w`` after which ``p`` is
        done there (its collective's, its own, the receive of a flow into ``w``), -1: none."""
        c = self.coll_of[p]
        out = np.full(len(p), -1, dtype=np.int64)
        fold = c >= 0
        member = np.isin(np.where(fold, c, 0) << 24 | w, self.member_keys) & fold
        out[member] = COLL << SHIFT | c[member]
        own = ~fold & (self.rank[p] == w)
        out[own] = OP << SHIFT | p[own]
        into = ~fold & ~own & self.is_flow[p] & (self.dst[p] == w)
        out[into] = RECV << SHIFT | p[into]
        return out

    def _edges(self, trace: Trace) -> None:
        """Nodes (rank, key, order) and rank-local edges (rank, successor key, pred key):
        every dependency on the rank where its successor starts, through the predecessor's
        node there, else through a notification (1 byte) from where the predecessor ends."""
        n, c = self.n, self.coll_of
        pred = trace.deps["pred"].to_numpy().astype(np.int64)
        succ = trace.deps["succ"].to_numpy().astype(np.int64)
        w = self.rank[succ]
        a = np.where(c[succ] >= 0, COLL << SHIFT | c[succ], OP << SHIFT | succ)
        b = self._local(pred, w)
        # notifications: one per (pred, rank) in order of first use, tags from n up
        miss = np.flatnonzero(b < 0)
        pw = pred[miss] * (self.num_ranks_hint(w)) + w[miss]
        uniq, first, inv = np.unique(pw, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank_of = np.empty(len(uniq), dtype=np.int64)
        rank_of[order] = np.arange(len(uniq))
        tag = n + rank_of[inv]
        np_ = pred[miss][first[order]]  # per notification: its pred, in tag order
        nw = w[miss][first[order]]
        nsrc = np.where(self.is_flow[np_] & (c[np_] < 0), self.dst[np_], self.rank[np_])
        done = self._local(np_, nsrc)
        assert (done >= 0).all()
        self.note_src, self.note_dst = nsrc, nw
        ntag = n + np.arange(len(np_))
        b = b.copy()
        b[miss] = NRECV << SHIFT | tag
        keep = a != b
        self.e_rank = np.concatenate([w[keep], nsrc])
        self.e_succ = np.concatenate([a[keep], NSEND << SHIFT | ntag])
        self.e_pred = np.concatenate([b[keep], done])
        # nodes: (rank, key, order0, order1); a notification's send stands after what it
        # follows, its receive before its first successor
        plain = np.flatnonzero(c < 0)
        pf = plain[self.is_flow[plain]]
        first_succ = succ[miss][first[order]]
        coll_first = np.array([self.first_op[int(x)] for x in self.m_coll.tolist()],
                              dtype=np.int64)
        done_o0 = done & ((1 << SHIFT) - 1)
        at = np.flatnonzero(done >> SHIFT == COLL)
        done_o0[at] = [self.first_op[int(x)] for x in done_o0[at].tolist()]
        self.node_rank = np.concatenate([self.rank[plain], self.dst[pf], self.m_rank, nsrc, nw])
        self.node_key = np.concatenate([OP << SHIFT | plain, RECV << SHIFT | pf,
                                        COLL << SHIFT | self.m_coll, NSEND << SHIFT | ntag,
                                        NRECV << SHIFT | ntag])
        self.node_o0 = np.concatenate([plain, pf, coll_first, done_o0, first_succ])
        self.node_o1 = np.concatenate([np.zeros(len(plain), np.int64), np.ones(len(pf), np.int64),
                                       np.zeros(len(self.m_coll), np.int64), 2 + ntag,
                                       np.full(len(ntag), -1, np.int64)])

    def num_ranks_hint(self, w: np.ndarray) -> int:
        """A multiplier above every rank (to pack (op, rank) pairs into one int64)."""
        return int(max(self.rank.max(initial=0), self.dst.max(initial=0), w.max(initial=0))) + 1

    def _by_rank(self) -> None:
        self.n_order = np.argsort(self.node_rank, kind="stable")
        self.n_bounds = np.searchsorted(self.node_rank[self.n_order],
                                        np.arange(self.num_ranks + 1))
        self.e_order = np.argsort(self.e_rank, kind="stable")
        self.e_bounds = np.searchsorted(self.e_rank[self.e_order], np.arange(self.num_ranks + 1))

    def nodes_of(self, r: int) -> Iterator[ChakraNode]:
        """Rank ``r``'s nodes in a topological order (ties: trace order), made one at a time;
        a rank without work gets one 0-duration compute node (ASTRA-sim needs a node to
        start from)."""
        sel = self.n_order[self.n_bounds[r]:self.n_bounds[r + 1]]
        keys = self.node_key[sel]
        srt = np.argsort(keys, kind="stable")
        keys, sel = keys[srt], sel[srt]
        es = self.e_order[self.e_bounds[r]:self.e_bounds[r + 1]]
        si = np.searchsorted(keys, self.e_succ[es])
        pi = np.searchsorted(keys, self.e_pred[es])
        uniq = np.unique(si * max(len(keys), 1) + pi)
        si, pi = uniq // max(len(keys), 1), uniq % max(len(keys), 1)
        order = _topological(len(keys), si, pi, self.node_o0[sel], self.node_o1[sel], r)
        if not len(order):
            return iter([ChakraNode("COMP_NODE", "idle", 0, {
                "num_ops": ("int64_val", 0), "duration_ns": ("int64_val", 0),
                "op_kind": ("string_val", "idle"), "op_id": ("int64_val", -1)})])
        pos = np.empty(len(keys), dtype=np.int64)
        pos[order] = np.arange(len(order))
        deps: list[list[int]] = [[] for _ in range(len(keys))]
        for s, p in zip(pos[si].tolist(), pos[pi].tolist(), strict=True):
            deps[s].append(p)
        return (self._node(int(keys[i]), sorted(deps[pos[i]])) for i in order.tolist())

    def _node(self, key: int, deps: list[int]) -> ChakraNode:
        code, ident = key >> SHIFT, key & ((1 << SHIFT) - 1)
        if code == COLL:
            c = ident
            ckind = str(self.ctab.loc[c, "kind"])  # type: ignore[union-attr]
            return ChakraNode("COMM_COLL_NODE",
                              f"{PHASES[self.phase[self.first_op[c]]]}:{ckind}:c{c}", 0, {
                                  "comm_type": ("int64_val", COLL_TYPES[ckind]),
                                  "comm_size": ("int64_val",
                                                int(self.ctab.loc[c, "bytes"])),  # type: ignore[union-attr]
                                  "pg_name": ("string_val", self.pg_of[c]),
                                  "collective": ("int64_val", c),
                                  "op_id": ("int64_val", -1)}, deps)
        if code in (NSEND, NRECV):
            i = ident - self.n
            note = {"comm_src": ("int32_val", int(self.note_src[i])),
                    "comm_dst": ("int32_val", int(self.note_dst[i])),
                    "comm_size": ("int64_val", NOTIFY_BYTES), "comm_tag": ("int32_val", ident),
                    "op_id": ("int64_val", -1), "collective": ("int64_val", -1),
                    "notification": ("bool_val", True)}
            return ChakraNode("COMM_SEND_NODE" if code == NSEND else "COMM_RECV_NODE",
                              f"notify{ident}", 0, note, deps)
        op = ident
        ph = PHASES[self.phase[op]]
        if self.is_flow[op]:
            comm = {"comm_src": ("int32_val", int(self.rank[op])),
                    "comm_dst": ("int32_val", int(self.dst[op])),
                    "comm_size": ("int64_val", int(self.nbytes[op])),
                    "comm_tag": ("int32_val", op), "op_id": ("int64_val", op),
                    "collective": ("int64_val", int(self.coll_id[op]))}
            if code == RECV:
                return ChakraNode("COMM_RECV_NODE", f"{ph}:recv{op}", 0, comm, deps)
            return ChakraNode("COMM_SEND_NODE", f"{ph}:send{op}", 0, comm, deps)
        what = "barrier" if self.kind[op] == KIND_BARRIER else "compute"
        return ChakraNode("COMP_NODE", f"{ph}:{what}{op}", int(self.dur[op]), {
            "num_ops": ("int64_val", int(round(float(self.flops[op])))),
            "duration_ns": ("int64_val", int(self.dur[op])),
            "op_kind": ("string_val", what),
            "op_id": ("int64_val", op)}, deps)


def chakra_graphs(trace: Trace, collectives: Mode = "coll", npus: int | None = None
                  ) -> tuple[dict[int, list[ChakraNode]], dict[str, list[int]]]:
    """Every rank's Chakra nodes of ``trace`` in emission (topological) order, and the
    process groups ``{pg_name: ranks}`` the collective nodes name (all in memory: for tests
    and small traces; :func:`export_chakra` streams one rank at a time)."""
    g = ChakraGraphs(trace, collectives, npus)
    return {r: list(g.nodes_of(r)) for r in range(g.num_ranks)}, g.groups


def _topological(k: int, si: np.ndarray, pi: np.ndarray, o0: np.ndarray, o1: np.ndarray,
                 r: int) -> np.ndarray:
    """Indices 0..k-1 in dependency order (edges pi -> si; ties by (o0, o1)); XsimError
    on a cycle."""
    indeg = np.bincount(si, minlength=k).tolist()
    srt = np.argsort(pi, kind="stable")
    bounds = np.searchsorted(pi[srt], np.arange(k + 1)).tolist()
    users = si[srt].tolist()
    a0, a1 = o0.tolist(), o1.tolist()
    heap = [(a0[i], a1[i], i) for i in range(k) if not indeg[i]]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        i = heapq.heappop(heap)[2]
        out.append(i)
        for u in users[bounds[i]:bounds[i + 1]]:
            indeg[u] -= 1
            if not indeg[u]:
                heapq.heappush(heap, (a0[u], a1[u], u))
    if len(out) != k:
        raise XsimError(f"rank {r}: the Chakra graph has a dependency cycle (collapsing a "
                        "collective's flows into one node); export with collectives='p2p'")
    return np.asarray(out, dtype=np.int64)


def encode_rank(nodes: Iterable[ChakraNode], r: int, num_ranks: int, trace: Trace,
                collectives: Mode) -> bytes:
    """The ``.et`` bytes of one rank: GlobalMetadata, then the nodes (ids 0..N-1)."""
    pb, protolib = import_chakra()
    buf = io.BytesIO()
    meta = pb.GlobalMetadata(version=CHAKRA_ET_VERSION, attr=[
        pb.AttributeProto(name="schema", string_val=f"xsim-adapters trace "
                          f"v{trace.manifest.get('schema_version', 1)}"),
        pb.AttributeProto(name="rank", int64_val=r),
        pb.AttributeProto(name="num_ranks", int64_val=num_ranks),
        pb.AttributeProto(name="plan_name", string_val=str(trace.manifest.get("plan_name", ""))),
        pb.AttributeProto(name="plan_digest",
                          string_val=str(trace.manifest.get("plan_digest", ""))),
        pb.AttributeProto(name="collectives", string_val=collectives),
        pb.AttributeProto(name="comm_groups_file", string_val=COMM_GROUPS_FILE),
    ])
    protolib.encodeMessage(buf, meta)
    types = {t: pb.NodeType.Value(t) for t in
             ("COMP_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE", "COMM_COLL_NODE")}
    for i, node in enumerate(nodes):
        msg = pb.Node(id=i, name=node.name, type=types[node.type], data_deps=node.deps)
        if node.type == "COMP_NODE":
            msg.duration_micros = int(round(node.duration_ns / 1000))
        attrs = [pb.AttributeProto(name="is_cpu_op", bool_val=False)]
        for name, (oneof, value) in node.attrs.items():
            if name == "comm_type":
                value = pb.CollectiveCommType.Value(value)
            attrs.append(pb.AttributeProto(name=name, **{oneof: value}))
        msg.attr.extend(attrs)
        protolib.encodeMessage(buf, msg)
    return buf.getvalue()


def export_chakra(trace: Trace, directory: str | os.PathLike[str], prefix: str = "et",
                  collectives: Mode = "coll", npus: int | None = None) -> list[Path]:
    """Write ``<directory>/<prefix>.<rank>.et`` for every rank (``npus``: for that many NPUs,
    the ranks beyond the trace's with one idle node) and ``comm_groups.json``; returns the
    ``.et`` paths in rank order. One rank's nodes are in memory at a time. Needs the
    ``mlc-chakra`` package."""
    import_chakra()  # fail before any work when the package is missing
    validate_trace(trace)  # a cyclic or out-of-range trace is not exported
    refuse_export(trace.manifest, "chakra")
    graphs = ChakraGraphs(trace, collectives, npus)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(graphs.num_ranks):
        data = encode_rank(graphs.nodes_of(r), r, graphs.num_ranks, trace, collectives)
        paths.append(write_atomic(root / f"{prefix}.{r}.et", _bytes_writer(data)))
    write_text_atomic(root / COMM_GROUPS_FILE, json.dumps(graphs.groups, indent=1) + "\n")
    return paths


def _bytes_writer(data: bytes) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)
    return write


def read_chakra(path: str | os.PathLike[str]) -> tuple[Any, list[Any]]:
    """(GlobalMetadata, [Node, ...]) of one ``.et`` file, read with Chakra's own protolib."""
    pb, protolib = import_chakra()
    with open(path, "rb") as fh:
        meta = pb.GlobalMetadata()
        if not protolib.decodeMessage(fh, meta):
            raise XsimError(f"{path}: not a Chakra ET file (no GlobalMetadata message)")
        nodes = []
        while True:
            node = pb.Node()
            if not protolib.decodeMessage(fh, node):
                break
            nodes.append(node)
    return meta, nodes
