"""Benchmark the workload generator: ops, edges, seconds and peak memory for one plan.

Usage: python benchmarks/bench_generate.py [PLAN.yaml] [--write DIR] [--repeat N]

Without a plan it uses workloads/llama2-70b-1024gpu.yaml (Llama-2-70B on 1,024 GPUs). Peak
memory is the process's maximum resident set size (resource.getrusage), which includes the
Python interpreter and imported libraries; "generate" is the delta over the RSS before it.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

from xsim_adapters.feasibility import load_plan
from xsim_adapters.trace import write_trace
from xsim_adapters.workload import generate

DEFAULT = Path(__file__).resolve().parent.parent / "workloads" / "llama2-70b-1024gpu.yaml"


def _max_rss_mb() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Time generate(plan) and optionally write_trace.")
    ap.add_argument("plan", nargs="?", default=str(DEFAULT), help="plan YAML file")
    ap.add_argument("--write", metavar="DIR", help="also write the trace to DIR and time it")
    ap.add_argument("--repeat", type=int, default=1, help="generate this many times (best time)")
    args = ap.parse_args(argv)

    plan = load_plan(args.plan)
    rss0 = _max_rss_mb()
    best = float("inf")
    trace = None
    for _ in range(max(1, args.repeat)):
        trace = None  # release the previous trace before timing the next one
        t0 = time.perf_counter()
        trace = generate(plan)
        best = min(best, time.perf_counter() - t0)
    assert trace is not None
    rss1 = _max_rss_mb()
    n_ops, n_deps = trace.num_ops, len(trace.deps)
    print(f"plan            {plan.name} ({plan.num_ranks} GPUs, dp={plan.dp})")
    print(f"ops             {n_ops:,}")
    for kind, n in trace.manifest["op_counts"]["by_kind"].items():
        print(f"  {kind:<13} {n:,}")
    print(f"edges           {n_deps:,}")
    print(f"collectives     {len(trace.collectives):,}")
    print(f"generate        {best:.2f} s  ({n_ops / best / 1e6:.2f} M ops/s)")
    print(f"peak RSS        {rss1:,.0f} MB (generate added {rss1 - rss0:,.0f} MB)")
    if args.write is not None or args.write == "":
        out = Path(args.write) if args.write else Path(tempfile.mkdtemp()) / "trace"
        t0 = time.perf_counter()
        write_trace(trace, out)
        dt = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"write_trace     {dt:.2f} s  ({size / 1e6:,.1f} MB on disk at {out})")
        print(f"peak RSS        {_max_rss_mb():,.0f} MB after writing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
