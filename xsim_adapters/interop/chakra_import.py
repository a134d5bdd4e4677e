"""Import Chakra execution traces (ASTRA-sim's workload input) as a trace of ours.

``xsim import ET_DIR --plan PLAN.yaml -o TRACE_DIR`` (docs/trace.md, "Importing Chakra ET"):
the ET directory holds ``<prefix>.<rank>.et`` for ranks 0..N-1 (Chakra's protobuf schema, read
with Chakra's own ``protolib.decodeMessage``) and, when collective nodes name process groups,
``comm_groups.json`` (``{"<pg_name>": [ranks]}``, ASTRA-sim's ``--comm-group-configuration``).
The plan gives what an ET does not hold: the GPUs, their servers and the network
(``device_groups``, ``network``), NCCL's algorithm choices (``collectives``) and the manifest's
workload facts (tokens per iteration for tokens/s). Rank r of the ET is rank r of the plan.

Mapping (every node id, name and file is named in the error when a node is refused):

- ``COMP_NODE``: a compute op of ``duration_ns`` (the attribute xsim's export writes) or else
  ``duration_micros`` x 1000; ``num_ops`` gives its FLOPs. A node with ``op_kind`` "barrier"
  or "idle" (xsim's export: joins and start latencies) is a barrier of that delay.
- ``MEM_LOAD_NODE`` / ``MEM_STORE_NODE``: a compute op moving ``tensor_size`` bytes at the
  rank's HBM bandwidth (the plan's device type), or of ``duration_micros`` without a size.
- ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: matched by (``comm_src``, ``comm_dst``,
  ``comm_tag``), in file order for a repeated triple, with equal ``comm_size``: one flow of
  that many bytes, which starts when both the send's and the receive's dependencies are done
  (a rendezvous, as NCCL's send/recv). A pair marked ``notification`` (xsim's export: a
  dependency between ranks, 1 byte) is a zero-time barrier on the sender instead.
- ``COMM_COLL_NODE`` with ``comm_type`` ALL_REDUCE, REDUCE_SCATTER or ALL_GATHER, ``comm_size``
  bytes per rank, over the ranks of ``pg_name`` (no ``pg_name``: every rank of the ET): one
  collective, lowered as the generator lowers it (NCCL's algorithm choice, ring orders and
  channels, start latencies: :func:`xsim_adapters.workload.comm.emit.emit_lowered`). Members
  are matched by the ``collective`` attribute (xsim's export) or else the k-th node of a group
  on one rank is the k-th on every member, as NCCL orders calls on a communicator.
- ``data_deps`` and ``ctrl_deps``: edges from where the dependency ends on the rank (a
  collective: the member's last flows) to where the node starts (a collective: the member's
  first flows).
- Phases: a node name starting ``<phase>:`` (xsim's export) gives the op's phase; otherwise
  compute is ``fwd``, flows ``pp`` and collectives ``dp``.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TraceError
from ..plan.model import Plan
from ..trace.export_chakra import COLL_TYPES, COMM_GROUPS_FILE, import_chakra
from ..trace.schema import KIND_BARRIER, KIND_COMPUTE, KIND_FLOW, PHASE_INDEX, Trace
from ..trace.validate import validate_trace
from ..workload.coarsen import full
from ..workload.comm.emit import Emitter, emit_lowered
from ..workload.comm.rings import ring_delay_ns
from ..workload.comm.selection import choose_algorithm, lower_instances
from ..workload.manifest import manifest

KIND_OF = {v: k for k, v in COLL_TYPES.items()}  # Chakra's CollectiveCommType -> ours
MAX_GROUPS_BYTES = 1 << 26  # comm_groups.json: 64 MiB is far above any real group table
H_COMP, H_SEND, H_RECV, H_COLL = range(4)


@dataclass
class _Coll:
    """One collective instance: its kind, bytes per rank, members and the member nodes."""

    kind: str
    nbytes: int
    members: tuple[int, ...]
    phase: int
    where: str  # the first node seen, for messages
    handles: dict[int, int] = field(default_factory=dict)  # member rank -> node handle


@dataclass
class _Read:
    """What the files hold, as flat tables indexed by node handle."""

    h_type: list[int] = field(default_factory=list)
    h_rank: list[int] = field(default_factory=list)
    h_id: list[int] = field(default_factory=list)  # the node id in its rank's file
    files: list[Path] = field(default_factory=list)
    comp: list[tuple[int, int, int, float, int]] = field(default_factory=list)  # h, kind, ns,..
    sends: dict[tuple[int, int, int], list[tuple[int, int, bool, int]]] = field(
        default_factory=lambda: defaultdict(list))  # key -> [(h, bytes, notify, phase)]
    recvs: dict[tuple[int, int, int], list[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(list))  # key -> [(h, bytes)]
    colls: dict[tuple, _Coll] = field(default_factory=dict)
    deps: list[tuple[int, int]] = field(default_factory=list)  # (pred h, succ h)

    def where(self, h: int) -> str:
        """``FILE: node ID ('NAME')`` of node handle ``h`` (the name read again from its
        file: names are not kept, so a large ET costs no memory for them)."""
        pb, protolib = import_chakra()
        path, want, name = self.files[self.h_rank[h]], self.h_id[h], "?"
        with open(path, "rb") as fh:
            node = pb.Node()
            protolib.decodeMessage(fh, pb.GlobalMetadata())
            while protolib.decodeMessage(fh, node):
                if node.id == want:
                    name = node.name
                    break
                node = pb.Node()
        return _where(path, want, name)


def _where(path: Path, node_id: int, name: str) -> str:
    return f"{path}: node {node_id} ({name[:60]!r})"


def et_files(directory: Path, prefix: str | None) -> tuple[str, list[Path]]:
    """The prefix and the files ``<prefix>.0.et`` .. ``<prefix>.<N-1>.et`` of ``directory``."""
    if not directory.is_dir():
        raise TraceError(f"{directory}: not a directory of Chakra ET files")
    pat = re.compile(r"^(.*)\.(\d+)\.et$")
    found: dict[str, dict[int, Path]] = defaultdict(dict)
    for p in directory.iterdir():
        m = pat.match(p.name)
        if m and p.is_file():
            found[m.group(1)][int(m.group(2))] = p
    if prefix is None:
        if len(found) != 1:
            what = ", ".join(sorted(found)) or "none"
            raise TraceError(f"{directory}: expected the files of one ET prefix "
                             f"(<prefix>.<rank>.et), found prefixes: {what}; pass --prefix")
        prefix = next(iter(found))
    files = found.get(prefix, {})
    if not files:
        raise TraceError(f"{directory}: no {prefix}.<rank>.et files")
    missing = sorted(set(range(max(files) + 1)) - set(files))
    if missing:
        raise TraceError(f"{directory}: {prefix}.{missing[0]}.et is missing (ranks 0.."
                         f"{max(files)} need one file each)")
    return prefix, [files[r] for r in range(len(files))]


def _groups(path: Path | None, num_ranks: int) -> dict[str, tuple[int, ...]]:
    if path is None or not path.is_file():
        return {}
    with open(path, "rb") as fh:
        data = fh.read(MAX_GROUPS_BYTES + 1)
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a JSON object of process groups ({str(e)[:80]})") from None
    if not isinstance(raw, dict):
        raise TraceError(f"{path}: expected {{\"<pg_name>\": [ranks]}}")
    out = {}
    for name, ranks in raw.items():
        if (not isinstance(ranks, list) or not ranks
                or not all(isinstance(r, int) and 0 <= r < num_ranks for r in ranks)):
            raise TraceError(f"{path}: {name}: expected a list of ranks in 0..{num_ranks - 1} "
                             f"(got {str(ranks)[:60]})")
        out[str(name)] = tuple(sorted(set(ranks)))
    return out


def _attrs(node: Any) -> dict[str, Any]:
    out = {}
    for a in node.attr:
        which = a.WhichOneof("value")
        if which is not None:
            out[a.name] = getattr(a, which)
    return out


def _phase(name: str, default: str) -> int:
    head = name.split(":", 1)[0]
    return PHASE_INDEX.get(head, PHASE_INDEX[default]) if ":" in name else PHASE_INDEX[default]


def _read_rank(path: Path, r: int, num_ranks: int, plan: Plan, groups: dict[str, tuple],
               out: _Read, pb: Any, protolib: Any) -> None:
    """Stream one rank's file into ``out`` (see the module docstring)."""
    hbm = plan.device_types[plan.rank_info(r)[0].type].hbm_GBps if r < plan.num_ranks else 0
    seen: dict[int, int] = {}
    local_deps: list[tuple[int, int]] = []
    pg_count: dict[str, int] = defaultdict(int)
    with open(path, "rb") as fh:
        meta = pb.GlobalMetadata()
        if not protolib.decodeMessage(fh, meta):
            raise TraceError(f"{path}: not a Chakra ET file (no GlobalMetadata message)")
        node = pb.Node()
        while protolib.decodeMessage(fh, node):
            where = _Where(path, node)
            if node.id in seen:
                raise TraceError(f"{where}: node id {node.id} appears twice")
            a = _attrs(node)
            t = pb.NodeType.Name(node.type) if node.type in pb.NodeType.values() else node.type
            h = len(out.h_type)
            if r >= plan.num_ranks:  # padding to an ASTRA-sim NPU count (export --npus)
                if not (t == "COMP_NODE" and a.get("duration_ns", 0) == 0
                        and node.duration_micros == 0 and not node.data_deps):
                    raise TraceError(f"{where}: rank {r} is beyond the plan's {plan.num_ranks}"
                                     " GPUs (only idle padding nodes may be there)")
                node = pb.Node()
                continue
            if t in ("COMP_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE"):
                if t != "COMP_NODE" and a.get("tensor_size", 0) > 0 and hbm > 0:
                    ns = int(round(a["tensor_size"] / hbm))  # bytes / (GB/s) = ns
                elif "duration_ns" in a:
                    ns = int(a["duration_ns"])
                else:
                    ns = int(node.duration_micros) * 1000
                kind = KIND_BARRIER if a.get("op_kind") in ("barrier", "idle") else KIND_COMPUTE
                out.comp.append((h, kind, ns, float(a.get("num_ops", 0)),
                                 _phase(node.name, "fwd")))
                typ = H_COMP
            elif t in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
                send = t == "COMM_SEND_NODE"
                for k in ("comm_dst" if send else "comm_src", "comm_size", "comm_tag"):
                    if k not in a:
                        raise TraceError(f"{where}: {t} without {k}")
                src, dst = (r, int(a["comm_dst"])) if send else (int(a["comm_src"]), r)
                peer = dst if send else src
                if not 0 <= peer < num_ranks or peer == r:
                    raise TraceError(f"{where}: peer rank {peer} is not another rank of the "
                                     f"ET's {num_ranks}")
                key = (src, dst, int(a["comm_tag"]))
                if send:
                    out.sends[key].append((h, int(a["comm_size"]), bool(a.get("notification")),
                                           _phase(node.name, "pp")))
                else:
                    out.recvs[key].append((h, int(a["comm_size"])))
                typ = H_SEND if send else H_RECV
            elif t == "COMM_COLL_NODE":
                _read_coll(node, a, r, num_ranks, groups, pg_count, where, h, out, pb)
                typ = H_COLL
            else:
                raise TraceError(f"{where}: node type {t} is not supported (compute, memory, "
                                 "send, receive and collective nodes are)")
            seen[node.id] = h
            out.h_type.append(typ)
            out.h_rank.append(r)
            out.h_id.append(int(node.id))
            local_deps.extend((int(d), h) for d in (*node.data_deps, *node.ctrl_deps))
            node = pb.Node()
    for d, h in local_deps:
        if d not in seen:
            raise TraceError(f"{out.where(h)}: depends on node {d}, which is not in the file")
        out.deps.append((seen[d], h))


