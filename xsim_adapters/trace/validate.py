"""The one trace validator: every consumer (run, compare, export, backends) goes through it.

:func:`check_manifest` checks the manifest's shape and types before any file it names is
opened (group names become file names, so they must be names); :func:`validate_trace` checks
the frames against the manifest and each other: column dtypes, every value in its range, op
ids dense, ranks in range, edges between existing ops, and the dependency graph acyclic
(Kahn's algorithm, one numpy pass per level). Errors are :class:`TraceError` naming the
source (a file or ``<trace>``) and the field: ``DIR/manifest.json: ranks[3].group: ...``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import TraceError
from .schema import (
    COLLECTIVE_COLUMNS,
    DEP_COLUMNS,
    KIND_BARRIER,
    KIND_FLOW,
    KINDS,
    LAYER_EMBEDDING,
    OP_COLUMNS,
    PHASES,
    Trace,
)
from .slowdowns import check_slowdowns

# The plan's NAME_PATTERN (xsim_adapters/plan/_fields.py): a group name is a file name.
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_SHOWN = 80


def _shown(v: Any) -> str:
    text = repr(v) if not isinstance(v, list | dict) else f"a {type(v).__name__}"
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_manifest(m: Any, where: str) -> None:
    """The manifest's shape: a mapping with ``groups`` (names), ``ranks`` (records numbered
    0..R-1, each in a listed group), ``num_ops`` (a non-negative integer)."""
    if not isinstance(m, Mapping):
        raise TraceError(f"{where}: expected a JSON object (got a {type(m).__name__})")
    for key in ("groups", "ranks", "num_ops"):
        if key not in m:
            raise TraceError(f"{where}: {key}: required key is missing")
    groups = m["groups"]
    if not isinstance(groups, list):
        raise TraceError(f"{where}: groups: expected a list of names (got {_shown(groups)})")
    folded: set[str] = set()
    for i, g in enumerate(groups):
        if not isinstance(g, str) or not GROUP_NAME.fullmatch(g):
            raise TraceError(
                f"{where}: groups[{i}]: expected a group name matching {GROUP_NAME.pattern} "
                f"(got {_shown(g)})"
            )
        if g.lower() in folded:
            raise TraceError(f"{where}: groups[{i}]: group {g!r} is listed twice")
        folded.add(g.lower())
    num_ops = m["num_ops"]
    if not _is_int(num_ops) or num_ops < 0:
        raise TraceError(f"{where}: num_ops: expected a non-negative integer (got "
                         f"{_shown(num_ops)})")
    ranks = m["ranks"]
    if not isinstance(ranks, list):
        raise TraceError(f"{where}: ranks: expected a list of rank records (got {_shown(ranks)})")
    known = set(groups)
    for i, r in enumerate(ranks):
        at = f"{where}: ranks[{i}]"
        if not isinstance(r, Mapping):
            raise TraceError(f"{at}: expected an object with rank and group (got {_shown(r)})")
        for key in ("rank", "group"):
            if key not in r:
                raise TraceError(f"{at}.{key}: required key is missing")
        if not _is_int(r["rank"]) or r["rank"] != i:
            raise TraceError(f"{at}.rank: expected {i}, ranks are numbered in order "
                             f"(got {_shown(r['rank'])})")
        if r["group"] not in known if isinstance(r["group"], str) else True:
            raise TraceError(f"{at}.group: expected one of the manifest's groups "
                             f"(got {_shown(r['group'])})")
        for key in ("node", "local"):
            if key in r and (not _is_int(r[key]) or r[key] < 0):
                raise TraceError(f"{at}.{key}: expected a non-negative integer "
                                 f"(got {_shown(r[key])})")
    version = m.get("plan_digest")
    if version is not None and not isinstance(version, str):
        raise TraceError(f"{where}: plan_digest: expected a string (got {_shown(version)})")
    check_slowdowns(m, where, len(ranks))


def _dtypes(df: pd.DataFrame, columns: Mapping[str, Any], where: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TraceError(f"{where}: missing columns {', '.join(missing)}")
    for c, t in columns.items():
        want = np.dtype(t)
        if want == np.dtype(object):
            if len(df) and pd.api.types.infer_dtype(df[c], skipna=False) != "string":
                raise TraceError(f"{where}: column {c}: expected strings")
        elif df[c].dtype != want:
            raise TraceError(f"{where}: column {c}: dtype {df[c].dtype}, expected {want}")


def _bad_rows(where: str, column: str, mask: np.ndarray, values: np.ndarray, what: str) -> None:
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        raise TraceError(
            f"{where}: column {column}: expected {what} ({int(mask.sum())} rows are not; "
            f"the first is row {i} with {values[i]!r})"
        )


def validate_trace(trace: Trace, where: str = "<trace>") -> None:
    """Check every frame of ``trace`` against the schema and the manifest; TraceError if not.

    ``where`` names the trace in messages (its directory). Costs a few numpy passes over the
    ops and edges plus one pass per level of the dependency graph.
    """
    stamp = (id(trace.ops), id(trace.deps), id(trace.collectives), len(trace.ops),
             len(trace.deps))
    if getattr(trace, "_validated", None) == stamp:
        return  # this very trace passed already (e.g. read from disk, then replayed)
    check_manifest(trace.manifest, f"{where}/manifest.json" if where != "<trace>" else where)
    ops, deps, colls = trace.ops, trace.deps, trace.collectives
    ow, dw, cw = (f"{where}/groups", f"{where}/deps.parquet", f"{where}/collectives.parquet")
    _dtypes(ops, OP_COLUMNS, ow)
    _dtypes(deps, DEP_COLUMNS, dw)
    _dtypes(colls, COLLECTIVE_COLUMNS, cw)
    n, num_ranks = len(ops), len(trace.manifest["ranks"])
    if n != trace.manifest["num_ops"]:
        raise TraceError(f"{where}: num_ops: the manifest says {trace.manifest['num_ops']}, "
                         f"the group files hold {n} ops")
    col = {c: ops[c].to_numpy() for c in OP_COLUMNS}
    _bad_rows(ow, "op_id", col["op_id"] != np.arange(n), col["op_id"],
              f"dense op ids 0..{n - 1} in order")
    kind = col["kind"]
    _bad_rows(ow, "kind", (kind < 0) | (kind >= len(KINDS)), kind,
              f"an op kind 0..{len(KINDS) - 1} ({', '.join(KINDS)})")
    rank, dst = col["rank"], col["dst"]
    lo = np.where(kind == KIND_BARRIER, -1, 0)
    _bad_rows(ow, "rank", (rank < lo) | (rank >= num_ranks), rank,
              f"a rank 0..{num_ranks - 1} of the manifest (-1 for a barrier without owner)")
    flow = kind == KIND_FLOW
    _bad_rows(ow, "dst", flow & ((dst < 0) | (dst >= num_ranks)), dst,
              f"a flow destination rank 0..{num_ranks - 1}")
    _bad_rows(ow, "bytes", col["bytes"] < 0, col["bytes"], "non-negative byte counts")
    _bad_rows(ow, "duration_ns", col["duration_ns"] < 0, col["duration_ns"],
              "non-negative durations")
    fl = col["flops"]
    _bad_rows(ow, "flops", ~np.isfinite(fl) | (fl < 0), fl, "finite non-negative FLOPs")
    ph = col["phase"]
    _bad_rows(ow, "phase", (ph < 0) | (ph >= len(PHASES)), ph,
              f"a phase 0..{len(PHASES) - 1} ({', '.join(PHASES)})")
    for c in ("replica", "stage", "microbatch", "layer_stop", "collective", "step", "channel"):
        _bad_rows(ow, c, col[c] < -1, col[c], "-1 (none) or a non-negative index")
    _bad_rows(ow, "layer_start", col["layer_start"] < LAYER_EMBEDDING, col["layer_start"],
              f"{LAYER_EMBEDDING} (embedding), -1 (none) or a layer")
    if len(colls):
        ids = colls["collective"].to_numpy()
        used = col["collective"]
        known = np.isin(used, ids) | (used == -1)
        _bad_rows(ow, "collective", ~known, used, f"-1 or a collective id of {cw}")
    _check_deps(deps, n, dw)
    trace._validated = stamp  # type: ignore[attr-defined]


def _check_deps(deps: pd.DataFrame, n: int, where: str) -> None:
    pred = deps["pred"].to_numpy()
    succ = deps["succ"].to_numpy()
    for name, v in (("pred", pred), ("succ", succ)):
        _bad_rows(where, name, (v < 0) | (v >= n), v, f"an op id 0..{n - 1}")
    _bad_rows(where, "succ", pred == succ, succ, "an op other than pred (no self-loops)")
    left = cyclic_ops(pred, succ, n)
    if left:
        raise TraceError(
            f"{where}: the dependency edges form a cycle ({left} ops lie on or after one; "
            "a backend would wait forever)"
        )


# edges above which scipy's strongly connected components beat Kahn in numpy even with scipy's
# first import (0.17-0.33 s): Kahn measured 0.08-0.10 s at 0.3-0.5 M edges and 0.92 s at 3.7 M,
# scipy 0.01-0.12 s on the same graphs (shipped plans, one core). Used only without the compiled
# flow core, whose Kahn takes 1-53 ms on 0.16-5.2 M edges (shipped plans, one core).
SCC_MIN_EDGES = 1_000_000


def _native_unordered() -> Any:
    """The compiled flow core's Kahn (``xsim_flowcore.unordered_ops``), or None."""
    try:
        from xsim_flowcore import unordered_ops
    except ImportError:
        return None
    return unordered_ops


