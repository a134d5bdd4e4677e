"""Coarsened against full: the same plan generated with ``--coarsen on`` and ``off`` and run on
the flow backend; ops, seconds, iteration time, MFU and the relative error of the coarsened run.

Usage: python benchmarks/bench_coarsen.py PLAN.yaml [PLAN.yaml ...]
"""

from __future__ import annotations

import argparse
import sys
import time

import xsim_adapters as xs


def compare(path: str) -> dict:
    """One plan, both modes: {mode: (ops, seconds, iteration ns, mfu, reason)} and the error."""
    plan = xs.load_plan(path)
    topo = xs.build_topology(plan)
    out: dict = {}
    for mode in ("on", "off"):
        t0 = time.process_time()
        trace = xs.generate(plan, mode)
        met = xs.metrics(trace, xs.run(trace, "flow", topo))
        s = met.summary
        out[mode] = (trace.num_ops, time.process_time() - t0, s["iteration_time_ns"], s["mfu"],
                     s["coarsening"]["reason"])
    out["error"] = out["on"][2] / out["off"][2] - 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+")
    a = ap.parse_args(argv)
    print("| plan | ops full | ops coarsened | CPU s full | CPU s coarsened | iteration full ns |"
          " iteration coarsened ns | error | MFU full / coarsened |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in a.plans:
        r = compare(p)
        on, off = r["on"], r["off"]
        print(f"| {p} | {off[0]:,} | {on[0]:,} | {off[1]:.1f} | {on[1]:.1f} | {off[2]:,} | "
              f"{on[2]:,} | {r['error']:+.5%} | {off[3]:.4f} / {on[3]:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
