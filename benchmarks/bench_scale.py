"""End to end on the flow backend: plan -> trace -> topology -> run -> metrics, with the wall
time of every step, the peak resident memory and the simulated result.

Usage: python benchmarks/bench_scale.py PLAN.yaml [--coarsen auto|on|off] [--write DIR]

Peak memory is the process's high-water mark (VmHWM from /proc/self/status: everything,
interpreter and libraries included); "bytes/op" divides it by the ops simulated. With --write
the trace and the run's outputs (timeline.parquet, ranks.csv, summary.json, no plots) are
written too, as ``xsim run --no-plots`` does.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import xsim_adapters as xs


def vm_hwm_bytes() -> int:
    """The process's peak resident set size in bytes (Linux VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("--coarsen", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--write", metavar="DIR", default=None,
                    help="also write the trace and run outputs under DIR ('' = a temp dir)")
    a = ap.parse_args(argv)
    times: dict[str, float] = {}
    t = time.perf_counter()
    t_all = t
    cpu0 = time.process_time()  # the machine may be shared: CPU seconds are the steadier number

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name] = now - t
        t = now

    plan = xs.load_plan(a.plan)
    lap("load")
    trace = xs.generate(plan, a.coarsen)
    lap("generate")
    topo = xs.build_topology(plan)
    lap("topology")
    tl = xs.run(trace, "flow", topo)
    lap("flow")
    met = xs.metrics(trace, tl)
    lap("metrics")
    if a.write is not None:
        out = Path(a.write or tempfile.mkdtemp()) / "run"
        xs.write_trace(trace, out.parent / "trace", plan, force=True)
        xs.write_report(met, out, plots=False, force=True)
        lap("write")
    total = time.perf_counter() - t_all
    cpu = time.process_time() - cpu0
    hwm = vm_hwm_bytes()
    s = met.summary
    co = s.get("coarsening", {})
    res = {
        "plan": plan.name, "gpus": plan.num_ranks, "ops": trace.num_ops,
        "deps": len(trace.deps), "coarsening": co.get("reason"), "used": co.get("used"),
        "microbatches": (co.get("microbatches") or {}).get("reason"),
        "periods_added": (co.get("microbatches") or {}).get("periods_added"),
        "wall_s": round(total, 2), "cpu_s": round(cpu, 2),
        **{f"{k}_s": round(v, 2) for k, v in times.items()},
        "events": tl.stats.get("events"),
        "events_per_s": round(tl.stats.get("events", 0) / max(tl.stats.get("sim_wall_s", 1e-9),
                                                            1e-9)),
        "peak_rss_GB": round(hwm / 1e9, 2), "bytes_per_op": round(hwm / max(1, trace.num_ops)),
        "iteration_time_s": s["iteration_time_ns"] / 1e9, "mfu": s.get("mfu"),
        "tokens_per_s": s.get("tokens_per_s"),
    }
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
