"""htsim backend against real htsim: closed forms, the flow backend, shipped plans.

Needs htsim: set HTSIM_DIR to an htsim build holding sim/libhtsim.a and the headers of sim/
(made by htsim's own instructions; the driver is then built from our source into a temporary
directory), or XSIM_HTSIM_DRIVER to a built driver.

Tolerances, and why:
- a single flow: within 2% + 1 us of S*8/B + path latency. htsim sends whole MTU packets (the
  last one is padded) and RoCE paces at (MTU + ACK size) per packet slot, about 0.7% slow.
- an uncongested ring all-reduce: within 3% of the closed form 2(n-1)/n * S/B + steps x latency
  and of the flow backend, and never below the bound 2(n-1)/n * S/B.
- shipped plans of <= 16 GPUs with scale_up=fluid (the default; intra-server flows are the
  flow backend's own model, only NIC/fabric flows are packets): iteration time within 1% of the
  flow backend (measured: +0.003% to +0.32%). With scale_up=packet: within 3% (measured +0.3% to
  +0.9%: whole packets, ACK pacing and store-and-forward against fluid max-min sharing); plans
  moving more than 1 TB per iteration take minutes packet by packet (hetero-dp-h100-a100:
  3.4 TB, 5.6 min) and run only with XSIM_HTSIM_SLOW=1. The comparison with ns-3 is in
  tests/test_htsim_ns3.py and benchmarks/bench_htsim.py.
"""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, SCALE_PLANS
from helpers.htsim import (
    DATA,
    TraceBuilder,
    golden_case,
    ring_allreduce,
    star,
)
from xsim_htsim import HtsimBackend, write_input

from xsim_adapters.errors import BackendError

pytestmark = pytest.mark.htsim


def run(trace, topo, driver: str, **opts):
    return HtsimBackend().run(trace, topo, {"driver": driver, **opts})


@pytest.mark.parametrize("protocol", ["roce", "ndp"])
def test_single_flow_closed_form(driver: str, protocol: str) -> None:
    tb = TraceBuilder(2)
    tb.flow(0, 1, 8 << 20)
    trace = tb.build()
    topo = star(2, 200.0, latency_ns=700.0)
    tl = run(trace, topo, driver, protocol=protocol, scale_up="packet")
    ideal = (8 << 20) * 8 / 200.0 + 2 * 700.0
    assert ideal <= tl.makespan_ns <= ideal * 1.02 + 1000.0
    assert tl.stats["protocol"] == protocol and tl.stats["events"] > 0


@pytest.mark.parametrize("protocol", ["roce", "ndp"])
def test_ring_allreduce_closed_form_and_flow_backend(driver: str, protocol: str) -> None:
    n, size, gbps, lat = 8, 64 << 20, 400.0, 500.0
    tb = TraceBuilder(n)
    ring_allreduce(tb, list(range(n)), size)
    trace = tb.build()
    topo = star(n, gbps, latency_ns=lat)
    tl = run(trace, topo, driver, protocol=protocol, scale_up="packet")
    bound = 2 * (n - 1) / n * size * 8 / gbps
    closed = bound + 2 * (n - 1) * 2 * lat
    assert tl.makespan_ns >= bound
    assert abs(tl.makespan_ns - closed) <= 0.03 * closed
    from xsim_adapters.backends.flow import FlowBackend

    flow = FlowBackend().run(trace, topo, {})
    assert abs(tl.makespan_ns - flow.makespan_ns) <= 0.03 * flow.makespan_ns


@pytest.mark.parametrize("scale_up", ["fluid", "packet"])
@pytest.mark.parametrize("kind", ["degrade", "fail_restore"])
def test_timed_link_event_matches_closed_form_and_flow_backend(driver: str, kind: str,
                                                               scale_up: str) -> None:
    """One 8 MiB flow over 200 Gb/s cables; at 100 us its sender's link drops to half rate
    (degrade) or goes down for 50 us and comes back (fail_restore). Closed forms: the bytes
    left at 100 us take twice as long (degrade), or 50 us more (fail_restore)."""
    import pandas as pd

    from xsim_adapters.backends.flow import FlowBackend

    nbytes, gbps, lat = 8 << 20, 200.0, 700.0
    tb = TraceBuilder(2)
    tb.flow(0, 1, nbytes)
    trace = tb.build()
    topo = star(2, gbps, latency_ns=lat, tier="scale_up" if scale_up == "fluid" else "nic")
    at = 100_000.0
    if kind == "degrade":
        topo.events = pd.DataFrame({"at_ns": [at], "link_id": [0], "factor": [0.5]})
        left = nbytes * 8 / gbps - at
        closed = at + 2 * left + 2 * lat
    else:
        topo.events = pd.DataFrame({"at_ns": [at, at + 50_000.0], "link_id": [0, 0],
                                    "factor": [0.0, 1.0]})
        closed = nbytes * 8 / gbps + 50_000.0 + 2 * lat
    tl = run(trace, topo, driver, scale_up=scale_up)
    flow = FlowBackend().run(trace, topo, {})
    assert flow.makespan_ns == pytest.approx(closed, rel=1e-9)
    assert tl.stats["link_events"] == len(topo.events)
    # packets: headers (about 1% at a 9,000-byte MTU) and one packet in service at the change
    assert abs(tl.makespan_ns - closed) <= (1e-6 if scale_up == "fluid" else 0.02) * closed


