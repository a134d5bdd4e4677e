"""Regression: TCP bursts separated by idle time must not time out (delayed ACK vs minimum RTO).

The bug (docs/ns3.md, "Delayed ACKs and the RTO"): with ns-3's default 200 ms delayed-ACK timer
and our 1 ms minimum RTO, a 2 MiB flow at MTU 9000 is 235 segments (234 x 8948 B + 1660 B);
the receiver ACKs every second segment, so the last one waits for the delayed-ACK timer. When
the next flow of the pair starts later than one RTO, the sender's RTO fires first (spurious
timeout), the window drops to one segment, and from then on every lone segment is again ACKed
only after the RTO: one segment per millisecond (the reshard plan's flows took up to 442 ms).

The case: two 400 Gb/s senders into one 200 Gb/s NIC (the reshard plan's H100 -> A100 shape),
each sending three 2 MiB flows; a round ends when both flows have arrived, then rank 2 computes
for 2 ms. Rounds are synchronized so that the bottleneck must carry 4 MiB per round whatever
the sharing (the flow backend's time is then a lower bound for ns-3). How a 2 MiB stream is cut
into segments depends on ACK timing (the engine refills the send buffer as ACKs free it), so
whether its last segment is odd differs between transports; each round therefore also has rank
2 send exactly 3 full segments back to rank 0 (one Send, so always 3 segments: the third waits
for the delayed ACK), which reproduces the bug for both dctcp and tcp. With the old 200 ms timer
this case measured +62% (dctcp, 8 timeouts) and +41% (tcp, 3 timeouts) over the flow backend's
4.51 ms; with the fix +0.17% for both, no timeout.
"""

from __future__ import annotations

import pytest
from helpers.ns3 import TraceBuilder, needs_ns3, star_topology

from xsim_adapters.backends.flow import FlowBackend
from xsim_adapters.errors import BackendError

MiB = 1 << 20
SEGMENT = 9000 - 52  # TCP payload per segment at MTU 9000 (IPv4 20 + TCP 20 + timestamps 12)
GAP_NS = 2_000_000  # idle time between a pair's flows: longer than the 1 ms minimum RTO
ROUNDS = 3

pytestmark = needs_ns3


def two_into_one() -> tuple:
    """Ranks 0, 1 (400 Gb/s NICs) each send ROUNDS x 2 MiB to rank 2 (200 Gb/s), GAP_NS apart."""
    topo = star_topology(3, 1, [400.0, 400.0, 200.0], nic_latency_ns=1000.0)
    tb = TraceBuilder(3)
    prev: tuple[int, ...] = ()
    for k in range(ROUNDS):
        flows = [tb.flow(src, 2, 2 * MiB, prev) for src in (0, 1)]
        flows.append(tb.flow(2, 0, 3 * SEGMENT, prev))
        done = tb.barrier(tuple(flows))
        prev = (tb.compute(2, GAP_NS, (done,)),) if k < ROUNDS - 1 else (done,)
    return topo, tb.build()


@pytest.fixture(scope="module")
def case():
    topo, trace = two_into_one()
    return topo, trace, FlowBackend().run(trace, topo, {})


@pytest.mark.parametrize("transport", ["dctcp", "tcp"])
def test_idle_gaps_between_flows_cause_no_timeouts(case, transport):
    """Within 0.5% of the flow backend, with no timeout and no drop.

    Flow backend: each round both flows share the 200 Gb/s NIC, 4 MiB / 25 B/ns = 167.8 us
    plus 2 us of latency, three rounds and two gaps: 4.51 ms. ns-3 adds TCP/IP headers on the
    bottleneck (52 of 9000 B: 0.6% of the 0.5 ms of transfer, 3 us) and slow start on each
    connection's first flow (a few RTTs of ~5 us): ~20 us of 4.5 ms, 0.5% leaves room. One
    spurious timeout costs at least the 1 ms minimum RTO (+22%), so the bound catches the bug.
    """
    from xsim_ns3 import Ns3Backend

    topo, trace, flow = case
    tl = Ns3Backend().run(trace, topo, {"transport": transport})
    expected = ROUNDS * (4 * MiB / 25.0 + 2000.0) + (ROUNDS - 1) * GAP_NS
    assert flow.makespan_ns == pytest.approx(expected, rel=1e-3)
    assert tl.stats["tcp_timeouts"] == 0
    assert tl.stats["queue_drops"] == 0
    assert flow.makespan_ns <= tl.makespan_ns <= flow.makespan_ns * 1.005, tl.makespan_ns


def test_delayed_ack_timer_must_stay_below_the_rto():
    from xsim_ns3 import parse_options

    assert parse_options({}).del_ack_timeout_us == 10
    with pytest.raises(BackendError, match=r"del_ack_timeout_us must be below min_rto_us=1000"
                                           r" \(got 1000\)"):
        parse_options({"del_ack_timeout_us": 1000})
    slow = parse_options({"del_ack_timeout_us": 400_000, "min_rto_us": 500_000})
    assert (slow.del_ack_timeout_us, slow.min_rto_us) == (400_000, 500_000)
    with pytest.raises(BackendError, match="del_ack_timeout_us: expected an integer >= 1"):
        parse_options({"del_ack_timeout_us": 0})
