"""Peak memory per op of each step of the pipeline, measured with tracemalloc.

Usage: python benchmarks/bench_memory.py [PLAN.yaml ...] [--coarsen auto|on|off]

For each step (generate, flow backend, metrics) the peak of memory allocated through Python's
allocators (numpy and pandas buffers included) above what was held before the step, divided
by the trace's op count; and the peak of the whole pipeline, with the trace, timeline and
metrics held as a caller holds them. tracemalloc slows Python code down several times; the
numbers are bytes, not seconds.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

import xsim_adapters as xs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "workloads" / "homogeneous-h100.yaml"]


def measure(plan_path: str | Path, coarsen: str = "auto") -> dict[str, float]:
    """Bytes per op at the peak of each step and of the whole pipeline (see module doc)."""
    plan = xs.load_plan(plan_path)
    topo = xs.build_topology(plan)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    out: dict[str, float] = {}

    def step(name: str, fn):
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        val = fn()
        peak = tracemalloc.get_traced_memory()[1]
        out[name] = peak - before
        out[name + "_held"] = tracemalloc.get_traced_memory()[0] - before
        return val

    trace = step("generate", lambda: xs.generate(plan, coarsen))
    tl = step("flow", lambda: xs.run(trace, "flow", topo))
    step("metrics", lambda: xs.metrics(trace, tl))
    total_peak = max(out["generate"], out["generate_held"] + out["flow"],
                     out["generate_held"] + out["flow_held"] + out["metrics"])
    tracemalloc.stop()
    n = trace.num_ops
    res = {"ops": n, "deps": len(trace.deps)}
    for k in ("generate", "flow", "metrics"):
        res[f"{k}_B_per_op"] = out[k] / n
        res[f"{k}_held_B_per_op"] = out[k + "_held"] / n
    res["pipeline_peak_B_per_op"] = total_peak / n
    res["base_MB"] = base / 1e6
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="*", default=[str(p) for p in DEFAULT])
    ap.add_argument("--coarsen", default="auto", choices=("auto", "on", "off"))
    a = ap.parse_args(argv)
    for p in a.plans:
        r = measure(p, a.coarsen)
        print(Path(p).stem, " ".join(f"{k}={v:,.0f}" for k, v in r.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
