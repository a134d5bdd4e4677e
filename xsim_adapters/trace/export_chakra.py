"""Export a trace as Chakra execution traces (ET), ASTRA-sim's workload input.

One protobuf file per rank, ``<prefix>.<rank>.et``, in Chakra's own schema (``et_def.proto``
of the ``mlc-chakra`` package, written with its ``protolib.encodeMessage``): a
``GlobalMetadata`` message, then the rank's nodes in a topological order (every dependency
names an earlier node of the same file). Beside them ``comm_groups.json`` maps each process
group name used by a collective node (``pg_name``) to its ranks, the file ASTRA-sim takes as
``--comm-group-configuration``.

Mapping (``collectives="coll"``, the default):

- a compute op is a ``COMP_NODE``: ``duration_micros`` (the op's ``duration_ns`` rounded to
  whole microseconds, the schema's unit), ``num_ops`` (its model FLOPs) and the exact
  ``duration_ns``; a barrier (a join, or a collective's latency) is a ``COMP_NODE`` with its
  delay, and so is a flow's start latency (trace schema 2), a ``COMP_NODE`` before the flow's
  node on its source (:func:`.latency.latency_as_barriers`);
- the flows of a ring collective (all-reduce, reduce-scatter, all-gather) become one
  ``COMM_COLL_NODE`` per member rank: ``comm_type``, ``comm_size`` (the collective's payload
  S per rank, bytes) and ``pg_name`` (its members): ASTRA-sim then runs its own collective
  algorithm over its own topology;
- every other flow (pipeline P2P, resharding) is a ``COMM_SEND_NODE`` on its source and a
  ``COMM_RECV_NODE`` on its destination with ``comm_src``, ``comm_dst``, ``comm_size``
  (bytes) and ``comm_tag`` (the flow's op id);
- a dependency becomes a ``data_deps`` entry on the rank where its successor starts, through
  the predecessor's node on that rank (its own node, the receive of a flow into the rank, or
  the rank's node of the predecessor's collective); any other cross-rank edge travels as a
  0-byte message (tags from the number of ops up), exactly as in the GOAL export
  (:mod:`.export_goal`). Edges inside one collective disappear into its node.

With ``collectives="p2p"`` every flow, ring steps included, is a send/receive pair: our exact
schedule, the same graph as the GOAL export. Every node carries ``is_cpu_op`` = false and the
trace's ``op_id`` (-1 for collective and notification nodes). Attribute value types are the
ones Chakra's C++ feeder reads (``comm_src``/``comm_dst``/``comm_tag`` int32, ``comm_size``,
``comm_type``, ``num_ops`` int64). Files are written atomically.
"""

from __future__ import annotations

import heapq
import io
import json
import os
from collections import defaultdict
from collections.abc import Callable
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

Key = tuple[str, int]  # ("op" | "recv" | "coll" | "nsend" | "nrecv", id)


@dataclass
class ChakraNode:
    """One node of a rank's Chakra graph, before encoding (``deps``: keys of this rank)."""

    key: Key
    type: str  # COMP_NODE | COMM_SEND_NODE | COMM_RECV_NODE | COMM_COLL_NODE
    name: str
    order: tuple[int, int]  # emission tie-break: (op id or collective's first op, sub-index)
    duration_ns: int = 0
    attrs: dict[str, tuple[str, Any]] = field(default_factory=dict)  # name -> (oneof, value)
    deps: set[Key] = field(default_factory=set)


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


