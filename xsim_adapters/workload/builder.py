"""Accumulating ops, edges and collectives in bulk (numpy chunks), and tiling templates.

Ops get dense ids in the order they are added. A :class:`BulkBuilder` is used twice: as the
global builder of a trace, and to build a *template* (one stage's forward or backward block for
one micro-batch, with local rank indices) that :meth:`BulkBuilder.add_tiled` then instantiates
for every micro-batch at once with id, rank and collective offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..trace.schema import COLLECTIVE_COLUMNS, DEP_COLUMNS, OP_COLUMNS

_OP_DEFAULTS: dict[str, Any] = {
    "dst": -1,
    "bytes": 0,
    "duration_ns": 0,
    "flops": 0.0,
    "replica": -1,
    "stage": -1,
    "microbatch": -1,
    "layer_start": -1,
    "layer_stop": -1,
    "collective": -1,
    "step": -1,
    "channel": -1,
}
_OP_COLS = [c for c in OP_COLUMNS if c != "op_id"]
_COLL_COLS = [c for c in COLLECTIVE_COLUMNS if c != "collective"]
_COLL_DEFAULTS: dict[str, Any] = {
    "channels": 1,
    "sync_group": -1,
    "layer_start": -1,
    "layer_stop": -1,
    "chunk": -1,
}


#: Ops plus edges per batch of :meth:`BulkBuilder.add_tiled` (its temporaries are ~40 bytes
#: per op and per edge of a batch: ~10 MB, whatever the number of copies).
TILE_BATCH_ROWS = 1 << 18


def _column(value: Any, n: int, dtype: Any) -> np.ndarray:
    arr = np.asarray(value, dtype=object) if dtype is object else np.asarray(value)
    if arr.ndim == 0:
        return np.full(n, value, dtype=dtype)
    arr = arr.reshape(-1)
    if len(arr) != n:
        raise ValueError(f"column of length {len(arr)} for {n} ops")
    return arr.astype(dtype, copy=False)


def _take(cols: dict[str, Any], names: list[str], defaults: dict[str, Any],
          what: str) -> list[tuple[str, Any]]:
    """(name, value) for every column in ``names``: given, else its default, else an error;
    a column not in ``names`` is an error too (checked before anything is appended)."""
    out = []
    for c in names:
        if c in cols:
            out.append((c, cols.pop(c)))
        elif c in defaults:
            out.append((c, defaults[c]))
        else:
            raise TypeError(f"{what}: column {c!r} is required")
    if cols:
        raise TypeError(f"{what}: unknown columns {sorted(cols)}")
    return out


@dataclass
class Template:
    """A frozen block of ops with local ids, local ranks and local collective ids."""

    cols: dict[str, np.ndarray]
    pred: np.ndarray
    succ: np.ndarray
    colls: dict[str, np.ndarray]

    @property
    def num_ops(self) -> int:
        return len(self.cols["kind"])

    @property
    def num_collectives(self) -> int:
        return len(self.colls["kind"])


class BulkBuilder:
    """Collects op columns, dependency edges and collective rows as numpy chunks."""

    def __init__(self) -> None:
        self._ops: dict[str, list[np.ndarray]] = {c: [] for c in _OP_COLS}
        self._pred: list[np.ndarray] = []
        self._succ: list[np.ndarray] = []
        self._colls: dict[str, list[np.ndarray]] = {c: [] for c in _COLL_COLS}
        self.num_ops = 0
        self.num_collectives = 0

    def add_ops(self, n: int, **cols: Any) -> np.ndarray:
        """Append ``n`` ops; each column is a scalar or an array of length n. Returns ids."""
        for c, v in _take(cols, _OP_COLS, _OP_DEFAULTS, "add_ops"):
            self._ops[c].append(_column(v, n, OP_COLUMNS[c]))
        ids = np.arange(self.num_ops, self.num_ops + n, dtype=np.int64)
        self.num_ops += n
        return ids

    def add_edges(self, pred: Any, succ: Any) -> None:
        """Append edges pred -> succ (arrays broadcast against each other)."""
        p, s = np.broadcast_arrays(
            np.asarray(pred, dtype=np.int64), np.asarray(succ, dtype=np.int64)
        )
        if p.size:  # kept as the trace stores them: int32 (fewer than 2^31 ops)
            self._pred.append(p.reshape(-1).astype(np.int32))
            self._succ.append(s.reshape(-1).astype(np.int32))

    def add_edges_valid(self, pred: Any, succ: Any) -> None:
        """As :meth:`add_edges`, skipping the pairs where either id is negative (padding)."""
        p, s = np.broadcast_arrays(
            np.asarray(pred, dtype=np.int64), np.asarray(succ, dtype=np.int64)
        )
        keep = (p >= 0) & (s >= 0)
        if keep.any():
            self._pred.append(p[keep].astype(np.int32))
            self._succ.append(s[keep].astype(np.int32))

    def add_collectives(self, n: int, **cols: Any) -> np.ndarray:
        """Append ``n`` collective rows; returns their ids."""
        for c, v in _take(cols, _COLL_COLS, _COLL_DEFAULTS, "add_collectives"):
            self._colls[c].append(_column(v, n, COLLECTIVE_COLUMNS[c]))
        ids = np.arange(self.num_collectives, self.num_collectives + n, dtype=np.int64)
        self.num_collectives += n
        return ids

    def freeze(self) -> Template:
        """This builder's content as a template (local ids)."""
        return Template(
            cols=self._op_arrays(),
            pred=_cat(self._pred, np.int64),
            succ=_cat(self._succ, np.int64),
            colls={c: _cat(v, COLLECTIVE_COLUMNS[c]) for c, v in self._colls.items()},
        )

    def add_tiled(
        self,
        tpl: Template,
        copies: int,
        rank_map: np.ndarray,
        per_copy: dict[str, np.ndarray],
        rank_label: dict[str, str],
    ) -> np.ndarray:
        """Instantiate ``tpl`` ``copies`` times; returns the base op id of every copy.

        ``rank_map`` maps local rank indices to global ranks (for ``rank`` and ``dst``);
        ``per_copy`` gives op columns that are constant within a copy (e.g. microbatch);
        ``rank_label`` maps the template's local ``ranks`` strings to global ones.
        """
        t, nc = tpl.num_ops, tpl.num_collectives
        base = self.num_ops + np.arange(copies, dtype=np.int64) * t
        # copies in batches, so the 64-bit temporaries of one call stay a bounded size
        batch = max(1, TILE_BATCH_ROWS // max(1, t + len(tpl.pred)))
        mapped = {c: np.where(tpl.cols[c] >= 0, rank_map[np.maximum(tpl.cols[c], 0)], -1)
                  for c in ("rank", "dst") if c in tpl.cols}
        labels = (np.array([rank_label[x] for x in tpl.colls["ranks"]], dtype=object)
                  if nc and "ranks" in tpl.colls else None)
        for lo in range(0, copies, batch):
            k = min(batch, copies - lo)
            cols: dict[str, Any] = {}
            for c, arr in tpl.cols.items():
                if c in per_copy:
                    cols[c] = np.repeat(np.asarray(per_copy[c])[lo:lo + k], t)
                elif c in mapped:
                    cols[c] = np.tile(mapped[c], k)
                elif c == "collective":
                    coll_base = (self.num_collectives
                                 + np.arange(k, dtype=np.int64) * nc)
                    local = np.tile(arr.astype(np.int64), k)
                    cols[c] = np.where(local >= 0, local + np.repeat(coll_base, t), -1)
                else:
                    cols[c] = np.tile(arr, k)
            self.add_ops(t * k, **cols)
            del cols
            if len(tpl.pred):
                off = np.repeat(base[lo:lo + k], len(tpl.pred))
                self.add_edges(np.tile(tpl.pred, k) + off, np.tile(tpl.succ, k) + off)
                del off
            if nc:
                ccols: dict[str, Any] = {}
                for c, arr in tpl.colls.items():
                    ccols[c] = np.tile(labels if c == "ranks" and labels is not None
                                       else arr, k)
                self.add_collectives(nc * k, **ccols)
        return base

    def _op_arrays(self) -> dict[str, np.ndarray]:
        return {c: _cat(v, OP_COLUMNS[c]) for c, v in self._ops.items()}

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(ops, deps, collectives) frames with the schema's columns and dtypes."""
        ops = {"op_id": np.arange(self.num_ops, dtype=np.int64)}
        for c in _OP_COLS:  # column by column, each one's chunks released once joined
            ops[c] = _drain(self._ops[c], OP_COLUMNS[c])
        ops_df = pd.DataFrame(ops, columns=list(OP_COLUMNS), copy=False)
        del ops
        pred = _drain(self._pred, np.int32)
        succ = _drain(self._succ, np.int32)
        deps = pd.DataFrame({"pred": pred, "succ": succ}, columns=list(DEP_COLUMNS), copy=False)
        colls = {"collective": np.arange(self.num_collectives, dtype=np.int32)}
        colls.update({c: _cat(v, COLLECTIVE_COLUMNS[c]) for c, v in self._colls.items()})
        colls_df = pd.DataFrame(colls, columns=list(COLLECTIVE_COLUMNS))
        for c, t in COLLECTIVE_COLUMNS.items():
            if t is object:  # pandas >= 3 would infer its str dtype; the schema says object
                colls_df[c] = colls_df[c].astype(object)
        return ops_df, deps, colls_df


def _cat(chunks: list[np.ndarray], dtype: Any) -> np.ndarray:
    if not chunks:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(chunks).astype(dtype, copy=False)


def _drain(chunks: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The chunks joined into one array of ``dtype``, and the list emptied. A single chunk of
    that dtype (a template tiled in one batch) is returned as it is, not copied; otherwise the
    peak is the chunks plus the joined column, as for :func:`_cat`."""
    if len(chunks) == 1 and chunks[0].dtype == dtype:
        return chunks.pop()
    out = _cat(chunks, dtype)
    chunks.clear()
    return out