def test_coarser_acks_and_packets_keep_a_lone_flow_exact(driver: str) -> None:
    # the opt-in trades (docs/htsim.md "Faster packets"): a flow alone on its path is paced at
    # its NIC rate whatever ACKs come back, so ack_every changes nothing but the event count;
    # a bigger MTU only removes per-packet headers (closed form within 1%)
    tb = TraceBuilder(2)
    tb.flow(0, 1, 8 << 20)
    trace = tb.build()
    topo = star(2, 200.0, latency_ns=700.0)
    base = run(trace, topo, driver, scale_up="packet")
    fewer = run(trace, topo, driver, scale_up="packet", ack_every=8)
    assert fewer.makespan_ns == base.makespan_ns
    assert fewer.stats["events"] < base.stats["events"]
    big = run(trace, topo, driver, scale_up="packet", mtu=65000, ack_every=8)
    ideal = (8 << 20) * 8 / 200.0 + 2 * 700.0
    assert ideal <= big.makespan_ns <= ideal * 1.01 + 2 * 65064 * 8 / 200.0
    assert big.stats["events"] * 5 < base.stats["events"]


def test_coarser_acks_on_a_ring_stay_within_a_percent(driver: str) -> None:
    # in a ring every link carries data one way and ACKs the other: fewer ACKs free a little
    # reverse capacity, so the ring may finish slightly sooner, never by more than 1%
    tb = TraceBuilder(4)
    start, end = ring_allreduce(tb, [0, 1, 2, 3], 16 << 20)
    topo = star(4, 100.0, latency_ns=500.0, tier="nic")
    trace = tb.build()
    base = run(trace, topo, driver)
    fewer = run(trace, topo, driver, ack_every=16)
    assert fewer.makespan_ns == pytest.approx(base.makespan_ns, rel=0.01)
    assert fewer.makespan_ns <= base.makespan_ns


def test_compute_gaps_between_flows(driver: str) -> None:
    tb = TraceBuilder(2)
    c1 = tb.compute(0, 40_000)
    f1 = tb.flow(0, 1, 1 << 20)
    c2 = tb.compute(1, 25_000)
    f2 = tb.flow(1, 0, 1 << 20)
    c3 = tb.compute(0, 7_000)
    for a, b in [(c1, f1), (f1, c2), (c2, f2), (f2, c3)]:
        tb.dep(a, b)
    tl = run(tb.build(), star(2, 100.0), driver)
    fr = tl.frame
    assert fr.loc[c1, "end_ns"] == 40_000.0
    assert fr.loc[f1, "start_ns"] == 40_000.0  # a flow starts when its dependency ends
    assert fr.loc[c2, "start_ns"] == fr.loc[f1, "end_ns"]
    # ps -> ns floats: exact to well under a picosecond
    assert fr.loc[c2, "end_ns"] - fr.loc[c2, "start_ns"] == pytest.approx(25_000.0, abs=1e-6)
    assert fr.loc[f2, "start_ns"] == fr.loc[c2, "end_ns"]
    assert fr.loc[c3, "end_ns"] - fr.loc[c3, "start_ns"] == pytest.approx(7_000.0, abs=1e-6)
    one_flow = (1 << 20) * 8 / 100.0 + 1000.0
    assert tl.makespan_ns == pytest.approx(72_000.0 + 2 * one_flow, rel=0.02)


@pytest.mark.parametrize("protocol", ["roce", "ndp"])
def test_driver_reproduces_golden_times(driver: str, protocol: str, tmp_path: Path) -> None:
    trace, topo = golden_case()
    run(trace, topo, driver, protocol=protocol, work_dir=str(tmp_path))
    # byte-identical: the driver is deterministic and the golden file came from it
    golden = (DATA / f"golden_times_{protocol}.bin").read_bytes()
    assert (tmp_path / "times.bin").read_bytes() == golden


def test_heterogeneous_nics_bound_the_ring(driver: str) -> None:
    trace, topo = golden_case()
    tl = run(trace, topo, driver)
    # 6 ring steps of 256 KiB through the 100 Gb/s NIC of rank 3, after 10 us of compute
    assert tl.frame.loc[2, "end_ns"] >= 10_000 + 6 * (1 << 18) * 8 / 100.0