def chakra_graphs(trace: Trace, collectives: Mode = "coll") -> tuple[
        dict[int, list[ChakraNode]], dict[str, list[int]]]:
    """Per-rank Chakra nodes of ``trace`` in emission (topological) order, and the process
    groups ``{pg_name: ranks}`` the collective nodes name. See the module docstring."""
    if collectives not in ("coll", "p2p"):
        raise XsimError(f"collectives: expected one of coll, p2p (got {collectives!r})")
    trace = latency_as_barriers(trace)
    ops = trace.ops
    n = len(ops)
    kind = ops["kind"].to_numpy()
    rank = np.maximum(ops["rank"].to_numpy().astype(np.int64), 0)  # owner-less barriers: 0
    dst = ops["dst"].to_numpy().astype(np.int64)
    nbytes = ops["bytes"].to_numpy()
    dur = ops["duration_ns"].to_numpy()
    flops = ops["flops"].to_numpy()
    phase = ops["phase"].to_numpy()
    coll_id = ops["collective"].to_numpy().astype(np.int64)
    is_flow = kind == KIND_FLOW
    ctab = trace.collectives.set_index("collective") if len(trace.collectives) else None
    coll_of = np.full(n, -1, dtype=np.int64)  # the ring collective a flow is collapsed into
    if collectives == "coll" and ctab is not None:
        ring = {int(c) for c, k in ctab["kind"].items() if k in COLL_TYPES}
        mask = is_flow & np.isin(coll_id, list(ring))
        coll_of[mask] = coll_id[mask]
    if n and n + 2 * len(trace.deps) > INT32_MAX:
        raise XsimError(f"trace too large for Chakra's int32 message tags ({n:,} ops)")

    graphs: dict[int, dict[Key, ChakraNode]] = defaultdict(dict)
    members: dict[int, set[int]] = defaultdict(set)
    for c in np.unique(coll_of[coll_of >= 0]).tolist():
        sel = coll_of == c
        members[c] = set(rank[sel].tolist()) | set(dst[sel].tolist())
    groups: dict[tuple[int, ...], str] = {}
    for c in sorted(members):
        groups.setdefault(tuple(sorted(members[c])), str(len(groups) + 1))
    first_op = {c: int(np.flatnonzero(coll_of == c)[0]) for c in members}
    for c in sorted(members):
        ckind = str(ctab.loc[c, "kind"]) if ctab is not None else ""
        pg = groups[tuple(sorted(members[c]))]
        for r in sorted(members[c]):
            graphs[r][("coll", c)] = ChakraNode(
                ("coll", c), "COMM_COLL_NODE", f"{PHASES[phase[first_op[c]]]}:{ckind}:c{c}",
                (first_op[c], 0), attrs={
                    "comm_type": ("int64_val", COLL_TYPES[ckind]),
                    "comm_size": ("int64_val", int(ctab.loc[c, "bytes"])),  # type: ignore[union-attr]
                    "pg_name": ("string_val", pg),
                    "collective": ("int64_val", c),
                    "op_id": ("int64_val", -1),
                })
    for op in range(n):
        if coll_of[op] >= 0:
            continue
        r, ph = int(rank[op]), PHASES[phase[op]]
        if is_flow[op]:
            d, size = int(dst[op]), int(nbytes[op])
            comm = {"comm_src": ("int32_val", r), "comm_dst": ("int32_val", d),
                    "comm_size": ("int64_val", size), "comm_tag": ("int32_val", op),
                    "op_id": ("int64_val", op), "collective": ("int64_val", int(coll_id[op]))}
            graphs[r][("op", op)] = ChakraNode(("op", op), "COMM_SEND_NODE",
                                               f"{ph}:send{op}", (op, 0), attrs=dict(comm))
            graphs[d][("recv", op)] = ChakraNode(("recv", op), "COMM_RECV_NODE",
                                                 f"{ph}:recv{op}", (op, 1), attrs=dict(comm))
        else:
            what = "barrier" if kind[op] == KIND_BARRIER else "compute"
            graphs[r][("op", op)] = ChakraNode(
                ("op", op), "COMP_NODE", f"{ph}:{what}{op}", (op, 0), int(dur[op]), attrs={
                    "num_ops": ("int64_val", int(round(float(flops[op])))),
                    "duration_ns": ("int64_val", int(dur[op])),
                    "op_id": ("int64_val", op),
                })

    def start(s: int) -> Key:
        return ("coll", int(coll_of[s])) if coll_of[s] >= 0 else ("op", s)

    def local(p: int, w: int) -> Key | None:
        """The node on rank ``w`` after which pred ``p`` is done there, if any."""
        if coll_of[p] >= 0:
            return ("coll", int(coll_of[p])) if w in members[int(coll_of[p])] else None
        if rank[p] == w:
            return ("op", p)
        if is_flow[p] and dst[p] == w:
            return ("recv", p)
        return None

    notified: dict[tuple[int, int], Key] = {}
    tag = n  # notification tags: above every op id
    pred = trace.deps["pred"].to_numpy().tolist()
    succ = trace.deps["succ"].to_numpy().tolist()
    for p, s in zip(pred, succ, strict=True):
        w = int(rank[s])
        a, b = start(s), local(p, w)
        if b is None:
            if (p, w) not in notified:
                # p completes on its destination (flows) or its own rank (others)
                src = int(dst[p]) if is_flow[p] else int(rank[p])
                done = local(p, src)
                assert done is not None
                note = {"comm_src": ("int32_val", src), "comm_dst": ("int32_val", w),
                        "comm_size": ("int64_val", 0), "comm_tag": ("int32_val", tag),
                        "op_id": ("int64_val", -1), "collective": ("int64_val", -1)}
                o = graphs[src][done].order
                graphs[src][("nsend", tag)] = ChakraNode(
                    ("nsend", tag), "COMM_SEND_NODE", f"notify{tag}", (o[0], 2 + tag),
                    attrs=dict(note), deps={done})
                graphs[w][("nrecv", tag)] = ChakraNode(
                    ("nrecv", tag), "COMM_RECV_NODE", f"notify{tag}", (s, -1), attrs=dict(note))
                notified[(p, w)] = ("nrecv", tag)
                tag += 1
            b = notified[(p, w)]
        if a != b:
            graphs[w][a].deps.add(b)
    num_ranks = len(trace.manifest.get("ranks", [])) or max(graphs, default=-1) + 1
    out = {r: _topological(graphs.get(r, {}), r) for r in range(num_ranks)}
    return out, {pg: list(ranks) for ranks, pg in groups.items()}


