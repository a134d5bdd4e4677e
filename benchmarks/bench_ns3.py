"""Benchmark of the ns-3 backend: wall time and events/s on the shipped plans of <= 16 GPUs,
against the flow backend on the same plans (ratio), and stock ns-3's own event rate for a bulk
TCP transfer over one point-to-point link in the same wheel (BulkSend -> PacketSink).

    python benchmarks/bench_ns3.py                      # udp, MTU 9000 (slow: minutes per plan)
    python benchmarks/bench_ns3.py --transport dctcp --mtu 9000 --plans homogeneous-h100
    python benchmarks/bench_ns3.py --stock-only

Prints one line per plan and a JSON summary (``--json PATH`` writes it atomically).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

STOCK_SCRIPT = r"""
import json, sys, time
from ns import ns
nbytes, gbps, mtu = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
ns.Config.SetDefault("ns3::TcpSocket::SegmentSize", ns.UintegerValue(mtu - 52))
ns.Config.SetDefault("ns3::TcpSocket::SndBufSize", ns.UintegerValue(1 << 20))
ns.Config.SetDefault("ns3::TcpSocket::RcvBufSize", ns.UintegerValue(1 << 20))
nodes = ns.NodeContainer(); nodes.Create(2)
ns.InternetStackHelper().Install(nodes)
p2p = ns.PointToPointHelper()
p2p.SetDeviceAttribute("DataRate", ns.StringValue(f"{gbps}Gbps"))
p2p.SetDeviceAttribute("Mtu", ns.UintegerValue(mtu))
p2p.SetChannelAttribute("Delay", ns.StringValue("1us"))
devs = p2p.Install(nodes)
addr = ns.Ipv4AddressHelper()
addr.SetBase(ns.Ipv4Address("10.0.0.0"), ns.Ipv4Mask("255.255.255.0"))
ifc = addr.Assign(devs)
any_addr = ns.InetSocketAddress(ns.Ipv4Address.GetAny(), 9).ConvertTo()
sink = ns.PacketSinkHelper("ns3::TcpSocketFactory", any_addr).Install(nodes.Get(1))
bulk = ns.BulkSendHelper("ns3::TcpSocketFactory",
                         ns.InetSocketAddress(ifc.GetAddress(1), 9).ConvertTo())
bulk.SetAttribute("MaxBytes", ns.UintegerValue(nbytes))
bulk.SetAttribute("SendSize", ns.UintegerValue(1 << 16))
bulk.Install(nodes.Get(0))
ideal_s = nbytes * 8 / (gbps * 1e9)
ns.Simulator.Stop(ns.Seconds(ideal_s * 3))
t = time.perf_counter(); ns.Simulator.Run(); wall = time.perf_counter() - t
got = ns.DynamicCast[ns.PacketSink](sink.Get(0)).GetTotalRx()
ev = int(ns.Simulator.GetEventCount())
print(json.dumps({"bytes": nbytes, "received": int(got), "wall_s": wall, "events": ev,
                  "events_per_s": ev / wall, "ideal_s": ideal_s}))
"""


def stock_bulk_send(nbytes: int = 2_000_000_000, gbps: float = 100.0, mtu: int = 9000) -> dict:
    """Stock ns-3 BulkSend over one p2p link, in a child process from a clean directory."""
    with tempfile.TemporaryDirectory(prefix="xsim-bench-") as tmp:
        out = subprocess.run(
            [sys.executable, "-c", STOCK_SCRIPT, str(nbytes), str(gbps), str(mtu)],
            cwd=tmp, capture_output=True, text=True, check=False,
        )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"stock BulkSend failed ({out.returncode}): {out.stderr[-1500:]}")
    return json.loads(lines[-1])


def bench_plan(path: str, options: dict) -> dict:
    from xsim_ns3 import Ns3Backend

    from xsim_adapters.backends.flow import FlowBackend
    from xsim_adapters.feasibility import load_plan
    from xsim_adapters.topology import build_topology
    from xsim_adapters.workload import generate

    plan = load_plan(path)
    trace = generate(plan)
    topo = build_topology(plan)
    t = time.perf_counter()
    flow = FlowBackend().run(trace, topo, {})
    flow_wall = time.perf_counter() - t
    t = time.perf_counter()
    tl = Ns3Backend().run(trace, topo, options)
    ns3_wall = time.perf_counter() - t
    s = tl.stats
    return {
        "plan": Path(path).stem,
        "ranks": trace.num_ranks,
        "ops": trace.num_ops,
        "flow_iter_ms": flow.makespan_ns / 1e6,
        "ns3_iter_ms": tl.makespan_ns / 1e6,
        "iter_ratio": tl.makespan_ns / flow.makespan_ns,
        "flow_wall_s": flow_wall,
        "ns3_wall_s": ns3_wall,
        "ns3_run_s": s["run_s"],
        "ns3_import_s": s["import_s"],
        "wall_ratio": ns3_wall / flow_wall,
        "events": s["events"],
        "events_per_s": s["events_per_s"],
        "packet_GB": s["packet_bytes"] / 1e9,
        "fluid_GB": s["fluid_bytes"] / 1e9,
        "packets_received": s["packets_received"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", default="udp", choices=("dctcp", "tcp", "udp"))
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--plans", default="", help="comma-separated plan stems (default: all <= 16)")
    ap.add_argument("--stock-only", action="store_true")
    ap.add_argument("--json", default="", help="write the summary here")
    args = ap.parse_args()
    summary: dict = {"stock_bulk_send": stock_bulk_send()}
    st = summary["stock_bulk_send"]
    print(f"stock BulkSend 100G MTU 9000: {st['events']} events in {st['wall_s']:.2f} s ="
          f" {st['events_per_s']:.0f} events/s", flush=True)
    summary["plans"] = []
    if not args.stock_only:
        from xsim_adapters.feasibility import load_plan

        wanted = set(filter(None, args.plans.split(",")))
        for path in sorted(glob.glob(str(REPO / "workloads" / "*.yaml"))):
            if wanted and Path(path).stem not in wanted:
                continue
            plan = load_plan(path)
            if sum(g.nodes * g.gpus_per_node for g in plan.device_groups) > 16:
                continue
            r = bench_plan(path, {"transport": args.transport, "mtu": args.mtu})
            summary["plans"].append(r)
            print(
                f"{r['plan']}: ns3 {r['ns3_wall_s']:.1f} s ({r['events_per_s']:.0f} events/s,"
                f" {r['events']} events) vs flow {r['flow_wall_s']:.2f} s: {r['wall_ratio']:.0f}x;"
                f" iteration ns3/flow = {r['iter_ratio']:.5f}",
                flush=True,
            )
    summary["options"] = {"transport": args.transport, "mtu": args.mtu}
    print(json.dumps(summary, indent=1))
    if args.json:
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=1))
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