class _Where:
    """A node's place for a message, formatted only when one is raised."""

    def __init__(self, path: Path, node: Any) -> None:
        self.path, self.node = path, node

    def __str__(self) -> str:
        return _where(self.path, self.node.id, self.node.name)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _read_coll(node: Any, a: dict[str, Any], r: int, num_ranks: int,
               groups: dict[str, tuple], pg_count: dict[str, int], where: _Where, h: int,
               out: _Read, pb: Any) -> None:
    """One collective node: its instance (made on first sight) gets this member."""
    ctype = pb.CollectiveCommType.Name(a["comm_type"]) if "comm_type" in a else "(none)"
    if ctype not in KIND_OF:
        raise TraceError(f"{where}: collective {ctype} is not supported (ALL_REDUCE, "
                         "REDUCE_SCATTER and ALL_GATHER are)")
    if "comm_size" not in a:
        raise TraceError(f"{where}: COMM_COLL_NODE without comm_size")
    pg = str(a.get("pg_name", ""))
    if pg and pg not in groups:
        raise TraceError(f"{where}: process group {pg!r} is not in {COMM_GROUPS_FILE}")
    members = groups[pg] if pg else tuple(range(num_ranks))
    if r not in members:
        raise TraceError(f"{where}: rank {r} is not a member of process group {pg!r}")
    key: tuple = (pg, "c", int(a["collective"])) if "collective" in a else (pg, pg_count[pg])
    pg_count[pg] += 1
    kind, nbytes = KIND_OF[ctype], int(a["comm_size"])
    inst = out.colls.get(key)
    if inst is None:
        inst = out.colls[key] = _Coll(kind, nbytes, members, _phase(node.name, "dp"),
                                      str(where))
    elif (inst.kind, inst.nbytes) != (kind, nbytes) or r in inst.handles:
        raise TraceError(f"{where}: {ctype} of {nbytes} bytes does not match its peer "
                         f"{inst.where} ({inst.kind}, {inst.nbytes} bytes)")
    inst.handles[r] = h


