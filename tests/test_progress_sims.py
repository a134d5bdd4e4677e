"""ns-3 and htsim relay their replay's progress through the backend hook (ns-3: a pipe from
the worker's engine; htsim: the driver's stderr) and report what they simulated as packets vs
fluid and their start-up vs replay time (the run info of the backend contract)."""

from __future__ import annotations

import time

import pytest
from helpers.htsim import golden_case
from helpers.ns3 import HAVE_NS3, TraceBuilder, star_topology

from xsim_adapters.backends.base import check_run_info, flow_totals

MiB = 1 << 20


def record() -> tuple[list[tuple[int, int, float | None]], object]:
    calls: list[tuple[int, int, float | None]] = []

    def hook(done: int, total: int, sim_ns: float | None = None) -> None:
        calls.append((done, total, sim_ns))

    return calls, hook


def check_progress(calls, n: int, makespan_ns: float) -> None:
    """Starts at 0 ops and simulated time 0, never goes back, ends at n ops at the makespan."""
    assert calls[0] == (0, n, 0.0)
    assert calls[-1][:2] == (n, n) and calls[-1][2] == pytest.approx(makespan_ns, abs=1.0)
    done = [c[0] for c in calls]
    sims = [c[2] for c in calls]
    assert done == sorted(done) and sims == sorted(sims)
    assert all(c[1] == n for c in calls)


def check_times(stats: dict, wall_s: float) -> None:
    assert stats["startup_s"] > 0 and stats["replay_s"] > 0
    assert stats["startup_s"] + stats["replay_s"] <= stats["wall_s"] <= wall_s


@pytest.mark.ns3
@pytest.mark.skipif(not HAVE_NS3, reason="the ns-3 wheel is not installed (pip install ns3)")
def test_ns3_worker_reports_progress_and_run_info() -> None:
    from xsim_ns3 import Ns3Backend

    topo = star_topology(2, 2)  # ranks 0, 1 on server 0; 2, 3 on server 1
    tb = TraceBuilder(4)
    a = tb.flow(0, 1, 2 * MiB)  # NVLink only: fluid under scale_up=fluid
    b = tb.flow(0, 2, 1 * MiB, deps=(a,))  # through the NICs: packets
    prev = b
    for _ in range(200):  # enough completions for the engine's periodic check to run
        prev = tb.compute(3, 1000, deps=(prev,))
    trace = tb.build()
    calls, hook = record()
    t0 = time.perf_counter()
    tl = Ns3Backend().run(trace, topo, {"progress": hook, "transport": "udp"})
    wall = time.perf_counter() - t0
    # ReplayProgress.start() is never called in the parent: (0, n, 0) came from the worker
    check_progress(calls, trace.num_ops, tl.makespan_ns)
    st = tl.stats
    assert (st["packet_flows"], st["packet_bytes"]) == (1, MiB)
    assert (st["fluid_flows"], st["fluid_bytes"]) == (1, 2 * MiB)
    assert flow_totals(trace) == (2, 3 * MiB)
    check_run_info("ns3", trace, st)
    check_times(st, wall)
    # start-up holds the import of ns-3 in the worker, timed there
    assert st["startup_s"] >= st["import_s"]


@pytest.mark.htsim
@pytest.mark.parametrize("scale_up", ["fluid", "packet"])
def test_htsim_driver_reports_progress_and_run_info(driver: str, scale_up: str) -> None:
    from xsim_htsim import HtsimBackend

    trace, topo = golden_case()
    calls, hook = record()
    t0 = time.perf_counter()
    tl = HtsimBackend().run(trace, topo, {"driver": driver, "progress": hook,
                                          "scale_up": scale_up})
    wall = time.perf_counter() - t0
    check_progress(calls, trace.num_ops, tl.makespan_ns)
    st = tl.stats
    check_run_info("htsim", trace, st)
    check_times(st, wall)
    # 26 flows: 24 cross the network with bytes, 6 of them on scale-up links only
    flows, nbytes = flow_totals(trace)
    assert flows == 26
    packets = 18 if scale_up == "fluid" else 24
    assert (st["packet_flows"], st["fluid_flows"]) == (packets, flows - packets)
    assert st["packet_flows"] == st["flows"]  # what the driver itself started as transport flows
    assert st["packet_bytes"] + st["fluid_bytes"] == nbytes
