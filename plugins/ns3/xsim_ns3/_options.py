"""Options of the ns-3 backend: names, defaults, validation (errors name the option)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from xsim_adapters.backend_api import PROGRESS, SEED, Option, OptionError, check_options

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


OPTIONS: tuple[Option, ...] = (
    Option("transport", "str", "dctcp", "dctcp (RED step ECN), tcp (NewReno over FIFO queues) or"
           " udp (paced at the path's bottleneck rate)", choices=TRANSPORTS),
    Option("scale_up", "str", "fluid", "fluid: all-scale-up flows are a max-min fair share of"
           " their links; packet: every flow is packets", choices=SCALE_UP_MODES),
    Option("mtu", "int", 9000, "packet size on NIC/fabric links (bytes)", low=576,
           high=MAX_P2P_MTU),
    Option("scale_up_mtu", "int", 65000, "packet size on scale-up links in packet mode (bytes)",
           low=576, high=MAX_P2P_MTU),
    Option("queue_packets", "int", 0, "queue-disc capacity per device in packets (0: 1000 for"
           " tcp/dctcp, 1,000,000 for udp)", low=0),
    Option("ecn_k_packets", "float", 30.0, "DCTCP marking threshold (packets, below"
           " queue_packets)", low=0, low_open=True),
    Option("device_queue_packets", "int", 4, "the device's own FIFO under the queue disc"
           " (packets)", low=1),
    Option("host_queue", "str", "fq", "queue disc on a GPU's NIC for tcp/dctcp: per-flow fair"
           " queuing or one FIFO", choices=HOST_QUEUES),
    Option("socket_buffer_bytes", "int", 0, "TCP send/receive buffer in bytes (0: twice the"
           " largest path's bandwidth-delay product, at least 1 MiB)", low=0),
    Option("min_rto_us", "int", 1000, "TCP minimum retransmission timeout (us)", low=1),
    Option("del_ack_count", "int", 2, "segments per delayed ACK", low=1),
    Option("del_ack_timeout_us", "int", 10, "delayed-ACK timer (us, below min_rto_us)", low=1),
    Option("wall_limit_s", "float", 1800.0, "wall-clock limit of one replay (s)", low=0,
           low_open=True),
    Option("sim_limit_ns", "float", 0.0, "stop the simulator at this simulated time (ns; 0:"
           " none)", low=0),
    SEED,
    PROGRESS,
)


def parse_options(options: Mapping[str, Any] | None) -> Ns3Options:
    """Validate backend options (:data:`OPTIONS`, through the shared
    :func:`xsim_adapters.options.check_options`), then the rules that tie two options together;
    errors name the option.

    ``progress`` (the backend progress hook) is not part of the result: the backend reads it
    from ``options`` itself.
    """
    opts = check_options("ns3", OPTIONS, options)
    opts.pop("progress")
    if not opts["queue_packets"]:
        udp = opts["transport"] == "udp"
        opts["queue_packets"] = DEEP_UDP_QUEUE_PACKETS if udp else DEFAULT_QUEUE_PACKETS
    o = Ns3Options(**opts)
    if o.del_ack_timeout_us >= o.min_rto_us:
        # A delayed ACK that outlasts the RTO makes every burst ending in an odd segment time
        # out spuriously; with cwnd reset to one segment that repeats once per RTO.
        raise OptionError(
            f"ns3: option del_ack_timeout_us must be below min_rto_us={o.min_rto_us}"
            f" (got {o.del_ack_timeout_us!r})"
        )
    if o.ecn_k_packets >= o.queue_packets:
        raise OptionError(
            f"ns3: option ecn_k_packets must be in (0, queue_packets={o.queue_packets})"
            f" (got {o.ecn_k_packets!r})"
        )
    return o