def cyclic_ops(pred: np.ndarray, succ: np.ndarray, n: int) -> int:
    """0 if the graph is a DAG, else a positive count of ops on or behind a cycle.

    With the compiled flow core installed (the README's install), its Kahn's algorithm in one
    linear pass; else :func:`acyclic_remainder` (Kahn in numpy, one pass per level) below
    :data:`SCC_MIN_EDGES` edges and scipy's strongly connected components above. All are
    exact about whether there is a cycle; the count in an error is the same in every process
    of one installation (Kahn's counts the ops behind a cycle too, scipy's only those on one).
    """
    back = pred > succ
    if not back.any():
        return 0  # op-id order is a topological order
    native = _native_unordered()
    if native is not None:
        if pred.dtype != succ.dtype or pred.dtype not in (np.int32, np.int64):
            pred, succ = pred.astype(np.int64), succ.astype(np.int64)
        return int(native(np.ascontiguousarray(pred), np.ascontiguousarray(succ), n))
    if len(pred) < SCC_MIN_EDGES:
        return acyclic_remainder(pred, succ, n)
    try:
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import connected_components
    except ImportError:
        return acyclic_remainder(pred, succ, n)
    graph = csr_matrix((np.ones(len(pred), dtype=np.int32), (pred, succ)), shape=(n, n))
    count, labels = connected_components(graph, directed=True, connection="strong")
    if count == n:
        return 0
    sizes = np.bincount(labels)
    return int(sizes[sizes > 1].sum())


