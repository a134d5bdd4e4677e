"""Time the metrics and reports on a synthetic trace of the size of a 1,024-GPU plan.

Usage: python benchmarks/bench_metrics.py [--ranks 1024] [--ops-per-rank 1000]

The trace is synthetic (built with numpy, no generator or backend): per rank a chain of
compute ops alternating fwd/bwd, one tp flow per compute op to a TP peer, pp flows between
stages, and a dp ring step per rank at the end, so every metric path (unions, straggler
joins over deps, Perfetto cap, summarized picture) is exercised at scale.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from xsim_adapters.metrics import compute_metrics
from xsim_adapters.report import plot_timeline, write_perfetto
from xsim_adapters.trace.schema import (
    COLLECTIVE_COLUMNS,
    DEP_COLUMNS,
    OP_COLUMNS,
    PHASE_INDEX,
    Trace,
)
from xsim_adapters.trace.timeline import Timeline


def synthetic(ranks: int, per_rank: int, tp: int = 8, pp: int = 4) -> tuple[Trace, Timeline]:
    rng = np.random.default_rng(0)
    n_c = ranks * per_rank
    r_c = np.repeat(np.arange(ranks), per_rank)
    i_c = np.tile(np.arange(per_rank), ranks)
    dur = rng.integers(50_000, 150_000, n_c)
    gap = rng.integers(0, 20_000, n_c)
    step = (dur + gap).reshape(ranks, per_rank)
    start_c = (np.cumsum(step, axis=1) - step).ravel().astype(float)
    end_c = start_c + dur
    phase_c = np.where(i_c < per_rank // 2, PHASE_INDEX["fwd"], PHASE_INDEX["bwd"])
    # tp flow after each compute op to the next rank of the TP group
    peer = (r_c // tp) * tp + (r_c + 1) % tp
    start_t = end_c
    end_t = end_c + rng.integers(5_000, 30_000, n_c)
    # dp: one flow per rank at the end, ring over replicas of the same position
    stage_size = tp * pp
    dp_dst = (np.arange(ranks) + stage_size) % ranks
    last = end_t.reshape(ranks, per_rank)[:, -1]
    start_d = last
    end_d = last + 1e6
    n = n_c * 2 + ranks
    ops = pd.DataFrame({c: np.full(n, -1, dtype=t) if t is not object else None
                        for c, t in OP_COLUMNS.items()})
    ops["op_id"] = np.arange(n)
    ops["kind"] = np.concatenate([np.zeros(n_c), np.ones(n_c + ranks)]).astype(np.int8)
    ops["rank"] = np.concatenate([r_c, r_c, np.arange(ranks)]).astype(np.int32)
    ops["dst"] = np.concatenate([np.full(n_c, -1), peer, dp_dst]).astype(np.int32)
    ops["bytes"] = np.concatenate([np.zeros(n_c), np.full(n_c + ranks, 1 << 20)]).astype(np.int64)
    ops["duration_ns"] = np.concatenate([dur, np.zeros(n_c + ranks)]).astype(np.int64)
    ops["flops"] = np.concatenate([dur * 1e6, np.zeros(n_c + ranks)])
    ops["phase"] = np.concatenate([phase_c, np.full(n_c, PHASE_INDEX["tp"]),
                                   np.full(ranks, PHASE_INDEX["dp"])]).astype(np.int8)
    rep = (np.arange(ranks) // stage_size)
    stg = (np.arange(ranks) % stage_size) // tp
    ops["replica"] = np.concatenate([rep[r_c], rep[r_c], rep]).astype(np.int16)
    ops["stage"] = np.concatenate([stg[r_c], stg[r_c], stg]).astype(np.int16)
    ops["collective"] = np.concatenate([np.full(2 * n_c, -1), np.zeros(ranks)]).astype(np.int32)
    ops = ops.astype(OP_COLUMNS)
    comp_ids = np.arange(n_c).reshape(ranks, per_rank)
    chain = np.stack([comp_ids[:, :-1].ravel(), comp_ids[:, 1:].ravel()], axis=1)
    tpdep = np.stack([np.arange(n_c), np.arange(n_c) + n_c], axis=1)
    dpdep = np.stack([comp_ids[:, -1], 2 * n_c + np.arange(ranks)], axis=1)
    deps = pd.DataFrame(np.concatenate([chain, tpdep, dpdep]), columns=["pred", "succ"])
    deps = deps.astype(DEP_COLUMNS)
    colls = pd.DataFrame({c: pd.Series([], dtype=t) for c, t in COLLECTIVE_COLUMNS.items()})
    manifest = {
        "plan_name": "synthetic", "ranks": [
            {"rank": r, "group": "h100" if r < ranks // 2 else "a100", "node": r // 8,
             "device_type": "H100" if r < ranks // 2 else "A100"} for r in range(ranks)],
        "device_types": {"H100": {"peak_tflops": 989.0}, "A100": {"peak_tflops": 312.0}},
        "workload": {"tokens_per_iteration": 4 * 1024 * 1024},
    }
    frame = pd.DataFrame({"op_id": np.arange(n),
                          "start_ns": np.concatenate([start_c, start_t, start_d]),
                          "end_ns": np.concatenate([end_c, end_t, end_d])})
    return Trace(ops, deps, colls, manifest), Timeline("synthetic", frame)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--ops-per-rank", type=int, default=1000)
    a = ap.parse_args()
    t0 = time.perf_counter()
    trace, tl = synthetic(a.ranks, a.ops_per_rank)
    t1 = time.perf_counter()
    met = compute_metrics(trace, tl)
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        plot_timeline(Path(d) / "t.png", met.timeline, met.ranks)
        t3 = time.perf_counter()
        write_perfetto(Path(d) / "t.json", met.timeline, met.ranks)
        t4 = time.perf_counter()
    print(f"{trace.num_ops:,} ops, {len(trace.deps):,} deps, {a.ranks} ranks")
    print(f"build {t1 - t0:.2f}s  metrics {t2 - t1:.2f}s  png {t3 - t2:.2f}s  "
          f"perfetto {t4 - t3:.2f}s")


if __name__ == "__main__":
    main()
