"""Benchmark of the htsim backend: wall time and iteration time against ns-3 and flow.

    python benchmarks/bench_htsim.py                      # every plan in workloads/ <= 16 GPUs
    python benchmarks/bench_htsim.py --plans a.yaml b.yaml --backends htsim,flow
    python benchmarks/bench_htsim.py --plans workloads/llama2-70b-1024gpu.yaml --backends htsim
    python benchmarks/bench_htsim.py --synthetic 16,64,128  # ring all-reduce scaling, no plans

Like for like: htsim with ``scale_up=fluid`` (default; ``--scale-up packet`` for all packets),
ns-3 with ``transport=udp``, MTU 9000 and ``scale_up=fluid`` (ns-3's default). For each plan:
GPUs, ops, flows, then per backend the wall seconds and the iteration time (makespan, ms); the
ns-3/htsim wall ratio (goal: htsim >= 20x faster); and, with ``--limit-s`` (default 600), the
largest plan htsim replays within that wall time. ``--max-gpus`` (default 16) skips bigger
plans from workloads/ (plans named with ``--plans`` always run).
Needs the driver (XSIM_HTSIM_DRIVER, PATH or the in-tree build) and, for ns-3, xsim_ns3.
"""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from xsim_adapters.errors import XsimError
from xsim_adapters.testing.handmade import TraceBuilder, ring_all_reduce
from xsim_adapters.topology import Router, Topology
from xsim_adapters.trace import KIND_FLOW, Trace

REPO = Path(__file__).resolve().parent.parent


def backend(name: str):
    if name == "htsim":
        from xsim_htsim import HtsimBackend
        return HtsimBackend()
    if name == "flow":
        from xsim_adapters.backends.flow import FlowBackend
        return FlowBackend()
    if name == "ns3":
        from xsim_ns3 import Ns3Backend
        return Ns3Backend()
    raise SystemExit(f"unknown backend {name}")


def timed(name: str, trace, topo, opts: dict) -> tuple[float, float, str]:
    """(wall seconds, makespan ms, note) of one run; failures become a note, not a crash."""
    t0 = time.perf_counter()
    try:
        tl = backend(name).run(trace, topo, opts)
    except (XsimError, ImportError) as e:
        # the whole message on stderr (a wall-limit stop ends with the driver's progress line)
        print(f"{name}: {e}", file=sys.stderr, flush=True)
        return time.perf_counter() - t0, float("nan"), str(e).splitlines()[0][:80]
    extra = ""
    if name == "htsim":
        extra = f"{tl.stats['events_per_s'] / 1e6:.1f} Mev/s"
    return time.perf_counter() - t0, tl.makespan_ns / 1e6, extra


