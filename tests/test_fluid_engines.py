"""The two C++ fluid (max-min, progressive filling) engines, cross-tested on the same inputs.

Three engines time scale-up flows as a max-min fair share of their links: the flow backend
(reference: ``xsim_adapters/backends/flow/maxmin.py``), the ns-3 replay engine's fluid model
(``plugins/ns3/xsim_ns3/engine.cpp``, ``FluidResolve``) and the htsim driver's
(``plugins/htsim/driver/fluid.cpp``, ``FluidGroup::resolve``). Both C++ engines solve with the
one shared header ``xsim/maxmin.hpp`` (tested on its own in test_maxmin_header.py), but each
has its own clock and event loop around it. So the same traces run on all three here, and the
C++ engines must agree with the reference within one epsilon:

``CLOCK_NS`` per op: ns-3's clock is integer nanoseconds (htsim's picoseconds are finer); each
engine rounds a flow's completion up to its clock at every rate change and rounds the path
latency to the clock, so an op's end can trail the exact fluid time by at most one tick per
rate change it lived through. The traces below have at most a handful of rate changes per flow.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.htsim import TraceBuilder, star

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.trace.schema import Trace

CLOCK_NS = 1.0  # ns-3's clock tick; an upper bound on htsim's (1 ps) too
MiB = 1 << 20


def cases() -> list[tuple[str, Trace, object, int]]:
    """(name, trace, topology, most rate changes any one flow sees)."""
    out = []
    # Heterogeneous links: GPU 0 (400 Gb/s) sends to GPU 1 (100) and GPU 2 (400): 100 and 300;
    # when the flow to GPU 1 ends the other takes the uplink; a late flow 3 -> 2 then shares
    # GPU 2's downlink.
    tb = TraceBuilder(4)
    tb.flow(0, 1, 2 * MiB)
    tb.flow(0, 2, 12 * MiB)
    c = tb.compute(3, 100_000)
    f3 = tb.flow(3, 2, 4 * MiB)
    tb.dep(c, f3)
    out.append(("hetero", tb.build(), star(4, [400.0, 100.0, 400.0, 400.0], 300.0), 3))
    # Fan-in: three senders into one GPU, started at different times, then a compute.
    tb = TraceBuilder(4)
    a = tb.flow(1, 0, 8 * MiB)
    c1 = tb.compute(2, 20_000)
    b = tb.flow(2, 0, 8 * MiB)
    tb.dep(c1, b)
    c2 = tb.compute(3, 40_000)
    d = tb.flow(3, 0, 4 * MiB)
    tb.dep(c2, d)
    j = tb.barrier()
    tb.dep([a, b, d], j)
    e = tb.compute(0, 1000)
    tb.dep(j, e)
    out.append(("fan-in", tb.build(), star(4, 2400.0, 250.0), 4))
    # Seeded random flows on a star of mixed speeds, each behind its own compute delay.
    rng = np.random.default_rng(11)
    n = 6
    tb = TraceBuilder(n)
    for _ in range(12):
        s, d = (int(x) for x in rng.choice(n, size=2, replace=False))
        delay = tb.compute(s, int(rng.integers(1, 50_000)))
        f = tb.flow(s, d, int(rng.integers(1, 16)) * MiB)
        tb.dep(delay, f)
    out.append(("random", tb.build(), star(n, [900.0, 450.0, 900.0, 200.0, 450.0, 900.0], 500.0),
                12))
    return out


CASES = cases()


def check_against_reference(name: str, trace: Trace, topo, changes: int, tl) -> None:
    ref = FlowBackend().run(trace, topo, {})
    eps = CLOCK_NS * (changes + 1)
    np.testing.assert_allclose(tl.frame["start_ns"], ref.frame["start_ns"], rtol=0, atol=eps,
                               err_msg=name)
    np.testing.assert_allclose(tl.frame["end_ns"], ref.frame["end_ns"], rtol=0, atol=eps,
                               err_msg=name)


@pytest.mark.htsim
@pytest.mark.parametrize(("name", "trace", "topo", "changes"), CASES, ids=[c[0] for c in CASES])
def test_htsim_fluid_engine_equals_the_reference(driver: str, name, trace, topo, changes) -> None:
    from xsim_htsim import HtsimBackend

    tl = HtsimBackend().run(trace, topo, {"driver": driver, "scale_up": "fluid"})
    assert tl.stats["fluid_flows"] == len(trace.flows())  # every flow went through the engine
    check_against_reference(name, trace, topo, changes, tl)


@pytest.mark.ns3
@pytest.mark.slow
@pytest.mark.parametrize(("name", "trace", "topo", "changes"), CASES, ids=[c[0] for c in CASES])
def test_ns3_fluid_engine_equals_the_reference(name, trace, topo, changes) -> None:
    xsim_ns3 = pytest.importorskip("xsim_ns3")
    ok, why = xsim_ns3.Ns3Backend.available()
    if not ok:
        pytest.skip(why)
    tl = xsim_ns3.Ns3Backend().run(trace, topo, {"scale_up": "fluid"})
    assert tl.stats["fluid_flows"] == len(trace.flows()) and tl.stats["packet_flows"] == 0
    check_against_reference(name, trace, topo, changes, tl)
