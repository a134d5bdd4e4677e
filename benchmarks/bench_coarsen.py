"""Coarsened against full: the same plan generated coarsened and not, run on the flow backend;
ops, CPU seconds, iteration time, MFU and the relative error of the coarsened run.

Usage: python benchmarks/bench_coarsen.py PLAN.yaml [PLAN.yaml ...] [--microbatches]
       [--set SECTION.KEY=VALUE ...]

Default: ``--coarsen on`` against ``off`` (both axes). ``--microbatches``: the micro-batch axis
alone: merged steady-state micro-batches against every micro-batch, with the same replica
coarsening both ways, plus the largest per-rank difference of any ``*_ns`` column. ``--set``
overrides a plan field for a variant (e.g. ``training.global_batch=384``), applied to every
plan given.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np
from _variant import load_variant

import xsim_adapters as xs
from xsim_adapters.workload import generate
from xsim_adapters.workload.coarsen import Coarsening, decide


def compare(path: str, microbatches: bool = False, sets: list[str] | None = None) -> dict:
    """One plan, both ways: {way: (ops, CPU s, iteration ns, mfu, ranks frame)} and the error."""
    plan = load_variant(path, sets or [])
    topo = xs.build_topology(plan)
    if microbatches:
        co = decide(plan, "on")
        if co.microbatches is None:
            raise SystemExit(f"{path}: no steady-state micro-batches to merge:"
                             f" {co.microbatch_reason}")
        ways: dict[str, str | Coarsening] = {
            "coarse": co, "full": dataclasses.replace(co, microbatches=None)}
    else:
        ways = {"coarse": "on", "full": "off"}
    out: dict = {}
    for name, how in ways.items():
        t0 = time.process_time()
        trace = generate(plan, how)  # the generator itself: it takes a Coarsening too
        rec = trace.manifest["coarsening"].get("microbatches") or {}
        if microbatches and name == "coarse" and not rec.get("used"):
            raise SystemExit(f"{path}: micro-batches not merged: {rec.get('reason')}")
        met = xs.metrics(trace, xs.run(trace, "flow", topo))
        s = met.summary
        out[name] = (trace.num_ops, time.process_time() - t0, s["iteration_time_ns"], s["mfu"],
                     met.ranks)
    out["error"] = out["coarse"][2] / out["full"][2] - 1
    cols = [c for c in out["full"][4].columns if c.endswith("_ns")]
    out["rank_diff_ns"] = float(np.abs(out["coarse"][4][cols].to_numpy(dtype=np.float64)
                                       - out["full"][4][cols].to_numpy(dtype=np.float64)).max())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+")
    ap.add_argument("--microbatches", action="store_true",
                    help="the micro-batch axis alone (same replica coarsening both ways)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    a = ap.parse_args(argv)
    print("| plan | ops full | ops coarsened | CPU s full | CPU s coarsened | iteration full ns |"
          " iteration coarsened ns | error | largest per-rank diff ns | MFU full / coarsened |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in a.plans:
        r = compare(p, a.microbatches, a.set)
        on, off = r["coarse"], r["full"]
        print(f"| {p} | {off[0]:,} | {on[0]:,} | {off[1]:.1f} | {on[1]:.1f} | {off[2]:,} | "
              f"{on[2]:,} | {r['error']:+.6%} | {r['rank_diff_ns']:,.0f} | "
              f"{off[3]:.4f} / {on[3]:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
