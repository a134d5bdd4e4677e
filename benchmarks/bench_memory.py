"""Peak memory per op of each step of the pipeline.

Usage: python benchmarks/bench_memory.py [PLAN.yaml ...] [--coarsen auto|on|off]
                                         [--tool memray|tracemalloc] [--set SECTION.KEY=VALUE]
                                         [--slope SECTION.KEY=VALUE]

For each step (generate, flow backend, metrics): the peak of memory allocated during the step
above what was held before it, divided by the trace's op count, and what stays allocated after
it (``held``: the trace after generate, the timeline after flow); and the peak of the whole
pipeline run as a caller runs it (the trace, timeline and metrics held).

``--tool memray`` (the default when memray is installed: ``pip install -e ".[bench]"``) counts
every allocation, the compiled flow core's C++ vectors included; ``tracemalloc`` sees only
Python's allocators (numpy and pandas buffers, not the core's own memory) and is the fallback.
Both are slower than a plain run; the numbers are bytes, not seconds.

``--slope SECTION.KEY=VALUE`` (e.g. ``training.global_batch=512``) measures the plan twice, as
given and with that field set, and reports the marginal bytes per op: the difference of each
peak divided by the difference of op counts. Fixed costs (imports on first use, the router's
path cache, rank tables) cancel, so this is what each further op costs, the number that decides
whether a larger plan fits. ``--set`` overrides fields of both runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path

from _variant import load_variant

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


def measure(plan_path: str | Path, coarsen: str = "auto", tool: str = "memray",
            sets: list[str] | None = None) -> dict[str, float]:
    """Bytes per op at the peak of each step and of the whole pipeline (see module doc)."""
    peak_of = _memray_peak if tool == "memray" else _tracemalloc_peak
    plan = load_variant(str(plan_path), sets or [])
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
    for k in (*STEPS, "pipeline"):
        res[f"{k}_bytes"] = out[k]
    return res


def marginal(small: dict[str, float], large: dict[str, float]) -> dict[str, float]:
    """Marginal bytes per op between two runs of one plan: each peak's increase over the ops'."""
    d_ops = large["ops"] - small["ops"]
    if d_ops < 0.5 * small["ops"]:
        raise SystemExit(f"--slope: ops went from {small['ops']:,.0f} to {large['ops']:,.0f};"
                         " choose a value that at least adds half the ops again (coarsening"
                         " may be merging the added micro-batches: try --coarsen off)")
    res = {"ops": small["ops"], "ops_then": large["ops"]}
    for k in (*STEPS, "pipeline"):
        res[f"{k}_marginal_B_per_op"] = (large[f"{k}_bytes"] - small[f"{k}_bytes"]) / d_ops
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
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a plan field (every run)")
    ap.add_argument("--slope", metavar="SECTION.KEY=VALUE",
                    help="also run with this field set and report the marginal bytes per op")
    a = ap.parse_args(argv)
    print(f"# tool: {a.tool}", flush=True)
    for p in a.plans:
        r = measure(p, a.coarsen, a.tool, a.set)
        if a.slope:
            r = marginal(r, measure(p, a.coarsen, a.tool, [*a.set, a.slope]))
        print(Path(p).stem, " ".join(f"{k}={v:,.0f}" for k, v in r.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
