"""Benchmark sweeps: variants per second on the flow backend, in-process and with a pool.

Usage::

    python benchmarks/bench_sweep.py                              # homogeneous-h100, 8 variants
    python benchmarks/bench_sweep.py --plan workloads/uneven-layers.yaml --jobs 1 2 4

The 8 variants: training.schedule (gpipe, 1f1b) x training.micro_batch (1, 2) x
network.scale_out.link_gbps (100, 400). Prints, per ``jobs``, the wall seconds of the whole
sweep (process start-up included), variants/s, the mean per-variant wall seconds as measured
inside the workers, and whether the result frame equals the jobs=1 frame.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pandas as pd

from xsim_adapters.sweep import TIMING_COLUMNS, sweep

ROOT = Path(__file__).resolve().parent.parent
AXES: dict[str, list[Any]] = {
    "training.schedule": ["gpipe", "1f1b"],
    "training.micro_batch": [1, 2],
    "network.scale_out.link_gbps": [100, 400],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default=str(ROOT / "workloads" / "homogeneous-h100.yaml"))
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--backend", default="flow")
    args = ap.parse_args()
    ref: pd.DataFrame | None = None
    n = 1
    for values in AXES.values():
        n *= len(values)
    print(f"{args.plan}: {n} variants on {args.backend}")
    for jobs in args.jobs:
        t0 = time.perf_counter()
        df = sweep(args.plan, AXES, backend=args.backend, jobs=jobs)
        wall = time.perf_counter() - t0
        failed = int((df["error"] != "").sum())
        same = ""
        body = df.drop(columns=list(TIMING_COLUMNS))
        if ref is None:
            ref = body
        else:
            same = f", frame identical to jobs={args.jobs[0]}: {body.equals(ref)}"
        print(f"jobs={jobs}: {wall:.2f} s, {n / wall:.2f} variants/s, "
              f"per variant in its worker: {df['wall_s'].mean():.2f} s wall, "
              f"{df['cpu_s'].mean():.2f} s CPU, "
              f"{failed} failed{same}")


if __name__ == "__main__":
    main()