def acyclic_remainder(pred: np.ndarray, succ: np.ndarray, n: int) -> int:
    """How many of the ``n`` ops Kahn's algorithm cannot order (0: the graph is a DAG).

    One numpy pass per level of the graph: the frontier's out-edges are gathered from a CSR
    layout, their targets' in-degrees decremented, and the targets that reach zero (each once)
    form the next frontier. Only ops in [min succ, max pred] of the backward edges (pred >
    succ) can lie on a cycle (a cycle's largest op leaves by a backward edge, its smallest is
    entered by one), so only that window is searched.
    """
    back = pred > succ
    if not back.any():
        return 0  # op-id order is a topological order
    lo, hi = int(succ[back].min()), int(pred[back].max())
    inside = (pred >= lo) & (pred <= hi) & (succ >= lo) & (succ <= hi)
    pred, succ, n = pred[inside] - lo, succ[inside] - lo, hi - lo + 1
    order = np.argsort(pred, kind="stable")
    targets = succ[order]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pred, minlength=n), out=offsets[1:])
    indeg = np.bincount(succ, minlength=n).astype(np.int64)
    stamp = np.zeros(n, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    done = 0
    while len(frontier):
        done += len(frontier)
        starts = offsets[frontier]
        counts = offsets[frontier + 1] - starts
        total = int(counts.sum())
        if total == 0:
            break
        # every out-edge of the frontier: the ranges [start, stop) concatenated
        idx = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)
        tg = targets[idx]
        np.subtract.at(indeg, tg, 1)
        cand = tg[indeg[tg] == 0]
        stamp[cand] = np.arange(len(cand))  # duplicates: the last write wins, keep that one
        frontier = cand[stamp[cand] == np.arange(len(cand))]
    return n - done
