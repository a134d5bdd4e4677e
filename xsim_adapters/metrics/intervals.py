"""Vectorized interval arithmetic per key (rank): union lengths and clipping.

Every function takes parallel arrays ``key`` (int), ``start`` and ``end`` (ns: int64 when both
are integers, the metrics' whole-ns times, else float64) and works on all keys at once with a
sort and a cumulative max, so a trace with millions of ops costs a few numpy passes, never a
Python loop per op, and a few bytes per interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def sort_order(key: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Indices sorting by (key, start), ties in input order: for non-negative integers whose
    bits fit in 63, one stable sort of the pair packed in an int64; else a stable sort by
    start, then a stable one by key.

    Faster than ``np.lexsort`` because the key pass runs on 16-bit keys (radix sort) when the
    keys fit, which they do for up to 32,767 ranks.
    """
    key = np.asarray(key)
    start = np.asarray(start)
    bits = _pack_bits(key, start)
    if bits is not None:
        # one stable sort of a packed (key, start) int64: the same order as the two passes
        # below (ties in original order), with one index array, not three
        packed = key.astype(np.int64) << bits
        packed |= start
        return np.argsort(packed, kind="stable")
    o = np.argsort(start, kind="stable")
    k = key[o]
    if len(k) and k.min() >= 0 and k.max() < 2**15:
        k = k.astype(np.int16)
    return o[np.argsort(k, kind="stable")]


def _pack_bits(key: np.ndarray, start: np.ndarray) -> int | None:
    """Bits of ``start`` in a packed (key, start) int64, or None if they do not both fit
    (negative or non-integer values, or more than 63 bits together)."""
    if not (len(key) and np.issubdtype(key.dtype, np.integer)
            and np.issubdtype(start.dtype, np.integer)):
        return None
    kmin, kmax = int(key.min()), int(key.max())
    smin, smax = int(start.min()), int(start.max())
    bits = smax.bit_length()
    if kmin < 0 or smin < 0 or kmax.bit_length() + bits > 63:
        return None
    return bits


def sort_consuming(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(order, key[order], start[order])`` for ``cols = [key, start]``, sorted as
    :func:`sort_order`; the list is emptied and, when the pair packs into an int64, the
    ``start`` array is overwritten with the packed pair (pass arrays nothing else uses).

    Leaner than :func:`sort_order` plus two gathers: the keys and starts are read back from
    the sorted packed pair, so at the peak only the packed pair, the order and the sort's
    buffer are held.
    """
    key, start = cols
    cols.clear()
    bits = _pack_bits(key, start)
    if bits is None:
        order = sort_order(key, start)
        return order, key[order], start[order]
    kdt = key.dtype
    packed = start.astype(np.int64, copy=False)
    del start
    packed |= key.astype(np.int64) << bits
    del key
    order = np.argsort(packed, kind="stable")
    packed = packed[order]
    k = (packed >> bits).astype(kdt)
    packed &= (1 << bits) - 1
    return order, k, packed


def union_blocks(
    key: np.ndarray, start: np.ndarray, end: np.ndarray, presorted: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge the intervals ``[start, end)`` of each key into disjoint blocks.

    Returns ``(key, lo, hi)`` arrays sorted by key then ``lo``; empty intervals are dropped and
    touching intervals are merged. ``presorted``: the input is already sorted by (key, start)
    (e.g. a masked subset of arrays ordered by :func:`sort_order`), which skips the sort.
    """
    key = np.asarray(key)
    if not np.issubdtype(key.dtype, np.integer):
        key = key.astype(np.int64)
    start, end = _same_dtype(start, end)
    keep = end > start
    if not keep.all():
        key, start, end = key[keep], start[keep], end[keep]
    del keep
    if len(key) == 0:
        return key, start, end
    if not presorted:
        order = sort_order(key, start)
        key, start, end = key[order], start[order], end[order]
        del order
    # Running max of end within each key: the right edge of the merged block so far.
    reach = _cummax_by_key(key, end)
    # A block starts at a new key or where the interval begins after everything before it ended.
    brk = np.empty(len(key), dtype=bool)
    brk[0] = True
    np.not_equal(key[1:], key[:-1], out=brk[1:])
    brk[1:] |= start[1:] > reach[:-1]
    del reach
    first = np.flatnonzero(brk)
    return key[first], start[first], np.maximum.reduceat(end, first)


def _same_dtype(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``start`` and ``end`` as one dtype: int64 when both are integers (times in whole ns,
    exact and half the work of a float copy), else float64."""
    start, end = np.asarray(start), np.asarray(end)
    if np.issubdtype(start.dtype, np.integer) and np.issubdtype(end.dtype, np.integer):
        return start.astype(np.int64, copy=False), end.astype(np.int64, copy=False)
    return start.astype(np.float64, copy=False), end.astype(np.float64, copy=False)


def _cummax_by_key(key: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The running max of ``end`` within each run of equal ``key`` (``key`` sorted).

    Integer times: one ``maximum.accumulate`` over ``end`` lifted by a per-key offset larger
    than any span of times, so an earlier key never reaches into a later one (exact); floats
    (or spans too wide for the lift): pandas' grouped cummax."""
    if np.issubdtype(end.dtype, np.integer) and len(end):
        lo = int(end.min())
        span = int(end.max()) - lo + 1
        kmin, kmax = int(key[0]), int(key[-1])
        if span * (kmax - kmin + 1) < 1 << 62:
            lift = (key.astype(np.int64) - kmin) * span - lo
            out = end + lift
            np.maximum.accumulate(out, out=out)
            out -= lift
            return out
    return pd.Series(end).groupby(key, sort=False).cummax().to_numpy()


def union_length(
    key: np.ndarray, start: np.ndarray, end: np.ndarray, num_keys: int,
    presorted: bool = False,
) -> np.ndarray:
    """Length (ns) of the union of the intervals ``[start, end)`` of each key 0..num_keys-1.

    Empty intervals (end <= start) contribute nothing. Returns float64 of length ``num_keys``.
    """
    k, lo, hi = union_blocks(key, start, end, presorted)
    return np.bincount(k, weights=(hi - lo).astype(np.float64),
                       minlength=num_keys).astype(np.float64)[:num_keys]


def clip(
    start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals clipped to ``[lo, hi]`` (element-wise); an interval outside becomes empty.
    Integer inputs stay int64 (times in whole ns), anything else is float64."""
    start, end = _same_dtype(start, end)
    lo, hi = _same_dtype(lo, hi)
    if start.dtype != lo.dtype:
        start, end = start.astype(np.float64), end.astype(np.float64)
        lo, hi = lo.astype(np.float64), hi.astype(np.float64)
    s = np.maximum(start, lo)
    e = np.minimum(end, hi)
    return s, np.maximum(e, s)
