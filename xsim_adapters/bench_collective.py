"""``xsim bench-collective``: the nccl-tests equivalent on the simulator.

One collective over a device group (``servers`` x ``gpus_per_server`` of one device type on a
leaf-spine fabric), at sizes from 1 KiB to 8 GiB, lowered exactly as the workload generator
lowers a ring (channel orders, bytes per channel, NCCL latency and protocol cost) and replayed
on a backend. Columns as nccl-tests prints them: ``size`` (bytes), ``time_us``, ``algbw`` =
size / time and ``busbw`` = algbw x 2(n-1)/n for an all-reduce, x (n-1)/n for reduce-scatter
and all-gather (nccl-tests ``doc/PERFORMANCE.md``), both in GB/s.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .errors import PlanError
from .plan import plan_from_dict
from .plan.model import CollectiveAlgorithms, Plan
from .topology import build_topology
from .trace import TraceBuilder, ring_collective
from .trace.schema import KIND_BARRIER, KIND_FLOW
from .workload.algorithms import lower
from .workload.latency import gate_latency, latency_members
from .workload.rings import (
    RankInfo,
    channel_orders,
    ring_bottleneck_GBps,
    ring_delay_ns,
    ring_order,
    split_bytes,
)
from .workload.selection import choose_algorithm

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
ALGORITHM_CHOICES = ("auto", "ring", "tree", "nvls", "hierarchical")
MIN_BYTES, MAX_BYTES = 1 << 10, 8 << 30


def bench_plan(device: str, servers: int, gpus_per_server: int, nic_gbps: float | None = None,
               link_gbps: float = 400.0) -> Plan:
    """A plan holding one group of ``servers`` x ``gpus_per_server`` ``device`` GPUs (a preset
    name) on a non-blocking leaf-spine; ``nic_gbps`` overrides the type's NIC speed."""
    types: dict[str, Any] = {}
    if nic_gbps is not None:
        types = {device: {"nic_gbps": nic_gbps}}
    d = {
        "name": f"bench-{device}-{servers}x{gpus_per_server}",
        "model": {"preset": "llama2-7b"},
        "training": {"global_batch": 1, "micro_batch": 1},
        "device_types": types,
        "device_groups": {"g": {"type": device, "nodes": servers,
                                "gpus_per_node": gpus_per_server}},
        "network": {"scale_out": {"topology": "leaf_spine", "link_gbps": link_gbps,
                                  "latency_us": 1.0}},
        "replicas": [{"stages": [{"group": "g", "devices": [0, 1], "layers": [0, 32]}]}],
    }
    return plan_from_dict(d, feasibility=False)


def lowered_trace(plan: Plan, kind: str, nbytes: int, channels: int = 0,
                  nccl_cost: bool = True, algorithm: str = "ring") -> tuple[Any, int, str]:
    """The trace of one ``kind`` of ``nbytes`` over every rank of ``plan`` (as the generator
    lowers it) with ``algorithm`` (``auto`` chooses as NCCL's tuner); returns (trace, op id of
    the closing barrier, the algorithm:protocol that ran)."""
    info = RankInfo(plan)
    ranks = list(range(plan.num_ranks))
    if algorithm != "ring":
        p = replace(plan, collectives=replace(
            plan.collectives, nccl_cost=nccl_cost, channels=max(0, channels),
            algorithm=CollectiveAlgorithms(algorithm, algorithm, algorithm)))  # type: ignore[arg-type]
        choice = choose_algorithm(p, info, ranks, kind, nbytes)
        if choice.algorithm != "ring":
            assert choice.layout is not None
            t = lower(choice.algorithm, kind, choice.layout, nbytes, choice.channels,
                      choice.chunks)
            tb = TraceBuilder(plan.num_ranks)
            start = tb.barrier()
            tails = add_template(tb, t, ranks, start, choice.delay_ns, collective=0)
            end = tb.barrier(deps=tails)
            return tb.build(), end, choice.label
    base = ring_order(info, ranks, plan.collectives.ring_order)
    orders = channel_orders(info, base, channels)
    sizes = split_bytes(nbytes, [ring_bottleneck_GBps(info, o) for o in orders])
    delay = ring_delay_ns(info, kind, orders, sizes) if nccl_cost else 0
    tb = TraceBuilder(plan.num_ranks)
    start = tb.barrier()
    last = ring_collective(tb, base, nbytes, kind=kind, ready=start, collective=0,
                           delay_ns=delay, orders=orders, sizes=sizes)
    end = tb.barrier(deps=last)
    proto = ring_cost_protocol(info, kind, orders, sizes) if nccl_cost else "Simple"
    return tb.build(), end, f"ring:{proto}"