def import_chakra_et(directory: str | os.PathLike[str], plan: Plan, prefix: str | None = None,
                     comm_groups: str | os.PathLike[str] | None = None) -> Trace:
    """The trace of the Chakra ET files in ``directory`` on ``plan``'s cluster (see the
    module docstring); TraceError naming the file and node for anything not supported."""
    pb, protolib = import_chakra()
    root = Path(directory)
    prefix, files = et_files(root, prefix)
    n = len(files)
    groups = _groups(Path(comm_groups) if comm_groups else root / COMM_GROUPS_FILE, n)
    rd = _Read(files=files)
    for r, path in enumerate(files):
        _read_rank(path, r, n, plan, groups, rd, pb, protolib)
    em = Emitter.for_plan(plan)
    h_op = np.full(len(rd.h_type), -1, dtype=np.int64)
    _emit_ops(em, rd, h_op)
    ends, starts = _emit_collectives(em, rd)
    _emit_edges(em, rd, h_op, ends, starts)
    ops, deps, colls = em.tb.frames()
    man = manifest(plan, full(plan, reason="imported"), em.chunks, ops["kind"].to_numpy(),
                   ops["phase"].to_numpy(), len(deps))
    man["generator"]["source"] = {"format": "chakra", "prefix": prefix, "files": n}
    trace = Trace(ops=ops, deps=deps, collectives=colls, manifest=man)
    validate_trace(trace, str(root))
    return trace


