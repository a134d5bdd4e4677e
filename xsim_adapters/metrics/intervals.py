"""Vectorized interval arithmetic per key (rank): union lengths and clipping.

Every function takes parallel arrays ``key`` (int), ``start`` and ``end`` (float, ns) and works
on all keys at once with a sort and a cumulative max, so a trace with millions of ops costs a
few numpy passes, never a Python loop per op.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def sort_order(key: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Indices sorting by (key, start): a stable sort by start, then a stable one by key.

    Faster than ``np.lexsort`` because the key pass runs on 16-bit keys (radix sort) when the
    keys fit, which they do for up to 32,767 ranks.
    """
    key = np.asarray(key)
    o = np.argsort(start, kind="stable")
    k = key[o]
    if len(k) and k.min() >= 0 and k.max() < 2**15:
        k = k.astype(np.int16)
    return o[np.argsort(k, kind="stable")]


def union_blocks(
    key: np.ndarray, start: np.ndarray, end: np.ndarray, presorted: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge the intervals ``[start, end)`` of each key into disjoint blocks.

    Returns ``(key, lo, hi)`` arrays sorted by key then ``lo``; empty intervals are dropped and
    touching intervals are merged. ``presorted``: the input is already sorted by (key, start)
    (e.g. a masked subset of arrays ordered by :func:`sort_order`), which skips the sort.
    """
    key = np.asarray(key, dtype=np.int64)
    start = np.asarray(start, dtype=np.float64)
    end = np.asarray(end, dtype=np.float64)
    keep = end > start
    key, start, end = key[keep], start[keep], end[keep]
    if len(key) == 0:
        return key, start, end
    if not presorted:
        order = sort_order(key, start)
        key, start, end = key[order], start[order], end[order]
    # Running max of end within each key: the right edge of the merged block so far.
    reach = pd.Series(end).groupby(key, sort=False).cummax().to_numpy()
    prev_reach = np.empty(len(key))
    prev_reach[0] = -np.inf
    prev_reach[1:] = reach[:-1]
    new_key = np.ones(len(key), dtype=bool)
    new_key[1:] = key[1:] != key[:-1]
    # A block starts at a new key or where the interval begins after everything before it ended.
    first = np.flatnonzero(new_key | (start > prev_reach))
    return key[first], start[first], np.maximum.reduceat(end, first)


def union_length(
    key: np.ndarray, start: np.ndarray, end: np.ndarray, num_keys: int,
    presorted: bool = False,
) -> np.ndarray:
    """Length (ns) of the union of the intervals ``[start, end)`` of each key 0..num_keys-1.

    Empty intervals (end <= start) contribute nothing. Returns float64 of length ``num_keys``.
    """
    k, lo, hi = union_blocks(key, start, end, presorted)
    return np.bincount(k, weights=hi - lo, minlength=num_keys).astype(np.float64)[:num_keys]


def clip(
    start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Intervals clipped to ``[lo, hi]`` (element-wise); an interval outside becomes empty."""
    s = np.maximum(np.asarray(start, dtype=np.float64), lo)
    e = np.minimum(np.asarray(end, dtype=np.float64), hi)
    return s, np.maximum(e, s)
