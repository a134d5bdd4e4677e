"""Benchmark plan search: wall and CPU seconds, plans simulated against the space size, the
bound's tightness on the best plan, and the speed-up of the best plan over the best
homogeneous-subset plans, for the shipped search specs.

Usage::

    python benchmarks/bench_search.py                       # the 16-GPU and 64-GPU specs
    python benchmarks/bench_search.py --spec workloads/search/h100-a100-1024gpu.yaml --jobs 2
    python benchmarks/bench_search.py --spec workloads/search/*.yaml --json out/bench.jsonl

CPU seconds are the comparable number on a shared machine: this process (enumeration, the
bounds, the search) plus its worker processes (``RUSAGE_CHILDREN``, counted once the search has
stopped its workers). Targets (docs/search.md#benchmark): 16 GPUs under 1 minute, 64 GPUs of
three types under 5 minutes, 1,024 GPUs under 30 minutes, on 2 cores. Each spec's ``budget``
caps simulations per pass (main search, then one pass per device type at the same batch and at
its own best batch), so ``proven`` says whether the main pass finished inside it.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from xsim_adapters.search import search
from xsim_adapters.sweep.runner import LocalExecutor

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPECS = ["h100-a100-16gpu.yaml", "three-types-64gpu.yaml"]


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def bench(spec: str, jobs: int, baselines: bool = True) -> dict:
    """Run one search and return its numbers."""
    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu_s()
    res = search(spec, LocalExecutor(jobs), top=1, baselines=baselines)
    wall = time.perf_counter() - t0
    cpu_main, cpu_workers = time.process_time() - c0, _children_cpu_s() - k0
    s = res.summary
    best = res.best
    return {
        "spec": Path(spec).name,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu_main + cpu_workers, 1),
        "cpu_search_s": round(cpu_main, 1),
        "cpu_workers_s": round(cpu_workers, 1),
        "enumerate_s": s["enumerate_s"],
        "space_size": s["space_size"],
        "feasible": s["feasible"],
        "evaluated_main": s["evaluated"],
        "simulations_all_passes": s["simulations"],
        "proven_optimal": s["proven_optimal"],
        "prune_counts": s["prune_counts"],
        "best": None if best is None else best.cand.key,
        "best_iteration_ms": None if best is None or best.row is None
        else round(best.row["iteration_time_ns"] / 1e6, 3),
        "bound_over_time": None if best is None or best.row is None
        else round(best.lb_ns / best.row["iteration_time_ns"], 4),
        "speedup": {t: {"same_batch": h["speedup_same_batch"], "own_batch": h["speedup_own_batch"],
                        "baseline_proven": h["same_batch"]["proven_optimal"]
                        and h["own_batch"]["proven_optimal"]}
                    for t, h in s.get("homogeneous", {}).items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", nargs="+",
                    default=[str(ROOT / "workloads" / "search" / s) for s in DEFAULT_SPECS])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-baselines", action="store_true",
                    help="Main pass only (no homogeneous-subset passes).")
    ap.add_argument("--json", default=None, help="Also append each result to this JSON-lines file.")
    args = ap.parse_args()
    for spec in args.spec:
        r = bench(spec, args.jobs, baselines=not args.no_baselines)
        print(json.dumps(r, indent=1))
        if args.json:
            with open(args.json, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
