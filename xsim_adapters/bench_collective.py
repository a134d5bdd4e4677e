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
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .errors import PlanError
from .feasibility import plan_from_dict
from .plan.model import CollectiveAlgorithms, Plan
from .topology import build_topology
from .trace import TraceBuilder
from .trace.schema import KIND_BARRIER, PHASE_INDEX, Trace
from .workload.builder import BulkBuilder
from .workload.comm.algorithms import lower
from .workload.comm.collectives import RingFlows, ring_flows
from .workload.comm.emit import emit_lowered
from .workload.comm.rings import (
    RankInfo,
    channel_orders,
    ring_bottleneck_GBps,
    ring_delay_ns,
    ring_order,
    split_bytes,
)
from .workload.comm.selection import choose_algorithm

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
ALGORITHM_CHOICES = ("auto", "ring", "tree", "nvls", "hierarchical")
MIN_BYTES, MAX_BYTES = 1 << 10, 8 << 30
#: The largest size a sweep may reach: 1 TiB, above every GPU's memory (H200: 141 GB), so a
#: byte count stays far inside int64 and exact in float64 (plan/limits.py MAX_EXACT).
LIMIT_BYTES = 1 << 40


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
            trace, end = _one_collective(plan, t, kind, nbytes, choice.delay_ns, choice.label,
                                         choice.channels)
            return trace, end, choice.label
    base = ring_order(info, ranks, plan.collectives.ring_order)
    orders = channel_orders(info, base, channels)
    sizes = split_bytes(nbytes, [ring_bottleneck_GBps(info, o) for o in orders])
    delay = ring_delay_ns(info, kind, orders, sizes) if nccl_cost else 0
    pos = {r: k for k, r in enumerate(base)}
    rf = ring_flows(np.asarray([base], dtype=np.int64),
                    np.asarray([[[pos[r] for r in o] for o in orders]], dtype=np.int64),
                    np.asarray([sizes], dtype=np.int64), kind)
    proto = ring_cost_protocol(info, kind, orders, sizes) if nccl_cost else "Simple"
    trace, end = _one_collective(plan, rf, kind, nbytes, delay, f"ring:{proto}", len(orders),
                                 members=base)
    return trace, end, f"ring:{proto}"


def _one_collective(plan: Plan, rf: RingFlows, kind: str, nbytes: int, delay_ns: int,
                    label: str, channels: int, members: list[int] | None = None
                    ) -> tuple[Trace, int]:
    """The trace of one lowered collective ``rf`` over ``members`` (default: every rank in
    rank order) with NCCL cost ``delay_ns``, emitted as the generator emits one
    (:func:`.workload.comm.emit.emit_lowered`) between an opening and a closing barrier;
    returns (trace, op id of the closing barrier)."""
    mem = np.asarray(members if members is not None else range(plan.num_ranks), dtype=np.int64)
    tb = BulkBuilder()
    dp = PHASE_INDEX["dp"]
    start = tb.add_ops(1, kind=KIND_BARRIER, rank=-1, phase=dp)
    coll = dict(n=1, kind=kind, phase=dp, bytes=nbytes, ranks=",".join(map(str, mem)),
                algorithm=label, channels=channels)
    tails, starts = emit_lowered(tb, rf, mem[None], delay_ns, coll,
                                 lambda _rk, _inst: dict(phase=dp))
    tb.add_edges_valid(start, starts)
    end = tb.add_ops(1, kind=KIND_BARRIER, rank=-1, phase=dp)
    tb.add_edges_valid(tails.reshape(-1), end)
    ops, deps, colls = tb.frames()
    manifest = TraceBuilder(plan.num_ranks, plan_name=plan.name).build().manifest
    manifest.update(num_ops=len(ops), num_deps=len(deps))
    return Trace(ops=ops, deps=deps, collectives=colls, manifest=manifest), int(end[0])


