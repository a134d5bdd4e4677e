"""Export a trace as GOAL text (the schedule format of LogGOPSim / ATLAHS).

Mapping: a compute op is ``calc <duration_ns>`` on its rank; a barrier is ``calc 0``; a flow
is a ``send <bytes>b to <dst> tag <t>`` on its source and the matching ``recv <bytes>b from
<src> tag <t>`` on its destination (``t`` = the flow's op id, so every message has its own
tag). GOAL dependencies are local to a rank, so an edge pred -> succ becomes ``succ requires
pred`` on the rank where succ starts (a flow starts on its source) when pred has a vertex
there (its own op, or the send/recv of a flow touching that rank); otherwise pred's rank
sends a 0-byte notification message to succ's rank after pred completes, and succ requires
its receipt. Calc times are in ns. The file is written atomically.
"""

from __future__ import annotations

import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from .schema import KIND_FLOW, Trace

NOTIFY_TAG_BASE = 1 << 40  # notification tags, above every op id


def goal_lines(trace: Trace) -> list[str]:
    """The GOAL schedule of ``trace`` as lines of text."""
    ops = trace.ops
    n = len(ops)
    kind = ops["kind"].to_numpy()
    rank = np.maximum(ops["rank"].to_numpy().astype(np.int64), 0)  # owner-less barriers: rank 0
    dst = ops["dst"].to_numpy().astype(np.int64)
    nbytes = ops["bytes"].to_numpy()
    dur = ops["duration_ns"].to_numpy()
    is_flow = kind == KIND_FLOW
    lines: dict[int, list[str]] = defaultdict(list)
    for op in range(n):
        r = int(rank[op])
        if is_flow[op]:
            d = int(dst[op])
            lines[r].append(f"l{2 * op}: send {int(nbytes[op])}b to {d} tag {op}")
            lines[d].append(f"l{2 * op + 1}: recv {int(nbytes[op])}b from {r} tag {op}")
        else:
            lines[r].append(f"l{2 * op}: calc {int(dur[op])}")
    pred = trace.deps["pred"].to_numpy()
    succ = trace.deps["succ"].to_numpy()
    where = rank[succ]
    local = rank[pred] == where
    via_recv = is_flow[pred] & (dst[pred] == where) & ~local
    for p, s in zip(pred[local].tolist(), succ[local].tolist(), strict=True):
        lines[int(rank[s])].append(f"l{2 * s} requires l{2 * p}")
    for p, s in zip(pred[via_recv].tolist(), succ[via_recv].tolist(), strict=True):
        lines[int(rank[s])].append(f"l{2 * s} requires l{2 * p + 1}")
    notified: dict[tuple[int, int], int] = {}
    label = 2 * n
    for p, s in zip(
        pred[~local & ~via_recv].tolist(), succ[~local & ~via_recv].tolist(), strict=True
    ):
        r = int(where[s])
        key = (p, r)
        if key not in notified:
            # pred completes on its destination (flows) or its own rank (others)
            src = int(dst[p]) if is_flow[p] else int(rank[p])
            done = 2 * p + 1 if is_flow[p] else 2 * p
            tag = NOTIFY_TAG_BASE + label
            lines[src].append(f"l{label}: send 0b to {r} tag {tag}")
            lines[src].append(f"l{label} requires l{done}")
            lines[r].append(f"l{label + 1}: recv 0b from {src} tag {tag}")
            notified[key] = label + 1
            label += 2
        lines[r].append(f"l{2 * s} requires l{notified[key]}")
    num_ranks = len(trace.manifest.get("ranks", [])) or int(max(lines, default=-1)) + 1
    out = [f"num_ranks {num_ranks}"]
    for r in range(num_ranks):
        out.append("")
        out.append(f"rank {r} {{")
        out.extend(lines.get(r, []))
        out.append("}")
    return out


def export_goal(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as a GOAL text file at ``path`` (atomically); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(goal_lines(trace)) + "\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
