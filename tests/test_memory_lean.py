"""The memory-lean paths of generation, routing and metrics give the results of the plain
computations they replace (benchmarks/bench_memory.py measures the memory)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import WORKLOADS

import xsim_adapters as xs
from xsim_adapters.metrics import straggler
from xsim_adapters.metrics.intervals import sort_consuming, sort_order
from xsim_adapters.trace.schema import is_dense_ids
from xsim_adapters.workload import builder


@pytest.mark.parametrize("seed", range(20))
def test_sort_order_is_lexsort_by_key_then_start_ties_in_input_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 3000))
    key = rng.integers(0, int(rng.integers(1, 40)), n).astype(np.int32)
    hi = int(10 ** rng.integers(1, 13))
    start = rng.integers(0, hi, n)  # int64: the packed path
    want = np.lexsort((np.arange(n), start, key))
    assert np.array_equal(sort_order(key, start), want)
    assert np.array_equal(sort_order(key, start.astype(np.float64)), want)  # two passes
    order, k, s = sort_consuming([key.copy(), start.copy()])
    assert np.array_equal(order, want)
    assert np.array_equal(k, key[want]) and k.dtype == key.dtype
    assert np.array_equal(s, start[want])


def test_sort_falls_back_when_the_pair_does_not_pack() -> None:
    """Negative starts, or key bits + start bits > 63: the two-pass sort, same order."""
    key = np.array([3, 1, 3, 1, 0], dtype=np.int64)
    for start in (np.array([5, -2, 1, 7, 0]), np.array([2**62, 1, 0, 2**61, 5])):
        want = np.lexsort((np.arange(5), start, key))
        assert np.array_equal(sort_order(key, start), want)
        order, k, s = sort_consuming([key.copy(), start.copy()])
        assert np.array_equal(order, want) and np.array_equal(s, start[want])


def test_is_dense_ids_across_slices() -> None:
    n = (1 << 20) + 5  # two slices
    ids = np.arange(n)
    assert is_dense_ids(ids) and is_dense_ids(ids[:0])
    ids[(1 << 20) + 2] += 1  # wrong only in the second slice
    assert not is_dense_ids(ids)
    assert not is_dense_ids(np.arange(1, 4))


def test_drain_joins_chunks_and_empties_the_list() -> None:
    chunks = [np.arange(3, dtype=np.int64), np.arange(5, 7, dtype=np.int64)]
    out = builder._drain(chunks, np.int32)
    assert out.tolist() == [0, 1, 2, 5, 6] and out.dtype == np.int32 and chunks == []
    one = [np.arange(4, dtype=np.int32)]
    assert builder._drain(one, np.int32).tolist() == [0, 1, 2, 3] and one == []
    assert len(builder._drain([], np.int64)) == 0


@pytest.fixture(scope="module")
def plan():
    return xs.load_plan(WORKLOADS / "hetero-pipeline-reshard.yaml")


def test_tiling_in_small_batches_gives_the_same_trace(plan, monkeypatch) -> None:
    """add_tiled in batches of a few copies: ops, edges and collectives identical."""
    whole = xs.generate(plan)
    monkeypatch.setattr(builder, "TILE_BATCH_ROWS", 7)
    small = xs.generate(plan)
    pd.testing.assert_frame_equal(small.ops, whole.ops)
    pd.testing.assert_frame_equal(small.deps, whole.deps)
    pd.testing.assert_frame_equal(small.collectives, whole.collectives)


def test_pred_end_max_in_edge_slices_matches_one_pass(plan, monkeypatch) -> None:
    trace = xs.generate(plan)
    n = trace.num_ops
    end = np.random.default_rng(3).random(n) * 1e6
    d = trace.deps
    want = np.zeros(n)
    np.maximum.at(want, d["succ"].to_numpy(), end[d["pred"].to_numpy()])
    some = np.arange(0, n, 7)
    monkeypatch.setattr(straggler, "_EDGE_SLICE", 1000)
    assert np.array_equal(straggler._pred_end_max(d, end, n), want)
    got = straggler._pred_end_max(d, end, n, some)
    assert np.array_equal(got[some], want[some])
    rest = np.setdiff1d(np.arange(n), some)
    assert not got[rest].any()