def _topological(nodes: dict[Key, ChakraNode], r: int) -> list[ChakraNode]:
    """``nodes`` in dependency order (ties by ``order``); XsimError on a cycle."""
    indeg = {k: len(v.deps) for k, v in nodes.items()}
    users: dict[Key, list[Key]] = defaultdict(list)
    for k, v in nodes.items():
        for d in v.deps:
            users[d].append(k)
    heap = [(v.order, k) for k, v in nodes.items() if not indeg[k]]
    heapq.heapify(heap)
    out: list[ChakraNode] = []
    while heap:
        _, k = heapq.heappop(heap)
        out.append(nodes[k])
        for u in users[k]:
            indeg[u] -= 1
            if not indeg[u]:
                heapq.heappush(heap, (nodes[u].order, u))
    if len(out) != len(nodes):
        raise XsimError(f"rank {r}: the Chakra graph has a dependency cycle (collapsing a "
                        "collective's flows into one node); export with collectives='p2p'")
    return out


def encode_rank(nodes: list[ChakraNode], r: int, num_ranks: int, trace: Trace,
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
    ids = {node.key: i for i, node in enumerate(nodes)}
    for i, node in enumerate(nodes):
        msg = pb.Node(id=i, name=node.name, type=pb.NodeType.Value(node.type),
                      data_deps=sorted(ids[d] for d in node.deps))
        if node.type == "COMP_NODE":
            msg.duration_micros = int(round(node.duration_ns / 1000))
        msg.attr.append(pb.AttributeProto(name="is_cpu_op", bool_val=False))
        for name, (oneof, value) in node.attrs.items():
            if name == "comm_type":
                value = pb.CollectiveCommType.Value(value)
            msg.attr.append(pb.AttributeProto(name=name, **{oneof: value}))
        protolib.encodeMessage(buf, msg)
    return buf.getvalue()


def export_chakra(trace: Trace, directory: str | os.PathLike[str], prefix: str = "et",
                  collectives: Mode = "coll") -> list[Path]:
    """Write ``<directory>/<prefix>.<rank>.et`` for every rank and ``comm_groups.json``;
    returns the ``.et`` paths in rank order. Needs the ``mlc-chakra`` package."""
    import_chakra()  # fail before any work when the package is missing
    validate_trace(trace)  # a cyclic or out-of-range trace is not exported
    refuse_export(trace.manifest, "chakra")
    graphs, groups = chakra_graphs(trace, collectives)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for r, nodes in graphs.items():
        data = encode_rank(nodes, r, len(graphs), trace, collectives)
        paths.append(write_atomic(root / f"{prefix}.{r}.et", _bytes_writer(data)))
    write_text_atomic(root / COMM_GROUPS_FILE, json.dumps(groups, indent=1) + "\n")
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
