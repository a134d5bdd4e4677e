"""Export a trace as Chakra execution traces (ASTRA-sim), one JSON file per rank.

Chakra's native encoding is protobuf (``et_def.proto``); to avoid that dependency this writes
the same node graph as JSON, one ``<prefix>.<rank>.json`` per rank, which ``chakra``'s
converters or a few lines of Python can turn into ``.et`` files. The local schedule is the
GOAL one (:func:`xsim_adapters.trace.export_goal.rank_programs`): compute and barrier ops are
``COMP_NODE`` (barriers with zero duration), a flow is a ``COMM_SEND_NODE`` on its source and
a ``COMM_RECV_NODE`` on its destination with ``comm_src``, ``comm_dst``, ``comm_size``
(bytes) and ``comm_tag`` attributes; dependencies are ``data_deps`` within the rank (remote
ones travel as 0-byte messages). Node ids are the GOAL labels. Files are written atomically.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._atomic import write_text_atomic
from .export_goal import RankProgram, num_ranks_of, rank_programs
from .schema import Trace
from .validate import validate_trace

SCHEMA = "chakra-et-json (xsim-adapters) 1"
_TYPES = {"calc": "COMP_NODE", "send": "COMM_SEND_NODE", "recv": "COMM_RECV_NODE"}


def chakra_nodes(trace: Trace) -> dict[int, list[dict[str, Any]]]:
    """Per-rank Chakra node lists (JSON-ready dicts) of ``trace``."""
    progs = rank_programs(trace)
    flops = trace.ops["flops"].to_numpy()
    names = {0: "compute", 2: "barrier"}
    kinds = trace.ops["kind"].to_numpy()
    out: dict[int, list[dict[str, Any]]] = {}
    for r in range(num_ranks_of(trace, progs)):
        prog = progs.get(r, RankProgram())
        deps: dict[int, list[int]] = {}
        for a, b in prog.requires:
            deps.setdefault(a, []).append(b)
        nodes = []
        for label, kind, nbytes, peer, tag, dur, op in prog.vertices:
            node: dict[str, Any] = {
                "id": label,
                "name": f"op{op}" if op >= 0 else f"notify{label}",
                "type": _TYPES[kind],
                "data_deps": sorted(deps.get(label, [])),
                "ctrl_deps": [],
                "duration_micros": dur / 1000.0,
                "attrs": {"op_id": op},
            }
            if kind == "calc":
                node["name"] = f"{names.get(int(kinds[op]), 'op')}{op}"
                node["attrs"]["num_ops"] = float(flops[op])
            else:
                src, dst = (r, peer) if kind == "send" else (peer, r)
                node["attrs"].update(comm_src=src, comm_dst=dst, comm_size=nbytes, comm_tag=tag)
            nodes.append(node)
        out[r] = nodes
    return out


def export_chakra(
    trace: Trace, directory: str | os.PathLike[str], prefix: str = "et"
) -> list[Path]:
    """Write ``<directory>/<prefix>.<rank>.json`` for every rank; returns the paths."""
    validate_trace(trace)  # a cyclic or out-of-range trace is not exported
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for r, nodes in chakra_nodes(trace).items():
        target = root / f"{prefix}.{r}.json"
        doc = {"schema": SCHEMA, "rank": r, "num_ranks": num_ranks_of(trace, {}), "nodes": nodes}
        paths.append(write_text_atomic(target, json.dumps(doc, separators=(",", ":"))))
    return paths
