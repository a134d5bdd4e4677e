"""A packet-level replay's progress, from a fake source shaped like ns-3's (issue 31): most
ops complete early, then a few large flows take the rest of the run. The bar counts simulated
time against an estimate there, never goes back, and its elapsed clock moves between reports."""

from __future__ import annotations

import io

import pytest
from helpers.ns3 import TraceBuilder

from xsim_adapters.backends.base import ReplayProgress, compute_bound_ns
from xsim_adapters.report.progress import SIM_FRACTION_CAP, ProgressBar

N = 1000
EXPECTED_NS = 2_000_000.0  # the estimate the source is measured against


def _bar() -> tuple[ProgressBar, io.StringIO]:
    out = io.StringIO()
    bar = ProgressBar(3, "xsim run", stream=out, force=True, min_interval_s=0)
    bar.step("loading")
    return bar, out


def test_simulated_time_moves_the_bar_while_the_op_count_stalls() -> None:
    bar, _ = _bar()
    rp = ReplayProgress(bar.replay_hook("ns3"), N, interval_s=0, expected_sim_ns=EXPECTED_NS)
    rp.start()
    base = bar.done  # 1.0: the replay step started after "loading"
    rp.update(940, 200_000.0)  # 94% of ops after a tenth of the simulated time
    assert bar.done == pytest.approx(base + 0.1)
    seen = [bar.done]
    for k in range(1, 9):  # the tail: a few big flows, simulated time keeps going
        rp.update(940 + k, 200_000.0 + k * 200_000.0)
        seen.append(bar.done)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)  # strictly advancing
    assert bar.done == pytest.approx(base + 0.9)
    assert "948/1,000 ops, sim 1.8 ms" in bar.note
    assert "busiest GPU computes 2 ms" in bar.note


def test_the_bar_never_goes_back_and_waits_below_the_end() -> None:
    bar, _ = _bar()
    hook = bar.replay_hook("ns3")
    base = bar.done
    hook(500, N, sim_ns=1_500_000.0, expected_sim_ns=EXPECTED_NS)
    at = bar.done
    hook(400, N, sim_ns=1_000_000.0, expected_sim_ns=EXPECTED_NS)  # a source that went back
    assert bar.done == at == pytest.approx(base + 0.75)
    hook(999, N, sim_ns=5_000_000.0, expected_sim_ns=EXPECTED_NS)  # past a short estimate
    assert bar.done == pytest.approx(base + SIM_FRACTION_CAP)
    hook(N, N, sim_ns=5_000_000.0, expected_sim_ns=EXPECTED_NS)
    assert bar.done == pytest.approx(base + 1.0)
    # without an estimate the op count is the unit, as for the flow backend
    bar2, _ = _bar()
    hook2 = bar2.replay_hook("flow")
    hook2(250, N, sim_ns=10.0)
    assert bar2.done == pytest.approx(1.25)


def test_replay_progress_clamps_and_passes_the_estimate() -> None:
    calls: list[tuple] = []

    def hook(done, total, sim_ns=None, expected_sim_ns=None):
        calls.append((done, total, sim_ns, expected_sim_ns))

    rp = ReplayProgress(hook, N, interval_s=0, expected_sim_ns=EXPECTED_NS)
    rp.update(10, 500.0)
    rp.update(5, 100.0)  # neither count goes back
    rp.tick()  # nothing new: the same values again (a heartbeat)
    assert calls == [(10, N, 500.0, EXPECTED_NS)] * 3
    old_style = []
    ReplayProgress(lambda d, t: old_style.append((d, t)), N, interval_s=0,
                   expected_sim_ns=EXPECTED_NS).update(3, 1.0)
    assert old_style == [(3, N)]  # hooks that take neither keyword still work


def test_a_tick_redraws_the_elapsed_clock() -> None:
    bar, out = _bar()
    now = [1000.0]
    bar._bar._time = lambda: now[0]  # tqdm's clock, faked: no timed test
    bar._bar.start_t = bar._bar.last_print_t = now[0]
    rp = ReplayProgress(bar.replay_hook("ns3"), N, interval_s=0, expected_sim_ns=EXPECTED_NS)
    rp.update(940, 200_000.0)
    now[0] += 65.0  # a minute without a completion
    before = out.getvalue()
    rp.tick()
    drawn = out.getvalue()[len(before):]
    assert "[01:05]" in drawn and "940/1,000 ops" in drawn


def test_compute_bound_is_the_busiest_rank() -> None:
    tb = TraceBuilder(3)
    a = tb.compute(0, 1000)
    tb.compute(0, 2500, deps=(a,))
    tb.compute(1, 3000)
    tb.flow(1, 2, 1 << 20)
    assert compute_bound_ns(tb.build()) == 3500.0


def test_no_heartbeat_before_the_first_report() -> None:
    calls: list[tuple] = []
    rp = ReplayProgress(lambda d, t, sim_ns=None: calls.append((d, t, sim_ns)), N, interval_s=0)
    rp.tick()
    assert calls == []
    rp.update(0, 0.0)
    rp.tick()
    assert calls == [(0, N, 0.0), (0, N, 0.0)]