def _emit_ops(em: Emitter, rd: _Read, h_op: np.ndarray) -> None:
    """Compute ops and flows (matched send/receive pairs) into ``em.tb``; ``h_op`` gets the
    op of every node but collective ones."""
    rank = np.asarray(rd.h_rank, dtype=np.int64)
    if rd.comp:
        h, kind, ns, flops, phase = (np.asarray(x) for x in zip(*rd.comp, strict=True))
        h_op[h] = em.tb.add_ops(len(h), kind=kind, rank=rank[h], duration_ns=ns, flops=flops,
                                phase=phase, **_tags(em, rank[h]))
    for key in rd.recvs:
        if key not in rd.sends:
            h0 = rd.recvs[key][0][0]
            raise TraceError(f"{rd.where(h0)}: no send from rank {key[0]} with tag {key[2]}")
    pairs: list[tuple[int, int, int, int, int, bool, int]] = []
    for key, sends in rd.sends.items():
        recvs = rd.recvs.get(key, [])
        if len(recvs) != len(sends):
            h0 = (sends + [(-1, 0, False, 0)])[len(recvs)][0] if len(sends) > len(recvs) \
                else recvs[len(sends)][0]
            raise TraceError(f"{rd.where(h0)}: {len(sends)} send(s) but {len(recvs)} "
                             f"receive(s) of tag {key[2]} from rank {key[0]} to rank {key[1]}")
        for (h_s, size, note, ph), (h_r, rsize) in zip(sends, recvs, strict=True):
            if size != rsize:
                raise TraceError(f"{rd.where(h_r)}: receives {rsize} bytes, its send "
                                 f"{rd.where(h_s)} sends {size}")
            pairs.append((h_s, h_r, key[0], key[1], size, note, ph))
    if not pairs:
        return
    cols = np.asarray(pairs, dtype=np.int64)  # hs, hr, src, dst, bytes, notification, phase
    notify = cols[:, 5].astype(bool)
    ids = em.tb.add_ops(len(cols), kind=np.where(notify, KIND_BARRIER, KIND_FLOW),
                        rank=cols[:, 2], dst=np.where(notify, -1, cols[:, 3]),
                        bytes=np.where(notify, 0, cols[:, 4]), phase=cols[:, 6],
                        **_tags(em, cols[:, 2]))
    h_op[cols[:, 0]] = ids
    h_op[cols[:, 1]] = ids