def ring_case(n: int, size_bytes: int, gbps: float = 400.0) -> tuple[Trace, Topology]:
    """A synthetic ring all-reduce over n GPUs on one switch (for scaling without plans)."""
    tb = TraceBuilder(n)
    start = tb.barrier()
    tb.barrier(deps=ring_all_reduce(tb, list(range(n)), size_bytes, ready=start))
    trace = tb.build()
    nodes = pd.DataFrame({"node_id": np.arange(n + 1, dtype=np.int32),
                          "kind": ["gpu"] * n + ["leaf"],
                          "name": [f"gpu{i}" for i in range(n)] + ["leaf0"],
                          "rank": np.array(list(range(n)) + [-1], dtype=np.int32),
                          "server": np.full(n + 1, -1, dtype=np.int32)})
    src = np.ravel(np.column_stack([np.arange(n), np.full(n, n)]))
    dst = np.ravel(np.column_stack([np.full(n, n), np.arange(n)]))
    links = pd.DataFrame({"link_id": np.arange(2 * n, dtype=np.int32),
                          "src": src.astype(np.int32), "dst": dst.astype(np.int32),
                          "gbps": np.full(2 * n, gbps), "latency_ns": np.full(2 * n, 1000.0),
                          "tier": ["nic"] * (2 * n)})
    topo = Topology(nodes, links, np.arange(n, dtype=np.int32))
    topo._router = Router(nodes, links)
    return trace, topo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", nargs="*", help="plan files (default: workloads/*.yaml)")
    ap.add_argument("--backends", default="htsim,ns3,flow")
    ap.add_argument("--protocol", default="roce", choices=["roce", "ndp"])
    ap.add_argument("--scale-up", default="fluid", choices=["fluid", "packet"])
    ap.add_argument("--max-gpus", type=int, default=16, help="skip bigger workloads/ plans")
    ap.add_argument("--limit-s", type=float, default=600.0, help="wall limit per htsim run")
    ap.add_argument("--ns3-limit-s", type=float, default=1800.0, help="wall limit per ns-3 run")
    ap.add_argument("--synthetic", help="comma-separated GPU counts for a ring all-reduce")
    ap.add_argument("--size-mb", type=float, default=64.0, help="synthetic all-reduce size")
    a = ap.parse_args(argv)
    names = a.backends.split(",")
    cases = []
    if a.synthetic:
        for n in map(int, a.synthetic.split(",")):
            cases.append((f"ring{n}", lambda n=n: ring_case(n, int(a.size_mb * 2**20))))
    else:
        from xsim_adapters.feasibility import load_plan
        from xsim_adapters.topology import build_topology
        from xsim_adapters.workload import generate

        def plan_case(p: str):
            plan = load_plan(p)
            return generate(plan), build_topology(plan)

        for p in a.plans or sorted(glob.glob(str(REPO / "workloads" / "*.yaml"))):
            if not a.plans and load_plan(p).num_ranks > a.max_gpus:
                print(f"{Path(p).stem}: more than {a.max_gpus} GPUs, skipped", file=sys.stderr)
                continue
            cases.append((Path(p).stem, lambda p=p: plan_case(p)))

    rows = []
    for label, make in cases:
        t0 = time.perf_counter()
        trace, topo = make()
        print(f"{label:28s} trace+topology {time.perf_counter() - t0:.1f} s", file=sys.stderr,
              flush=True)
        row = {"case": label, "gpus": topo.num_ranks, "ops": trace.num_ops,
               "flows": int((trace.ops["kind"] == KIND_FLOW).sum())}
        for name in names:
            opts: dict = {}
            if name == "htsim":
                opts = {"protocol": a.protocol, "scale_up": a.scale_up,
                        "wall_limit_s": a.limit_s}
            elif name == "ns3":
                opts = {"transport": "udp", "mtu": 9000, "scale_up": "fluid",
                        "wall_limit_s": a.ns3_limit_s}
            wall, ms, note = timed(name, trace, topo, opts)
            row[f"{name}_wall_s"] = round(wall, 3)
            row[f"{name}_iter_ms"] = round(ms, 4)
            row[f"{name}_note"] = note
            print(f"{label:28s} {name:6s} wall {wall:9.3f} s  iteration {ms:10.4f} ms  {note}",
                  file=sys.stderr, flush=True)
        rows.append(row)
    df = pd.DataFrame(rows)
    if {"htsim_wall_s", "ns3_wall_s"} <= set(df.columns):
        df["ns3_over_htsim_speed"] = (df["ns3_wall_s"] / df["htsim_wall_s"]).round(1)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        shown = df.drop(columns=[c for c in df.columns if c.endswith("_note")])
        print(shown.to_string(index=False))
    if "htsim_iter_ms" in df:
        ok = df[df["htsim_iter_ms"].notna() & (df["htsim_wall_s"] <= a.limit_s)]
        if len(ok):
            big = ok.sort_values(["gpus", "flows"]).iloc[-1]
            print(f"largest case htsim replays within {a.limit_s:.0f} s: {big['case']} "
                  f"({big['gpus']} GPUs, {big['flows']} flows, {big['htsim_wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
