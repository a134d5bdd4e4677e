"""Memory per op of the pipeline, measured with tracemalloc (bytes, not seconds).

Bounds on a mid-size shipped plan (hetero-pipeline-reshard, ~117 k ops): the trace held after
generation is what its schema's columns need (no per-op Python objects), generation peaks at
most 1.5 times that, and the metrics peak within a fixed number of bytes per op. The numbers
measured when these bounds were set are in benchmarks/README.md.
"""

from __future__ import annotations

import tracemalloc

from helpers import WORKLOADS

import xsim_adapters as xs
from xsim_adapters.metrics import compute_metrics

PLAN = WORKLOADS / "hetero-pipeline-reshard.yaml"
# measured 113 with the packed (rank, start) sort, one-at-a-time permutes and sliced edge scans
# (192 before them on trace schema 2; 321 before int32 deps, integer-time unions, rank-sliced
# unions and the scatter-based critical path; 477 before the metrics worked on columns)
METRICS_PEAK_B_PER_OP = 140


def _measure(fn):
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        val = fn()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return val, held - before, peak - before


def test_trace_bytes_per_op_are_its_columns():
    plan = xs.load_plan(PLAN)
    trace, held, peak = _measure(lambda: xs.generate(plan, "off"))
    n = trace.num_ops
    columns = (trace.ops.memory_usage(index=False, deep=False).sum()
               + trace.deps.memory_usage(index=False, deep=False).sum())
    # 64 bytes per op row (schema.OP_COLUMNS) + 8 per edge (int32 pred, succ), nothing on top
    assert trace.deps.memory_usage(index=False).sum() == 8 * len(trace.deps)
    assert trace.ops.memory_usage(index=False).sum() == 64 * n
    assert columns <= held <= columns + 8 * n + (4 << 20)
    # tiling in batches and columns joined once: the trace plus one joined column (1.34x
    # measured; 1.8x before)
    assert peak <= 1.5 * held


def test_metrics_peak_bytes_per_op():
    plan = xs.load_plan(PLAN)
    trace = xs.generate(plan, "off")
    tl = xs.run(trace, "flow", xs.build_topology(plan))
    _, _, peak = _measure(lambda: compute_metrics(trace, tl))
    assert peak / trace.num_ops <= METRICS_PEAK_B_PER_OP, peak / trace.num_ops
