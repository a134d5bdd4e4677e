"""Export a trace as GOAL text (the schedule format of LogGOPSim / ATLAHS).

Mapping: a compute op is ``calc <duration_ns>`` on its rank; a barrier is ``calc <its delay>``
(0 for a plain join); a flow is a ``send <bytes>b to <dst> tag <t>`` on its source and the
matching ``recv <bytes>b from <src> tag <t>`` on its destination (``t`` = the flow's op id, so
every message has its own tag). GOAL dependencies are local to a rank, so an edge pred -> succ
becomes ``succ requires pred`` on the rank where succ starts (a flow starts on its source) when
pred has a vertex there (its own op, or the send/recv of a flow touching that rank); otherwise
pred's rank sends a 0-byte notification message to succ's rank after pred completes, and succ
requires its receipt. A flow's start latency (trace schema 2: NCCL's cost before its first
byte) is a ``calc <latency>`` on its source that the send requires and that takes over the
flow's dependencies (:func:`.latency.latency_as_barriers`). Calc times are in ns. The file is
written atomically.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._atomic import write_text_atomic
from .latency import latency_as_barriers
from .schema import KIND_FLOW, Trace
from .slowdowns import refuse_export
from .validate import validate_trace

NOTIFY_TAG_BASE = 1 << 40  # notification tags, above every op id


@dataclass
class RankProgram:
    """One rank's local schedule: vertices and local dependencies (labels are ints)."""

    # (label, kind: "calc" | "send" | "recv", bytes, peer rank, tag, duration_ns, op_id)
    vertices: list[tuple[int, str, int, int, int, int, int]] = field(default_factory=list)
    requires: list[tuple[int, int]] = field(default_factory=list)  # (label, required label)


def rank_programs(trace: Trace, latency_per_member: bool = False) -> dict[int, RankProgram]:
    """Per-rank local schedules of ``trace`` (the mapping in the module docstring).

    Labels: ``2*op_id`` for an op's vertex on its owner (a flow's send), ``2*op_id + 1`` for a
    flow's recv, labels from ``2*num_ops`` on for notification messages (op_id -1); a flow's
    start latency is the calc of a barrier numbered after the trace's ops (with
    ``latency_per_member`` one per collective and member, as the Chakra export writes them).
    """
    trace = latency_as_barriers(trace, per_member=latency_per_member)
    ops = trace.ops
    n = len(ops)
    kind = ops["kind"].to_numpy()
    rank = np.maximum(ops["rank"].to_numpy().astype(np.int64), 0)  # owner-less barriers: rank 0
    dst = ops["dst"].to_numpy().astype(np.int64)
    nbytes = ops["bytes"].to_numpy()
    dur = ops["duration_ns"].to_numpy()
    is_flow = kind == KIND_FLOW
    progs: dict[int, RankProgram] = defaultdict(RankProgram)
    for op in range(n):
        r = int(rank[op])
        if is_flow[op]:
            d, b = int(dst[op]), int(nbytes[op])
            progs[r].vertices.append((2 * op, "send", b, d, op, 0, op))
            progs[d].vertices.append((2 * op + 1, "recv", b, r, op, 0, op))
        else:
            progs[r].vertices.append((2 * op, "calc", 0, -1, -1, int(dur[op]), op))
    pred = trace.deps["pred"].to_numpy()
    succ = trace.deps["succ"].to_numpy()
    where = rank[succ]
    local = rank[pred] == where
    via_recv = is_flow[pred] & (dst[pred] == where) & ~local
    for p, s in zip(pred[local].tolist(), succ[local].tolist(), strict=True):
        progs[int(rank[s])].requires.append((2 * s, 2 * p))
    for p, s in zip(pred[via_recv].tolist(), succ[via_recv].tolist(), strict=True):
        progs[int(rank[s])].requires.append((2 * s, 2 * p + 1))
    notified: dict[tuple[int, int], int] = {}
    label = 2 * n
    remote = ~local & ~via_recv
    for p, s in zip(pred[remote].tolist(), succ[remote].tolist(), strict=True):
        r = int(where[s])
        if (p, r) not in notified:
            # pred completes on its destination (flows) or its own rank (others)
            src = int(dst[p]) if is_flow[p] else int(rank[p])
            done = 2 * p + 1 if is_flow[p] else 2 * p
            tag = NOTIFY_TAG_BASE + label
            progs[src].vertices.append((label, "send", 0, r, tag, 0, -1))
            progs[src].requires.append((label, done))
            progs[r].vertices.append((label + 1, "recv", 0, src, tag, 0, -1))
            notified[(p, r)] = label + 1
            label += 2
        progs[r].requires.append((2 * s, notified[(p, r)]))
    return dict(progs)


def num_ranks_of(trace: Trace, progs: dict[int, RankProgram]) -> int:
    return len(trace.manifest.get("ranks", [])) or max(progs, default=-1) + 1


def goal_lines(trace: Trace) -> list[str]:
    """The GOAL schedule of ``trace`` as lines of text."""
    progs = rank_programs(trace)
    num_ranks = num_ranks_of(trace, progs)
    out = [f"num_ranks {num_ranks}"]
    for r in range(num_ranks):
        out.append("")
        out.append(f"rank {r} {{")
        prog = progs.get(r, RankProgram())
        for label, kind, b, peer, tag, dur, _ in prog.vertices:
            if kind == "calc":
                out.append(f"l{label}: calc {dur}")
            else:
                way = "to" if kind == "send" else "from"
                out.append(f"l{label}: {kind} {b}b {way} {peer} tag {tag}")
        out.extend(f"l{a} requires l{b}" for a, b in prog.requires)
        out.append("}")
    return out


def export_goal(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as a GOAL text file at ``path`` (atomically); returns the path."""
    validate_trace(trace)  # a cyclic or out-of-range trace is not exported
    refuse_export(trace.manifest, "goal")
    return write_text_atomic(path, "\n".join(goal_lines(trace)) + "\n")