def ring_cost_protocol(info: RankInfo, kind: str, orders: list[list[int]],
                       sizes: list[int]) -> str:
    """The protocol NCCL's tuner picks for the ring (its first channel), for the report."""
    from .workload.comm.nccl import ring_cost
    from .workload.comm.rings import nics_per_server

    o, s = orders[0], sizes[0]
    hops = [(o[i], o[(i + 1) % len(o)]) for i in range(len(o))]
    slow = min(hops, key=lambda h: info.link_GBps(*h))
    link = "nvlink" if info.server[slow[0]] == info.server[slow[1]] else "net"
    servers = len({int(info.server[r]) for r in o})
    return ring_cost(kind, len(o), int(s), servers, info.link_GBps(*slow), link,
                     len(orders), nics=nics_per_server(info, o)).protocol


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw (nccl-tests): 2(n-1)/n for all-reduce, (n-1)/n otherwise."""
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n


def sweep_sizes(lo: int = MIN_BYTES, hi: int = MAX_BYTES) -> list[int]:
    """``lo``, ``2 lo``, ``4 lo``, ... up to ``hi`` bytes (``1 <= lo <= hi``, else PlanError)."""
    if not 1 <= lo <= hi:
        raise PlanError("bench-collective", f"--minbytes {lo} must be at least 1 and at most "
                                            f"--maxbytes {hi}: there is no size to run")
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

    sizes = sweep_sizes() if sizes is None else list(sizes)
    if not sizes:
        raise PlanError("bench-collective", "no sizes to run (got an empty list)")
    be = get_backend(backend)
    topo = build_topology(plan)
    n = plan.num_ranks
    rows = []
    for s in sizes:
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


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)(?:e(\d{1,2}))?\s*([kmgt]?)(i?b?)\s*", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, option: str) -> int:
    """A byte count as nccl-tests writes it (``1024``, ``64K``, ``8M``, ``1G``, ``1.5K``,
    ``1e6``; binary units, an optional ``B``/``iB``), 1 byte to :data:`LIMIT_BYTES`; PlanError
    naming ``option`` otherwise (text, NaN, 0, negative, too large)."""
    m = _SIZE.fullmatch(text)
    if m is None or (m.group(4) and m.group(4).upper() not in ("B", "IB")) or (
            m.group(4).upper() == "IB" and not m.group(3)):
        raise PlanError(option, f"expected a byte count such as 1024, 64K, 8M or 1G "
                                f"(got {text[:40]!r})")
    value = float(m.group(1)) * 10 ** int(m.group(2) or 0) * _UNITS[m.group(3).upper()]
    if not math.isfinite(value) or not 1 <= value <= LIMIT_BYTES:
        raise PlanError(option, f"expected 1 byte to {LIMIT_BYTES >> 40} TiB (got {text[:40]!r})")
    return int(value)


def check_trace_size(kind: str, ranks: int, channels: int, gpus_per_server: int) -> None:
    """Refuse a sweep whose one collective's trace would exceed the trace limits of plans
    (plan/limits.py: MAX_TRACE_OPS ops, BYTES_PER_OP each within this process's memory): a
    ring moves ``steps x ranks x channels`` flows (``steps`` = 2(n-1) for an all-reduce, n-1
    otherwise; ``auto`` channels: at most one per GPU of a server)."""
    from .plan.limits import BYTES_PER_OP, MAX_TRACE_OPS, memory_budget_bytes

    steps = (2 if kind == "all_reduce" else 1) * (ranks - 1)
    ops = max(steps, 1) * ranks * (channels or gpus_per_server) + 2
    if ops > MAX_TRACE_OPS or ops * BYTES_PER_OP > memory_budget_bytes():
        raise PlanError("bench-collective", f"--servers x --gpus-per-server = {ranks} GPUs "
                                            f"with {channels or 'auto'} channels: one {kind} "
                                            f"would be about {ops:,} flows, over the limit of "
                                            f"{MAX_TRACE_OPS:,} ops per trace (MAX_TRACE_OPS, "
                                            "docs/plan.md#limits) or this process's memory; "
                                            "use fewer GPUs or channels")


def add_arguments(sp: argparse.ArgumentParser) -> None:
    """The ``bench-collective`` options."""
    sp.add_argument("--device", default="A100-80GB", help="A device-type preset name.")
    sp.add_argument("--servers", type=_positive, default=1, help="Servers (default 1).")
    sp.add_argument("--gpus-per-server", type=_positive, default=8,
                    help="GPUs per server (default 8).")
    sp.add_argument("--nic-gbps", type=float, default=None,
                    help="NIC Gb/s per GPU (default: the device type's).")
    sp.add_argument("--kind", choices=KINDS, default="all_reduce", help="The collective.")
    sp.add_argument("--channels", type=_channels, default=0,
                    help="Ring channels; 0 (default): auto, one ring per NIC a server's "
                         "members use, as NCCL opens (collectives.channels: auto).")
    sp.add_argument("--algorithm", choices=ALGORITHM_CHOICES, default="auto",
                    help="Collective algorithm; auto (default) chooses as NCCL's tuner "
                         "(docs/collectives.md); one the group cannot run falls back to ring.")
    sp.add_argument("-b", "--minbytes", default="1K",
                    help="Smallest size in bytes, K/M/G/T binary units allowed (default 1K).")
    sp.add_argument("-e", "--maxbytes", default="8G",
                    help="Largest size in bytes (default 8G); sizes double from the smallest.")
    sp.add_argument("--backend", default="flow", help="The backend (default flow).")
    sp.add_argument("--no-nccl-cost", action="store_true",
                    help="Leave out NCCL's latency and protocol cost (flows only).")
    sp.add_argument("-o", "--output", default=None, metavar="DIR",
                    help="Write bench.csv and bench.png there (an xsim bench output, "
                         "replaced whole; docs/outputs.md).")


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1 (argparse prints its own one-line usage error)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {text!r})") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {v})")
    return v


def _channels(text: str) -> int:
    """An argparse type: 0 (auto) to MAX_CHANNELS ring channels (the plan's own bound)."""
    from .plan.limits import MAX_CHANNELS

    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer 0..{MAX_CHANNELS} (got "
                                         f"{text!r})") from None
    if not 0 <= v <= MAX_CHANNELS:
        raise argparse.ArgumentTypeError(f"expected 0 (auto) to {MAX_CHANNELS} "
                                         f"(MAX_CHANNELS) (got {v})")
    return v


#: The printed table: (header, width, format) per column, units in the headers (nccl-tests
#: prints size in bytes, time in us, algbw and busbw in GB/s).
TABLE = (("size(B)", 12, "d"), ("time(us)", 10, ".1f"), ("algbw(GB/s)", 12, ".2f"),
         ("busbw(GB/s)", 12, ".2f"))


def cmd_bench_collective(args: argparse.Namespace) -> int:
    """Run the sweep and print it as nccl-tests does."""
    from ._outdir import check_output, output_dir

    lo = parse_size(args.minbytes, "--minbytes")
    hi = parse_size(args.maxbytes, "--maxbytes")
    if lo > hi:
        raise PlanError("--minbytes", f"{args.minbytes} is larger than --maxbytes "
                                      f"{args.maxbytes}: there is no size to run")
    sizes = sweep_sizes(lo, hi)
    check_trace_size(args.kind, args.servers * args.gpus_per_server, args.channels,
                     args.gpus_per_server)
    if args.output:
        check_output(args.output, "bench", args.force)  # before any work
    plan = bench_plan(args.device, args.servers, args.gpus_per_server, args.nic_gbps)
    frame = bench(plan, args.kind, sizes, args.backend, channels=args.channels,
                  nccl_cost=not args.no_nccl_cost, algorithm=args.algorithm)
    print(f"# {args.kind} on {args.servers} x {args.gpus_per_server} {args.device}, "
          f"backend {args.backend}")
    print(" ".join(f"{h:>{w}}" for h, w, _ in TABLE) + "  algorithm")
    for r in frame.itertuples():
        cells = (r.size, r.time_us, r.algbw, r.busbw)
        print(" ".join(f"{v:>{w}{fmt}}" for v, (_, w, fmt) in zip(cells, TABLE, strict=True))
              + f"  {r.algorithm}")
    if args.output:  # one unit: written beside DIR, then swapped in
        with output_dir(args.output, "bench", args.force) as tmp:
            frame.to_csv(tmp / "bench.csv", index=False)
            plot(frame, tmp / "bench.png", f"{args.kind}, {args.servers}x"
                 f"{args.gpus_per_server} {args.device}")
    return 0
