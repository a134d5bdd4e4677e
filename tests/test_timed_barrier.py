"""A barrier with ``duration_ns`` > 0 (NCCL's collective delay) is a timer on every backend."""

from __future__ import annotations

import pytest
from helpers.htsim import star
from helpers.ns3 import HAVE_NS3, star_topology

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.trace import KIND_BARRIER, TraceBuilder

DELAY_NS = 7_000
FLOW_BYTES = 1 << 20


def _case() -> tuple:
    """compute 3 us -> timed barrier 7 us -> a 1 MiB flow 0 -> 1."""
    tb = TraceBuilder(2)
    c = tb.compute(0, 3_000)
    b = tb.add(KIND_BARRIER, 0, phase="dp", deps=[c], duration_ns=DELAY_NS)
    f = tb.flow(0, 1, FLOW_BYTES, deps=[b])
    return tb.build(), b, f


def _check(frame, b: int, f: int) -> None:
    assert frame.loc[b, "start_ns"] == pytest.approx(3_000.0, abs=1e-3)
    assert frame.loc[b, "end_ns"] - frame.loc[b, "start_ns"] == pytest.approx(DELAY_NS, abs=1e-3)
    assert frame.loc[f, "start_ns"] == pytest.approx(10_000.0, abs=1e-3)


def test_flow_backend_times_the_barrier() -> None:
    trace, b, f = _case()
    _check(FlowBackend().run(trace, star(2, 100.0), {}).frame, b, f)


def test_htsim_times_the_barrier(driver: str) -> None:
    from xsim_htsim import HtsimBackend

    trace, b, f = _case()
    _check(HtsimBackend().run(trace, star(2, 100.0), {"driver": driver}).frame, b, f)


@pytest.mark.ns3
@pytest.mark.skipif(not HAVE_NS3, reason="the ns-3 wheel is not installed (pip install ns3)")
def test_ns3_times_the_barrier() -> None:
    from xsim_ns3 import Ns3Backend

    trace, b, f = _case()
    _check(Ns3Backend().run(trace, star_topology(2, 1, 100.0), {}).frame, b, f)