def ring_cost_protocol(info: RankInfo, kind: str, orders: list[list[int]],
                       sizes: list[int]) -> str:
    """The protocol NCCL's tuner picks for the ring (its first channel), for the report."""
    from .workload.nccl import ring_cost
    from .workload.rings import nics_per_server

    o, s = orders[0], sizes[0]
    hops = [(o[i], o[(i + 1) % len(o)]) for i in range(len(o))]
    slow = min(hops, key=lambda h: info.link_GBps(*h))
    link = "nvlink" if info.server[slow[0]] == info.server[slow[1]] else "net"
    servers = len({int(info.server[r]) for r in o})
    return ring_cost(kind, len(o), int(s), servers, info.link_GBps(*slow), link,
                     len(orders), nics=nics_per_server(info, o)).protocol


def add_template(tb: TraceBuilder, t: Any, ranks: list[int], ready: int, delay_ns: int,
                 collective: int = -1, phase: str = "dp") -> list[int]:
    """Add template ``t`` (a :class:`RingFlows` over member positions) to ``tb`` on ``ranks``:
    each member's gate flows wait for ``ready`` and, if ``delay_ns`` > 0, carry it as their
    start latency (or, where a gate flow waits inside the collective, wait for a timed barrier
    of ``delay_ns`` on that member; :mod:`.workload.latency`). Returns every member's tail
    flows."""
    folded = latency_members(t)[0] if delay_ns > 0 else np.ones(len(ranks), dtype=bool)
    lat = gate_latency(t, delay_ns, folded[None]) if delay_ns > 0 else np.zeros(t.size, int)
    first: list[list[int]] = [[ready] for _ in ranks]
    for m, r in enumerate(ranks):
        if not folded[m]:
            first[m] = [tb.add(KIND_BARRIER, r, phase=phase, deps=first[m],
                               duration_ns=delay_ns, collective=collective)]
    joins = set() if t.kind is None else set(np.flatnonzero(t.kind != KIND_FLOW).tolist())
    ids = [tb.add(KIND_BARRIER, ranks[int(t.src[j])], phase=phase, collective=collective)
           if j in joins else
           tb.add(KIND_FLOW, ranks[int(t.src[j])], phase=phase, dst=ranks[int(t.dst[j])],
                  bytes=int(t.nbytes[j]), duration_ns=int(lat[j]), collective=collective,
                  step=int(t.step[j]), channel=int(t.channel[j])) for j in range(t.size)]
    for p, q in zip(t.pred.tolist(), t.succ.tolist(), strict=True):
        tb.dep(ids[p], ids[q])
    gates = {(int(g), m) for m in range(len(ranks)) for g in t.start[0, :, m]}
    for g, m in sorted(gates):
        tb.dep(first[m], ids[g])
    return sorted({ids[int(x)] for x in t.tails[0].reshape(-1)})


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw (nccl-tests): 2(n-1)/n for all-reduce, (n-1)/n otherwise."""
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n


def sweep_sizes(lo: int = MIN_BYTES, hi: int = MAX_BYTES) -> list[int]:
    """Powers of two from ``lo`` to ``hi`` bytes."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def bench(plan: Plan, kind: str = "all_reduce", sizes: list[int] | None = None,
          backend: str = "flow", options: dict[str, Any] | None = None, channels: int = 0,
          nccl_cost: bool = True, algorithm: str = "auto") -> pd.DataFrame:
    """One row per size: size (bytes), time_us, algbw and busbw (GB/s), and the
    ``algorithm`` (algorithm:protocol) that ran."""
    from .backends.registry import get_backend

    be = get_backend(backend)
    topo = build_topology(plan)
    n = plan.num_ranks
    rows = []
    for s in sizes or sweep_sizes():
        trace, end, algo = lowered_trace(plan, kind, s, channels, nccl_cost, algorithm)
        tl = be.run(trace, topo, dict(options or {}))
        t_ns = float(tl.frame["end_ns"].iloc[end])
        algbw = s / t_ns  # bytes per ns = GB/s
        rows.append({"size": s, "time_us": t_ns / 1e3, "algbw": algbw,
                     "busbw": algbw * bus_factor(kind, n), "algorithm": algo})
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame, path: Path, title: str,
         measured: pd.Series | None = None) -> None:
    """busbw against size (log x), with ``measured`` busbw (indexed by size) if given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(frame["size"], frame["busbw"], "o-", label="simulated")
    if measured is not None:
        ax.plot(measured.index, measured.values, "s--", label="measured")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B").rstrip("I")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def add_arguments(sp: argparse.ArgumentParser) -> None:
    """The ``bench-collective`` options."""
    sp.add_argument("--device", default="A100-80GB", help="A device-type preset name.")
    sp.add_argument("--servers", type=int, default=1, help="Servers (default 1).")
    sp.add_argument("--gpus-per-server", type=int, default=8, help="GPUs per server.")
    sp.add_argument("--nic-gbps", type=float, default=None,
                    help="NIC Gb/s per GPU (default: the device type's).")
    sp.add_argument("--kind", choices=KINDS, default="all_reduce", help="The collective.")
    sp.add_argument("--channels", type=int, default=0,
                    help="Ring channels; 0 (default): auto, one ring per NIC a server's "
                         "members use, as NCCL opens (collectives.channels: auto).")
    sp.add_argument("--algorithm", choices=ALGORITHM_CHOICES, default="auto",
                    help="Collective algorithm; auto (default) chooses as NCCL's tuner "
                         "(docs/collectives.md); one the group cannot run falls back to ring.")
    sp.add_argument("-b", "--minbytes", default="1K", help="Smallest size (default 1K).")
    sp.add_argument("-e", "--maxbytes", default="8G", help="Largest size (default 8G).")
    sp.add_argument("--backend", default="flow", help="The backend (default flow).")
    sp.add_argument("--no-nccl-cost", action="store_true",
                    help="Leave out NCCL's latency and protocol cost (flows only).")
    sp.add_argument("-o", "--output", default=None, metavar="DIR",
                    help="Write bench.csv and bench.png there (an xsim bench output, "
                         "replaced whole; docs/outputs.md).")
    from .cli import FORCE_HELP

    sp.add_argument("--force", action="store_true", help=FORCE_HELP)


def cmd_bench_collective(args: argparse.Namespace) -> int:
    """Run the sweep and print it as nccl-tests does."""
    from ._outdir import check_output, output_dir

    if args.servers < 1 or args.gpus_per_server < 1:
        raise PlanError("bench-collective", "servers and gpus-per-server must be >= 1")
    if args.output:
        check_output(args.output, "bench", args.force)  # before any work
    plan = bench_plan(args.device, args.servers, args.gpus_per_server, args.nic_gbps)
    sizes = sweep_sizes(_size(args.minbytes), _size(args.maxbytes))
    frame = bench(plan, args.kind, sizes, args.backend, channels=args.channels,
                  nccl_cost=not args.no_nccl_cost, algorithm=args.algorithm)
    print(f"# {args.kind} on {args.servers} x {args.gpus_per_server} {args.device}, "
          f"backend {args.backend}")
    print(f"{'size':>12} {'time(us)':>10} {'algbw':>8} {'busbw':>8}  algorithm")
    for r in frame.itertuples():
        print(f"{r.size:>12} {r.time_us:>10.1f} {r.algbw:>8.2f} {r.busbw:>8.2f}  "
              f"{r.algorithm}")
    if args.output:  # one unit: written beside DIR, then swapped in
        with output_dir(args.output, "bench", args.force) as tmp:
            frame.to_csv(tmp / "bench.csv", index=False)
            plot(frame, tmp / "bench.png", f"{args.kind}, {args.servers}x"
                 f"{args.gpus_per_server} {args.device}")
    return 0
