"""Peak memory per op of each step of the pipeline.

Usage: python benchmarks/bench_memory.py [PLAN.yaml ...] [--coarsen auto|on|off]
                                         [--tool memray|tracemalloc]

For each step (generate, flow backend, metrics): the peak of memory allocated during the step
above what was held before it, divided by the trace's op count, and what stays allocated after
it (``held``: the trace after generate, the timeline after flow); and the peak of the whole
pipeline run as a caller runs it (the trace, timeline and metrics held).

``--tool memray`` (the default when memray is installed: ``pip install -e ".[bench]"``) counts
every allocation, the compiled flow core's C++ vectors included; ``tracemalloc`` sees only
Python's allocators (numpy and pandas buffers, not the core's own memory) and is the fallback.
Both are slower than a plain run; the numbers are bytes, not seconds.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path

import xsim_adapters as xs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "workloads" / "homogeneous-h100.yaml"]
STEPS = ("generate", "flow", "metrics")


def _memray_peak(fn):
    """(value, peak bytes allocated inside fn, bytes still allocated at its end) by memray."""
    import memray

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "step.bin")
        with memray.Tracker(path, native_traces=False):
            val = fn()
        reader = memray.FileReader(path)
        held = sum(r.size for r in reader.get_leaked_allocation_records(merge_threads=True))
        return val, reader.metadata.peak_memory, held


def _tracemalloc_peak(fn):
    """(value, peak bytes above the start, bytes held at the end) by tracemalloc."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    val = fn()
    now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return val, peak - before, now - before


def measure(plan_path: str | Path, coarsen: str = "auto", tool: str = "memray"
            ) -> dict[str, float]:
    """Bytes per op at the peak of each step and of the whole pipeline (see module doc)."""
    peak_of = _memray_peak if tool == "memray" else _tracemalloc_peak
    plan = xs.load_plan(plan_path)
    topo = xs.build_topology(plan)
    gc.collect()
    out: dict[str, float] = {}

    def steps() -> tuple[int, int]:
        trace, out["generate"], out["generate_held"] = peak_of(
            lambda: xs.generate(plan, coarsen))
        tl, out["flow"], out["flow_held"] = peak_of(lambda: xs.run(trace, "flow", topo))
        _, out["metrics"], out["metrics_held"] = peak_of(lambda: xs.metrics(trace, tl))
        return trace.num_ops, len(trace.deps)

    n, deps = steps()  # the trace and timeline are released on return
    gc.collect()

    def pipeline():
        t = xs.generate(plan, coarsen)
        timeline = xs.run(t, "flow", topo)
        return t, timeline, xs.metrics(t, timeline)

    _, out["pipeline"], _ = peak_of(pipeline)
    res: dict[str, float] = {"ops": n, "deps": deps}
    for k in STEPS:
        res[f"{k}_B_per_op"] = out[k] / n
        res[f"{k}_held_B_per_op"] = out[k + "_held"] / n
    res["pipeline_peak_B_per_op"] = out["pipeline"] / n
    res["pipeline_peak_MB"] = out["pipeline"] / 1e6
    return res


def main(argv: list[str] | None = None) -> int:
    try:
        import memray  # noqa: F401
        default_tool = "memray"
    except ImportError:
        default_tool = "tracemalloc"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="*", default=[str(p) for p in DEFAULT])
    ap.add_argument("--coarsen", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--tool", default=default_tool, choices=("memray", "tracemalloc"))
    a = ap.parse_args(argv)
    print(f"# tool: {a.tool}", flush=True)
    for p in a.plans:
        r = measure(p, a.coarsen, a.tool)
        print(Path(p).stem, " ".join(f"{k}={v:,.0f}" for k, v in r.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
