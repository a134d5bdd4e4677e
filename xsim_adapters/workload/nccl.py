"""NCCL's cost of a ring collective beyond moving its bytes: one home for its constants.

The network simulators move a collective's bytes at the links' rates; what NCCL adds on top is
(a) latency: a base latency per launch plus a latency per ring step, by protocol and link type,
and (b) protocol bandwidth efficiency: LL carries 4 data bytes per 8 on the wire (flag words),
LL128 120 per 128, Simple the whole line; and NVLink itself reaches NCCL's per-link rate, not
the spec rate. NCCL's tuner picks, per call, the protocol with the least predicted time
(``ncclTopoGetAlgoTime``: ``t = latency + bytes / bandwidth``); so does :func:`ring_cost`.

The lowering turns the result into one timed delay per ring member, before its first send
(``extra_ns``): the latency plus the time the protocol's lower bandwidth adds at the ring's
nominal bottleneck rate. The flows still carry exactly the collective's bytes, so a congested
network slows them as before; the delay is a fixed cost (exact on an uncongested network).

Sources (NVIDIA/nccl@5067397, NCCL 2.30.7, as tabled in ``reference/gpu-calibration.md`` §6-7):
``src/graph/tuning.cc`` (``baseLatencies``, ``hwLatencies``, protocol bandwidth factors, the
latency formula) and ``src/graph/topo.h`` (``SM80_NVLINK_BW`` per NVLink).
"""

from __future__ import annotations

from dataclasses import dataclass

PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc baseLatencies[Ring] (LL, LL128, Simple), microseconds per collective call.
RING_BASE_LATENCY_US = (6.6, 14.0, 8.4)
# tuning.cc hwLatencies[hw][Ring] (LL, LL128, Simple), microseconds per ring step.
RING_STEP_LATENCY_US = {
    "nvlink": (0.6, 1.9, 3.4),
    "pci": (1.0, 2.5, 5.7),
    "net": (2.7, 4.0, 14.0),
}
# tuning.cc: Ring LL bus bandwidth = 0.5 x busBw (half of every LL line is flags); Ring LL128
# = 0.92 x busBw; Simple = busBw. Dimensionless.
PROTOCOL_BW_FACTOR = (0.5, 0.92, 1.0)
# topo.h SM80_NVLINK_BW = 20.0 GB/s per NVLink that carries 25 GB/s per direction (NVLink3,
# Ampere blog): NCCL's rings reach 20/25 of the spec NVLink rate. Dimensionless.
NVLINK_BW_EFFICIENCY = 20.0 / 25.0
# tuning.cc: a multi-node Simple ring all-reduce with >= 64 bytes per rank and channel has its
# latency x1.4 on >= SM80. Dimensionless.
NET_SIMPLE_LATENCY_FACTOR = 1.4


@dataclass(frozen=True)
class RingCost:
    """NCCL's cost of one ring collective beyond the network time at nominal link rates."""

    protocol: str
    latency_ns: float  # base + per-step latency
    bandwidth_ns: float  # extra time from protocol and NVLink efficiency at the nominal rate

    @property
    def total_ns(self) -> float:
        return self.latency_ns + self.bandwidth_ns

    @property
    def extra_ns(self) -> int:
        """The delay the lowering adds before each member's first send, ns."""
        return int(round(self.latency_ns + self.bandwidth_ns))


def ring_steps(kind: str, n: int) -> int:
    """Ring steps of a collective over ``n`` ranks (all-reduce 2(n-1), otherwise n-1)."""
    if n < 2:
        return 0
    return 2 * (n - 1) if kind == "all_reduce" else n - 1


def ring_cost(kind: str, n: int, nbytes: int, servers: int, bottleneck_GBps: float,
              bottleneck_link: str, channels: int = 1) -> RingCost:
    """NCCL's protocol choice and extra cost for a ring ``kind`` of ``nbytes`` (per rank) over
    ``n`` ranks on ``servers`` servers, whose slowest hop runs at ``bottleneck_GBps`` (nominal)
    over a link of type ``bottleneck_link`` (``nvlink``, ``pci`` or ``net``).

    Latency (tuning.cc): ``base + (steps - inter)·intra + inter·net`` with ``inter`` =
    2(servers-1) for an all-reduce and servers-1 otherwise (steps that cross servers).
    Bandwidth: each rank sends ``steps/n·S`` bytes at ``bottleneck x efficiency x factor``.
    """
    steps = ring_steps(kind, n)
    if steps == 0 or nbytes <= 0:
        return RingCost("Simple", 0.0, 0.0)
    inter = 0 if servers < 2 else (2 if kind == "all_reduce" else 1) * (servers - 1)
    intra_link = "nvlink" if bottleneck_link == "net" else bottleneck_link
    eff = NVLINK_BW_EFFICIENCY if bottleneck_link == "nvlink" else 1.0
    nominal_ns = steps / n * nbytes / bottleneck_GBps  # bytes / (GB/s) = ns
    best: RingCost | None = None
    for p, name in enumerate(PROTOCOLS):
        lat_us = (RING_BASE_LATENCY_US[p]
                  + (steps - inter) * RING_STEP_LATENCY_US[intra_link][p]
                  + inter * RING_STEP_LATENCY_US["net"][p])
        if (name == "Simple" and servers > 1 and kind == "all_reduce"
                and nbytes / (channels * n) >= 64):
            lat_us *= NET_SIMPLE_LATENCY_FACTOR
        bw_ns = nominal_ns / (eff * PROTOCOL_BW_FACTOR[p]) - nominal_ns
        cost = RingCost(name, lat_us * 1e3, bw_ns)
        if best is None or cost.total_ns < best.total_ns:
            best = cost
    assert best is not None
    return best
