"""A flow's ``duration_ns`` is its start latency (trace schema 2) on every engine.

NCCL's per-member delay used to be a timed barrier before a ring's first flows; schema 2 puts
it on the flows. The two forms must give the same end times everywhere: the flow starts when
its predecessors end (``start_ns``), its first byte leaves ``duration_ns`` later, and its end is
that plus the transfer and the path latency.
"""

from __future__ import annotations

import pytest
from helpers.htsim import star
from helpers.ns3 import HAVE_NS3, star_topology

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.trace import KIND_BARRIER, TraceBuilder

DELAY_NS = 7_000
FLOW_BYTES = 1 << 20
GBPS = 100.0
HOP_NS = 500.0  # star(): every cable's latency; a GPU-to-GPU path has two


def _case(folded: bool, extras: bool) -> tuple:
    """compute 3 us -> [timed barrier 7 us ->] 1 MiB flow 0 -> 1 [start latency 7 us] ->
    compute 2 us on rank 1; plus, folded with ``extras``, an empty and a local flow with the
    same latency."""
    tb = TraceBuilder(2)
    c = tb.compute(0, 3_000)
    if folded:
        f = tb.flow(0, 1, FLOW_BYTES, deps=[c], duration_ns=DELAY_NS)
    else:
        b = tb.add(KIND_BARRIER, 0, phase="dp", deps=[c], duration_ns=DELAY_NS)
        f = tb.flow(0, 1, FLOW_BYTES, deps=[b])
    after = tb.compute(1, 2_000, deps=[f])
    extra = []
    if folded and extras:
        extra = [tb.flow(0, 1, 0, deps=[c], duration_ns=DELAY_NS),  # empty: + path latency
                 tb.flow(1, 1, 4096, deps=[c], duration_ns=DELAY_NS)]  # local: latency only
    return tb.build(), f, after, extra


def _check(frames: dict, exact: bool) -> None:
    """``frames``: {folded: timeline frame} of one engine."""
    tl, f, after, extra = frames[True]
    ref, rf, rafter, _ = frames[False]
    assert tl.loc[f, "start_ns"] == pytest.approx(3_000.0, abs=1e-3)  # when its preds end
    tol = 1e-9 if exact else 1e-6
    assert tl.loc[f, "end_ns"] == pytest.approx(ref.loc[rf, "end_ns"], rel=tol)
    assert tl.loc[after, "end_ns"] == pytest.approx(ref.loc[rafter, "end_ns"], rel=tol)
    assert tl.loc[after, "start_ns"] == tl.loc[f, "end_ns"]
    # no faster than the delay, the bytes at line rate and the two hops
    assert tl.loc[f, "end_ns"] >= 3_000 + DELAY_NS + FLOW_BYTES * 8 / GBPS + 2 * HOP_NS - 1e-6


def _run(run, extras: bool = False) -> dict:
    out = {}
    for folded in (True, False):
        trace, f, after, extra = _case(folded, extras)
        out[folded] = (run(trace).frame, f, after, extra)
    return out


@pytest.mark.parametrize("engine", ["python", "native"])
def test_flow_engines_honour_the_start_latency_exactly(engine: str) -> None:
    frames = _run(lambda t: FlowBackend().run(t, star(2, GBPS), {"engine": engine}), True)
    _check(frames, exact=True)
    tl, f, _, (empty, local) = frames[True]
    want = 3_000 + DELAY_NS + FLOW_BYTES * 8 / GBPS + 2 * HOP_NS  # alone on its path
    assert tl.loc[f, "end_ns"] == pytest.approx(want, rel=1e-12)
    assert tl.loc[empty, "end_ns"] == pytest.approx(3_000 + DELAY_NS + 2 * HOP_NS, rel=1e-12)
    assert tl.loc[local, "end_ns"] == pytest.approx(3_000 + DELAY_NS, rel=1e-12)


def test_htsim_honours_the_start_latency(driver: str) -> None:
    from xsim_htsim import HtsimBackend

    # packets (rank 0's cable is a NIC) and fluid (scale-up) paths both wait for the latency
    for tier in ("nic", "scale_up"):
        frames = _run(lambda t, tier=tier: HtsimBackend().run(t, star(2, GBPS, tier=tier),
                                                              {"driver": driver}))
        _check(frames, exact=True)


@pytest.mark.ns3
@pytest.mark.skipif(not HAVE_NS3, reason="the ns-3 wheel is not installed (pip install ns3)")
def test_ns3_honours_the_start_latency() -> None:
    from xsim_ns3 import Ns3Backend

    frames = _run(lambda t: Ns3Backend().run(t, star_topology(2, 1, GBPS), {}))
    _check(frames, exact=False)
