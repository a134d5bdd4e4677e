"""Benchmark the flow backend's two engines: events/s, wall and CPU seconds, peak memory.

Usage::

    python benchmarks/bench_flow.py                       # every shipped plan, both engines
    python benchmarks/bench_flow.py --plans workloads/uneven-layers.yaml --engines native
    python benchmarks/bench_flow.py --synthetic           # synthetic 1,024-GPU trace
    python benchmarks/bench_flow.py --synthetic --servers 16 --layers 8

For each plan: ops and events, then per engine (``native``: the compiled core xsim_flowcore;
``python``: the reference executor) the event loop's wall and CPU seconds and events per
second of each, and the largest relative difference between the two engines' timelines.
Events are op ends, flow transmission ends and link events (``Timeline.stats['events']``).
CPU seconds are the running thread's (``sim_cpu_s``): on a shared machine wall time also
counts other processes' turns on the cores. The last line is the peak RSS of the process.

The synthetic trace mimics one training iteration on ``servers`` x 8 GPUs (rail-optimized
leaf-spine): per rank ``layers`` compute ops, each followed by a ring all-reduce over the
server's 8 GPUs (TP, NVSwitch), then one data-parallel ring all-reduce per local GPU index
across all servers (rail fabric), cut into ``dp_chunks`` chunked rings.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.plan.model import (
    DeviceGroup,
    DeviceType,
    ModelSpec,
    NetworkSpec,
    Plan,
    Replica,
    ScaleOut,
    Stage,
    TrainingSpec,
)
from xsim_adapters.topology import build_topology
from xsim_adapters.trace.schema import (
    COLLECTIVE_COLUMNS,
    KIND_BARRIER,
    KIND_COMPUTE,
    KIND_FLOW,
    OP_COLUMNS,
    PHASE_INDEX,
    Trace,
)
from xsim_adapters.workload.comm.collectives import ring_flows

H100 = DeviceType("H100", 989.0, 80.0, 3350.0, scaleup_GBps=450.0, nic_gbps=400.0)


def synthetic_plan(servers: int, rail: bool = True) -> Plan:
    group = DeviceGroup("h100", "H100", servers, 8)
    return Plan(
        name="bench",
        model=ModelSpec("bench", 2, 64, 256, 4, 4, 128, 1000),
        training=TrainingSpec(global_batch=1, micro_batch=1),
        device_types={"H100": H100},
        device_groups=(group,),
        network=NetworkSpec(scale_out=ScaleOut(rail_optimized=rail, oversubscription=2.0)),
        replicas=(Replica(stages=(Stage("h100", (0, 8), 8, (0, 2)),), micro_batches=1),),
    )


class _Ops:
    """Column lists of ops and edges, appended in vectorized blocks."""

    def __init__(self) -> None:
        self.cols: dict[str, list[np.ndarray]] = {c: [] for c in OP_COLUMNS}
        self.pred: list[np.ndarray] = []
        self.succ: list[np.ndarray] = []
        self.n = 0

    def add(self, count: int, **cols: np.ndarray | int) -> np.ndarray:
        ids = np.arange(self.n, self.n + count, dtype=np.int64)
        for c in OP_COLUMNS:
            v = ids if c == "op_id" else cols.get(c, -1 if c not in ("bytes", "duration_ns",
                                                                      "flops") else 0)
            self.cols[c].append(np.broadcast_to(np.asarray(v), (count,)).astype(OP_COLUMNS[c]))
        self.n += count
        return ids

    def dep(self, pred: np.ndarray, succ: np.ndarray) -> None:
        p, s = np.broadcast_arrays(np.asarray(pred), np.asarray(succ))
        self.pred.append(p.ravel().astype(np.int64))
        self.succ.append(s.ravel().astype(np.int64))

    def ring(self, ranks: np.ndarray, nbytes: int, phase: str, after: np.ndarray) -> np.ndarray:
        """Ring all-reduce over rows of ``ranks`` (shape rings x n), lowered by the generator's
        ``ring_flows``; returns the last flow into each slot (rings x n).

        ``after`` (rings x n): op each rank waits for before its first send.
        """
        rings, n = ranks.shape
        perm = np.broadcast_to(np.arange(n), (rings, 1, n))
        rf = ring_flows(ranks, perm, np.full((rings, 1), nbytes), "all_reduce")
        ids = self.add(rf.size, kind=KIND_FLOW, rank=rf.src, dst=rf.dst, bytes=rf.nbytes,
                       phase=PHASE_INDEX[phase], step=rf.step)
        base = int(ids[0])
        self.dep(rf.pred + base, rf.succ + base)
        self.dep(after, rf.start[:, 0, :] + base)
        return rf.tails[:, 0, :, 0] + base

    def trace(self, num_ranks: int) -> Trace:
        ops = pd.DataFrame({c: np.concatenate(v) for c, v in self.cols.items()})
        deps = pd.DataFrame({"pred": np.concatenate(self.pred),
                             "succ": np.concatenate(self.succ)})
        coll = pd.DataFrame({c: pd.Series([], dtype=t) for c, t in COLLECTIVE_COLUMNS.items()})
        manifest = {"schema_version": 1, "ranks": [{"rank": r} for r in range(num_ranks)]}
        return Trace(ops=ops, deps=deps, collectives=coll, manifest=manifest)


def synthetic_trace(servers: int, layers: int, tp_bytes: int, dp_bytes: int,
                    dp_chunks: int, jitter: float = 0.1) -> Trace:
    ranks = servers * 8
    ops = _Ops()
    rng = np.random.default_rng(0)  # compute times vary by +-jitter: events do not all align
    tp_groups = np.arange(ranks).reshape(servers, 8)
    last = ops.add(ranks, kind=KIND_BARRIER, rank=np.arange(ranks)).reshape(servers, 8)
    for _ in range(layers):
        dur = 150_000 * (1 + jitter * rng.uniform(-1, 1, size=ranks))
        comp = ops.add(ranks, kind=KIND_COMPUTE, rank=tp_groups.ravel(),
                       duration_ns=dur.astype(np.int64),
                       phase=PHASE_INDEX["fwd"]).reshape(servers, 8)
        ops.dep(last, comp)
        last = ops.ring(tp_groups, tp_bytes, "tp", comp)
    dp_rings = tp_groups.T.copy()  # ring i: GPU i of every server (one rail)
    after = last.T.copy()
    for _ in range(dp_chunks):
        after = ops.ring(dp_rings, dp_bytes // dp_chunks, "dp", after)
    opt = ops.add(ranks, kind=KIND_COMPUTE, rank=dp_rings.ravel(), duration_ns=50_000,
                  phase=PHASE_INDEX["optim"])
    ops.dep(after.ravel(), opt)
    return ops.trace(ranks)


def plan_trace(path: str) -> tuple[Plan, Trace]:
    from xsim_adapters.feasibility import load_plan

    try:
        from xsim_adapters.workload import generate
    except ImportError:
        sys.exit("the workload generator (xsim_adapters.workload.generate) has not landed yet")
    plan = load_plan(path)
    return plan, generate(plan)


REPO = Path(__file__).resolve().parent.parent


def compare_engines(name: str, trace: Trace, topo, engines: list[str]) -> str:
    """One markdown row: ops, events, per engine wall s / CPU s / Mevents/s, max rel diff."""
    cells = [name, f"{trace.num_ops:,}"]
    frames = []
    events = None
    for engine in engines:
        tl = FlowBackend().run(trace, topo, {"engine": engine})
        s = tl.stats
        events = s["events"]
        cpu = s["sim_cpu_s"]
        cells += [f"{s['sim_wall_s']:.3f}", f"{cpu:.3f}",
                  f"{s['events_per_s'] / 1e6:.2f}",
                  f"{s['events'] / cpu / 1e6:.2f}" if cpu > 0 else "-"]
        frames.append(tl.frame)
        print(f"  {name} {engine}: {s}", file=sys.stderr, flush=True)
    cells.insert(2, f"{events:,}")
    if len(frames) == 2:
        diffs = []
        for col in ("start_ns", "end_ns"):
            a, b = frames[0][col].to_numpy(), frames[1][col].to_numpy()
            diffs.append(float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1.0))))
        cells.append(f"{max(diffs):.1e}")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description="Benchmark the flow backend's engines.")
    ap.add_argument("--plans", nargs="*", help="plan YAML files (default: every shipped plan)")
    ap.add_argument("--engines", default="native,python",
                    help="comma-separated: native, python (default both)")
    ap.add_argument("--synthetic", action="store_true", help="the synthetic trace instead")
    ap.add_argument("--plan", help="one plan YAML, detailed report (like --synthetic)")
    ap.add_argument("--servers", type=int, default=128, help="8-GPU servers (synthetic)")
    ap.add_argument("--layers", type=int, default=40, help="compute + TP ring per rank")
    ap.add_argument("--tp-bytes", type=int, default=64 << 20)
    ap.add_argument("--dp-bytes", type=int, default=1 << 30)
    ap.add_argument("--dp-chunks", type=int, default=1)
    ap.add_argument("--no-rail", action="store_true",
                    help="plain leaf-spine (4 servers per leaf): DP rings share uplinks")
    ap.add_argument("--jitter", type=float, default=0.1, help="compute time spread, fraction")
    args = ap.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not (args.synthetic or args.plan):
        plans = args.plans or sorted(str(p) for p in (REPO / "workloads").glob("*.yaml"))
        head = ["plan", "ops", "events"]
        for e in engines:
            head += [f"{e} wall s", f"{e} CPU s", f"{e} Mev/s (wall)", f"{e} Mev/s (CPU)"]
        if len(engines) == 2:
            head.append("max rel diff")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for path in plans:
            plan, trace = plan_trace(path)
            print(compare_engines(Path(path).stem, trace, build_topology(plan), engines),
                  flush=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"\npeak RSS {peak:,.0f} MiB")
        return
    detail(args, engines[0])


def detail(args: argparse.Namespace, engine: str) -> None:
    """The one-trace report: build times, events, events/s, makespan, peak RSS."""
    t0 = time.perf_counter()
    if args.plan:
        plan, trace = plan_trace(args.plan)
    else:
        plan = synthetic_plan(args.servers, rail=not args.no_rail)
        trace = synthetic_trace(args.servers, args.layers, args.tp_bytes, args.dp_bytes,
                                args.dp_chunks, args.jitter)
    t1 = time.perf_counter()
    topo = build_topology(plan)
    t2 = time.perf_counter()
    c2 = time.process_time()
    tl = FlowBackend().run(trace, topo, {"engine": engine})
    t3 = time.perf_counter()
    cpu = time.process_time() - c2  # the machine may be shared: CPU time is the steadier number
    s = tl.stats
    kinds = trace.ops["kind"].value_counts().sort_index().to_dict()
    print(f"engine {s['engine']}, ops {trace.num_ops:,} (by kind {kinds}),"
          f" deps {len(trace.deps):,},"
          f" ranks {topo.num_ranks}, links {len(topo.links):,}")
    print(f"trace build {t1 - t0:.2f} s, topology {t2 - t1:.2f} s, backend run {t3 - t2:.2f} s"
          f" (routing {s['routing_s']:.2f} s, event loop {s['sim_wall_s']:.2f} s)")
    print(f"events {s['events']:,}, events/s {s['events'] / s['sim_wall_s']:,.0f} (event loop),"
          f" max active flows {s['max_active_flows']:,},"
          f" rate recomputations {s['rate_recomputations']:,}")
    print(f"backend CPU {cpu:.2f} s: {s['events'] / cpu:,.0f} events per CPU second")
    print(f"simulated makespan {tl.makespan_ns / 1e6:.3f} ms")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