def test_stuck_dag_is_reported_by_the_driver(driver: str, tmp_path: Path) -> None:
    tb = TraceBuilder(1)
    tb.compute(0, 5)
    b1, b2 = tb.barrier(), tb.barrier()
    tb.dep(b1, b2)
    tb.dep(b2, b1)  # a cycle: neither can start
    write_input(tb.build(), star(1, 100.0), tmp_path / "in.bin")
    proc = subprocess.run([driver, str(tmp_path / "in.bin"), "--out", str(tmp_path / "t.bin"),
                           "--summary", str(tmp_path / "s.json")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 4
    assert proc.stderr == ("xsim-htsim: simulation ran out of events at t=5000 ps with 2 of 3 "
                           "ops unfinished (a flow never delivered all its bytes or the "
                           "dependency graph has a cycle) (first: 1 2)\n")
    assert not (tmp_path / "t.bin").exists()


def test_malformed_input_names_the_entry(driver: str, tmp_path: Path) -> None:
    tb = TraceBuilder(2)
    tb.compute(0, 5)
    write_input(tb.build(), star(2, 100.0), tmp_path / "in.bin")
    raw = bytearray((tmp_path / "in.bin").read_bytes())
    raw[112:116] = (7).to_bytes(4, "little")  # link 0's source node: only 3 nodes exist
    (tmp_path / "bad.bin").write_bytes(bytes(raw))

    def drive(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([driver, str(tmp_path / name), "--out", str(tmp_path / "t.bin"),
                               "--summary", str(tmp_path / "s.json")],
                              capture_output=True, text=True, check=False)

    proc = drive("bad.bin")
    assert proc.returncode == 2
    assert proc.stderr.endswith("bad.bin: link 0: node id out of range\n")
    (tmp_path / "cut.bin").write_bytes(bytes(raw[:-12]))
    proc = drive("cut.bin")
    assert proc.returncode == 2 and "(truncated or damaged)" in proc.stderr
    raw[8] = 9
    (tmp_path / "v9.bin").write_bytes(bytes(raw))
    proc = drive("v9.bin")
    assert proc.returncode == 2
    assert "input format version 9 is not supported by this driver (it reads version 5)" in (
        proc.stderr)
    (tmp_path / "v3.txt").write_text("xsim-htsim 3\nnodes 1\n")
    proc = drive("v3.txt")
    assert proc.returncode == 2 and "is the older format 3" in proc.stderr


def test_unbuildable_queue_is_a_backend_error(driver: str) -> None:
    trace, topo = golden_case()
    with pytest.raises(BackendError, match=r"htsim: the driver failed \(exit 3\): xsim-htsim: "
                                           r"cannot build the network: queue of 100 bytes"):
        run(trace, topo, driver, queue_bytes=100)


# ---- shipped plans -------------------------------------------------------------------------

def shipped_plans() -> list[str]:
    """Shipped plans expected to agree with the flow backend (the ``congested-*`` ones are
    built to differ and are compared in docs/congestion.md)."""
    return sorted(p for p in glob.glob(str(REPO / "workloads" / "*.yaml"))
                  if not Path(p).stem.startswith("congested-")
                  and Path(p).stem not in SCALE_PLANS)


@pytest.mark.slow
@pytest.mark.parametrize("scale_up", ["fluid", "packet"])
@pytest.mark.parametrize("plan_path", shipped_plans())
def test_shipped_plans_complete_and_agree_with_flow(driver: str, plan_path: str,
                                                    scale_up: str) -> None:
    from xsim_adapters.backends.flow import FlowBackend
    from xsim_adapters.feasibility import load_plan
    from xsim_adapters.topology import build_topology
    from xsim_adapters.workload import generate

    plan = load_plan(plan_path)
    trace = generate(plan)
    if trace.num_ranks > 16:
        pytest.skip(f"{Path(plan_path).name}: {trace.num_ranks} GPUs (> 16)")
    topo = build_topology(plan)
    if plan.num_nodes < 2:
        pytest.skip(f"{Path(plan_path).name}: one server, no flow crosses the network")
    moved = int(trace.flows()["bytes"].sum())
    if scale_up == "packet" and moved > 10**12 and not os.environ.get("XSIM_HTSIM_SLOW"):
        pytest.skip(f"{Path(plan_path).name}: {moved / 1e12:.1f} TB per iteration takes minutes"
                    " packet by packet; set XSIM_HTSIM_SLOW=1 to run it")
    tl = run(trace, topo, driver, scale_up=scale_up)
    assert tl.stats["flows"] > 0
    assert (tl.stats["fluid_flows"] > 0) == (scale_up == "fluid")
    flow = FlowBackend().run(trace, topo, {})
    # scale_up only changes the links inside a server: the flows between servers are packets
    # in both modes (headers, ACKs, ECN/PFC dynamics), so both are held to the same 3%; the
    # worst measured is pcie-rtx4090 (its fp32 DP rings cross the network): fluid +1.0%
    tol = 0.03
    assert abs(tl.makespan_ns - flow.makespan_ns) <= tol * flow.makespan_ns, (
        Path(plan_path).name, tl.makespan_ns, flow.makespan_ns)