def _tags(em: Emitter, ranks: np.ndarray) -> dict[str, Any]:
    """Replica and stage of each rank under the plan (-1 for ranks beyond it)."""
    ok = ranks < len(em.rank_replica)
    safe = np.where(ok, ranks, 0)
    return dict(replica=np.where(ok, em.rank_replica[safe], -1),
                stage=np.where(ok, em.rank_stage[safe], -1))


def _coll_tags(em: Emitter, phase: int, ranks: np.ndarray, _inst: np.ndarray
               ) -> dict[str, Any]:
    """Tag columns of a collective's ops on ``ranks``."""
    return dict(phase=phase, **_tags(em, ranks))


def _emit_collectives(em: Emitter, rd: _Read) -> tuple[dict[int, np.ndarray],
                                                       dict[int, np.ndarray]]:
    """Every collective, instances of one (kind, members, bytes) lowered together; returns
    per member node handle the ops it ends with and the ops it starts with."""
    plan, c = em.plan, em.plan.collectives
    batches: dict[tuple, list[_Coll]] = defaultdict(list)
    for inst in rd.colls.values():
        missing = sorted(set(inst.members) - set(inst.handles))
        if missing:
            raise TraceError(f"{inst.where}: {inst.kind} has no matching node on member "
                             f"rank {missing[0]}")
        if any(m >= plan.num_ranks for m in inst.members):
            raise TraceError(f"{inst.where}: a member is beyond the plan's {plan.num_ranks} "
                             "GPUs")
        batches[(inst.kind, inst.members, inst.nbytes, inst.phase)].append(inst)
    ends: dict[int, np.ndarray] = {}
    starts: dict[int, np.ndarray] = {}
    for (kind, members, nbytes, phase), insts in batches.items():
        k = len(insts)
        ranks = list(members)
        if len(ranks) < 2:  # a group of one moves nothing: a join on its rank
            ids = em.tb.add_ops(k, kind=KIND_BARRIER, rank=ranks[0], phase=phase,
                                **_tags(em, np.full(k, ranks[0])))
            for inst, op in zip(insts, ids.tolist(), strict=True):
                ends[inst.handles[ranks[0]]] = starts[inst.handles[ranks[0]]] = np.array([op])
            continue
        orders, sizes = em.ring(ranks, nbytes)
        pos = {rk: i for i, rk in enumerate(ranks)}
        perm = np.array([[[pos[rk] for rk in o] for o in orders]] * k, dtype=np.int64)
        mem = np.array([ranks] * k, dtype=np.int64)
        ch = choose_algorithm(plan, em.info, ranks, kind, nbytes)
        rf, algos, chans = lower_instances(
            mem, perm, np.array([sizes] * k, dtype=np.int64), np.full(k, nbytes), [ch] * k,
            kind, c.granularity, c.chunks, em.ring_label, len(orders))
        delay = (ch.delay_ns if ch.algorithm != "ring"
                 else ring_delay_ns(em.info, kind, orders, sizes) if c.nccl_cost else 0)
        coll = dict(n=k, kind=kind, phase=phase, bytes=nbytes,
                    ranks=",".join(map(str, orders[0])), algorithm=algos, channels=chans)
        tails, gates = emit_lowered(em.tb, rf, mem, delay, coll,
                                    partial(_coll_tags, em, phase))
        for i, inst in enumerate(insts):
            for m, rk in enumerate(ranks):
                h = inst.handles[rk]
                e, s = tails[i, :, m].reshape(-1), gates[i, :, m].reshape(-1)
                ends[h], starts[h] = e[e >= 0], s[s >= 0]
    return ends, starts


def _emit_edges(em: Emitter, rd: _Read, h_op: np.ndarray, ends: dict[int, np.ndarray],
                starts: dict[int, np.ndarray]) -> None:
    """The files' dependencies as edges between the ops the nodes became."""
    if not rd.deps:
        return
    p, s = (np.asarray(x, dtype=np.int64) for x in zip(*rd.deps, strict=True))
    plain = (h_op[p] >= 0) & (h_op[s] >= 0)
    po, so = h_op[p[plain]], h_op[s[plain]]
    keep = po != so  # a receive after its own send (one op)
    em.tb.add_edges(po[keep], so[keep])
    for a, b in zip(p[~plain].tolist(), s[~plain].tolist(), strict=True):
        pe = ends[a] if h_op[a] < 0 else h_op[a:a + 1]
        sb = starts[b] if h_op[b] < 0 else h_op[b:b + 1]
        if len(pe) and len(sb):
            em.tb.add_edges(pe[:, None], sb[None, :])


__all__ = ["et_files", "import_chakra_et"]
