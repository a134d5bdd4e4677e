"""Options of the ns-3 backend: names, defaults, validation (errors name the option)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from xsim_adapters.errors import BackendError

TRANSPORTS = ("dctcp", "tcp", "udp")
SCALE_UP_MODES = ("fluid", "packet")
HOST_QUEUES = ("fq", "fifo")
MAX_P2P_MTU = 65535
DEFAULT_QUEUE_PACKETS = 1000
# Queued packets cost memory only when present, and payloads are virtual in ns-3.
DEEP_UDP_QUEUE_PACKETS = 1_000_000  # the point-to-point device's limit (and IPv4's total length)


@dataclass(frozen=True)
class Ns3Options:
    """Validated options.

    ``transport``: dctcp (RED step ECN marking), tcp (NewReno over FIFO queues) or udp (paced at
    the path's bottleneck rate: a lossless stand-in when queues are deep).
    ``scale_up``: fluid (flows whose whole path is scale-up links are timed by the C++ engine as a
    max-min fair share of those links, plus path latency) or packet (every flow is packets).
    ``mtu`` (bytes) on NIC/fabric links; ``scale_up_mtu`` (bytes) on scale-up links in packet mode.
    ``queue_packets``: queue-disc capacity per device (0: 1000 for TCP/DCTCP; 1,000,000 for UDP,
    whose lost packets are never resent, so it gets queues deep enough to stand in for a lossless
    fabric); ``ecn_k_packets``: DCTCP marking threshold;
    ``device_queue_packets``: the device's own small FIFO under the queue disc.
    ``host_queue``: the queue disc on a GPU's own NIC for tcp/dctcp: ``fq`` (default: per-flow
    fair queuing, so the pure ACKs of a connection into this GPU do not wait behind the windows
    of its outgoing connections; see docs/ns3.md) or ``fifo`` (one FIFO; udp always uses it).
    ``socket_buffer_bytes``: TCP send/receive buffer (0: twice the largest path's
    bandwidth-delay product, at least 1 MiB). ``min_rto_us``: TCP minimum RTO (µs).
    ``del_ack_timeout_us``: the receiver's delayed-ACK timer (µs); it must stay below
    ``min_rto_us``, else the odd last segment of a burst is ACKed only after the sender's
    retransmission timer fired (ns-3's default timer is 200 ms, see docs/ns3.md).
    ``wall_limit_s``: wall-clock limit of one replay (s). ``sim_limit_ns``: stop the simulator
    at this simulated time (0: none); ops unfinished by then make the run fail.
    """

    transport: str = "dctcp"
    scale_up: str = "fluid"
    mtu: int = 9000
    scale_up_mtu: int = 65000
    queue_packets: int = 0
    ecn_k_packets: float = 30.0
    device_queue_packets: int = 4
    host_queue: str = "fq"
    socket_buffer_bytes: int = 0
    min_rto_us: int = 1000
    del_ack_count: int = 2
    del_ack_timeout_us: int = 10
    wall_limit_s: float = 1800.0
    sim_limit_ns: float = 0.0
    seed: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_options(options: Mapping[str, Any] | None) -> Ns3Options:
    """Validate backend options; unknown names and bad values raise BackendError naming them.

    ``progress`` (a callback other backends accept) is accepted and ignored; any other unknown
    name is rejected so typos do not pass silently.
    """
    opts = dict(options or {})
    # A progress callback the flow backend accepts: the replay runs in a child process that
    # reports no progress, so it is accepted and unused.
    opts.pop("progress", None)
    known = set(Ns3Options.__dataclass_fields__)
    unknown = sorted(set(opts) - known)
    if unknown:
        raise BackendError(
            f"ns3: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    if not opts.get("queue_packets"):
        udp = opts.get("transport") == "udp"
        opts["queue_packets"] = DEEP_UDP_QUEUE_PACKETS if udp else DEFAULT_QUEUE_PACKETS
    o = Ns3Options(**opts)
    if o.transport not in TRANSPORTS:
        raise BackendError(
            f"ns3: option transport must be one of {TRANSPORTS} (got {o.transport!r})"
        )
    if o.host_queue not in HOST_QUEUES:
        raise BackendError(
            f"ns3: option host_queue must be one of {HOST_QUEUES} (got {o.host_queue!r})"
        )
    if o.scale_up not in SCALE_UP_MODES:
        raise BackendError(
            f"ns3: option scale_up must be one of {SCALE_UP_MODES} (got {o.scale_up!r})"
        )
    for name in ("mtu", "scale_up_mtu"):
        v = getattr(o, name)
        if not isinstance(v, int) or not 576 <= v <= MAX_P2P_MTU:
            raise BackendError(f"ns3: option {name} must be an integer in [576, 65535] (got {v!r})")
    for name in ("queue_packets", "device_queue_packets", "min_rto_us", "del_ack_count",
                 "del_ack_timeout_us"):
        v = getattr(o, name)
        if not isinstance(v, int) or v < 1:
            raise BackendError(f"ns3: option {name} must be a positive integer (got {v!r})")
    if o.del_ack_timeout_us >= o.min_rto_us:
        # A delayed ACK that outlasts the RTO makes every burst ending in an odd segment time
        # out spuriously; with cwnd reset to one segment that repeats once per RTO.
        raise BackendError(
            f"ns3: option del_ack_timeout_us must be below min_rto_us={o.min_rto_us}"
            f" (got {o.del_ack_timeout_us!r})"
        )
    if o.ecn_k_packets <= 0 or o.ecn_k_packets >= o.queue_packets:
        raise BackendError(
            f"ns3: option ecn_k_packets must be in (0, queue_packets={o.queue_packets})"
            f" (got {o.ecn_k_packets!r})"
        )
    if o.socket_buffer_bytes < 0 or o.wall_limit_s <= 0 or o.sim_limit_ns < 0:
        raise BackendError(
            "ns3: options socket_buffer_bytes and sim_limit_ns must be >= 0 and wall_limit_s > 0"
            f" (got {o.socket_buffer_bytes!r}, {o.sim_limit_ns!r}, {o.wall_limit_s!r})"
        )
    return o
