"""``collectives.channels``: the old default (1) against ``auto`` on shipped plans: ops, CPU
seconds (generate + flow backend, coarsening ``auto``), iteration time and its change.

Usage: python benchmarks/bench_channels.py PLAN.yaml [PLAN.yaml ...]

CPU seconds are ``time.process_time`` of this process (comparable on a loaded machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import xsim_adapters as xs
from xsim_adapters.plan.model import Plan


def measure(plan: Plan) -> tuple[int, float, float, str]:
    """(ops, CPU s of generate + flow run, iteration ns, DP channel counts seen) of ``plan``."""
    topo = xs.build_topology(plan)
    t0 = time.process_time()
    trace = xs.generate(plan)
    met = xs.metrics(trace, xs.run(trace, "flow", topo))
    cpu = time.process_time() - t0
    coll = trace.collectives
    chans = sorted({int(c) for c in coll["channels"][coll["phase"] == 6]}) if len(coll) else []
    return trace.num_ops, cpu, float(met.summary["iteration_time_ns"]), str(chans)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="+")
    a = ap.parse_args(argv)
    print("| plan | ops (1) | ops (auto) | CPU s (1) | CPU s (auto) | iteration ms (1) |"
          " iteration ms (auto) | change | DP channels (auto) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in a.plans:
        plan = xs.load_plan(path)
        one = dataclasses.replace(plan, collectives=dataclasses.replace(plan.collectives,
                                                                        channels=1))
        auto = dataclasses.replace(plan, collectives=dataclasses.replace(plan.collectives,
                                                                         channels=0))
        o1, c1, t1, _ = measure(one)
        oa, ca, ta, ch = measure(auto)
        print(f"| {path.split('/')[-1]} | {o1:,} | {oa:,} | {c1:.1f} | {ca:.1f} | "
              f"{t1 / 1e6:.2f} | {ta / 1e6:.2f} | {ta / t1 - 1:+.2%} | {ch} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
