"""HtsimBackend: write the driver input, run the driver, read per-op times into a Timeline."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xsim_adapters.backend_api import (
    PROGRESS,
    PROGRESS_INTERVAL_S,
    SEED,
    Backend,
    BackendError,
    BackendUnavailable,
    Option,
    ReplayProgress,
    Timeline,
    Topology,
    Trace,
    check_options,
    compute_bound_ns,
    flow_totals,
    owned_tempdir,
    refuse_connection_limit,
)

from ._driver import find_driver, run_driver
from ._input import write_input
from ._output import read_queues, read_summary, read_times
from ._transport import transport_label, write_transport

PROTOCOLS = ("roce", "ndp", "eqds")
# htsim stores a packet's size in 16 bits and a RoCE packet is the MTU plus a 64-byte header
# (RocePacket::ACKSIZE): --mtu 65535 crashed the driver (SIGSEGV, measured).
MAX_MTU = 65535 - 64
SCALE_UP_MODES = ("fluid", "packet")

OPTIONS: tuple[Option, ...] = (
    Option("protocol", "str", "roce", "transport simulated as packets", choices=PROTOCOLS),
    Option("scale_up", "str", "fluid", "fluid: a flow whose whole path is scale-up links is a"
           " max-min fair share of those links; packet: every flow is packets",
           choices=SCALE_UP_MODES),
    Option("mtu", "int", None, "packet size on NIC/fabric links in bytes (None: the driver's"
           " 9000; at most 65471: htsim's 16-bit packet size holds the MTU plus RoCE's 64-byte"
           " header)", low=256, high=MAX_MTU),
    Option("queue_bytes", "int", None, "switch queue capacity in bytes (None: deep for RoCE,"
           " 15 packets for NDP and EQDS)", low=1),
    Option("cwnd_pkts", "int", None, "NDP/EQDS initial window in packets (None: 1.5x the"
           " route's bandwidth-delay product)", low=1),
    Option("ack_every", "int", None, "RoCE: the receiver acknowledges every k-th packet and"
           " the last (None: every packet, htsim's RoceSink); fewer events at a measured error"
           " (docs/htsim.md)", low=1, high=1 << 20),
    SEED,
    Option("wall_limit_s", "float", None, "stop the driver after this many wall-clock seconds"
           " (None: no limit)", low=0, low_open=True),
    Option("driver", "path", None, "path of the xsim-htsim driver binary (None: search"
           " XSIM_HTSIM_DRIVER, PATH, the source checkout)"),
    Option("work_dir", "path", None, "keep the driver's input and output files in this"
           " directory (None: a temporary directory, removed)"),
    PROGRESS,
)


class HtsimBackend(Backend):
    """Packet-level replay on htsim through the project's own C++ driver.

    Options: :data:`OPTIONS` (``xsim backends`` lists them); ``progress``: the backend progress
    hook, fed from the driver's progress lines on stderr (``--progress-s``).
    """

    name = "htsim"
    options = OPTIONS

    @classmethod
    def available(cls, options: Mapping[str, Any] | None = None) -> tuple[bool, str]:
        """Whether the driver is found: the ``driver`` option if given, else the search."""
        path, reason = find_driver((options or {}).get("driver"))
        return (path is not None), reason

    def run(self, trace: Trace, topology: Topology, options: Mapping[str, Any]) -> Timeline:
        """Replay ``trace`` on ``topology``; times in the Timeline are nanoseconds."""
        opts = check_options(self.name, self.options, options)
        refuse_connection_limit(self.name, topology.connection_limit)
        driver, reason = find_driver(opts["driver"])
        if driver is None:
            raise BackendUnavailable(reason)
        protocol, scale_up = opts["protocol"], opts["scale_up"]
        argv_opts = ["--protocol", protocol, "--scale-up", scale_up]
        if opts["ack_every"] is not None and opts["ack_every"] > 1 and protocol != "roce":
            raise BackendError(f"htsim: option ack_every applies to protocol roce only (got"
                               f" protocol {protocol})")
        for key, flag in (("mtu", "--mtu"), ("queue_bytes", "--queue-bytes"),
                          ("cwnd_pkts", "--cwnd-pkts"), ("ack_every", "--ack-every")):
            if opts[key] is not None:
                argv_opts += [flag, str(opts[key])]
        argv_opts += ["--seed", str(opts["seed"])]
        wall_limit = opts["wall_limit_s"]

        t0 = time.perf_counter()
        work = opts["work_dir"]
        # Named with this pid and stamped: one left by a SIGKILLed run is removed next time.
        with owned_tempdir("xsim-htsim-") as tmp:
            d = Path(work) if work else Path(tmp)
            d.mkdir(parents=True, exist_ok=True)
            info = write_input(trace, topology, d / "input.bin")
            t1 = time.perf_counter()
            argv = [str(driver), str(d / "input.bin"), "--out", str(d / "times.bin"),
                    "--summary", str(d / "summary.json"), *argv_opts]
            argv += ["--progress-s", str(PROGRESS_INTERVAL_S), "--queues", str(d / "queues.csv")]
            transport = getattr(topology, "transport", None)
            if transport is not None:  # network.transport: PFC, ECN, DCQCN / HPCC (transport.cpp)
                write_transport(transport, topology, d / "transport.txt", protocol,
                                opts["queue_bytes"])
                argv += ["--transport", str(d / "transport.txt")]
            rp = ReplayProgress(opts["progress"], trace.num_ops,
                                expected_sim_ns=compute_bound_ns(trace))
            try:
                replay_started = run_driver(argv, wall_limit,
                                            lambda done, _n, sim_ns: rp.update(done, sim_ns))
            except BackendError as e:
                if protocol == "eqds" and "crashed (SIGABRT)" in str(e) and len(topology.events):
                    raise BackendError(
                        f"{e} (htsim's EQDS aborts in EqdsSrc::processNack when a NACK arrives "
                        "after the ACK that covers it, which a link outage causes; use "
                        "protocol=roce with link events: docs/htsim.md)") from None
                raise
            t2 = time.perf_counter()
            frame = read_times(d / "times.bin", trace.num_ops)
            summary = read_summary(d / "summary.json")
            queues = read_queues(d / "queues.csv", len(topology.links))
        sim_wall = float(summary.get("sim_wall_s", 0.0))
        rp.finish(int(summary.get("sim_ps", 0)) / 1000.0)
        ev = int(summary.get("events", 0))
        # packets: flows crossing the network with bytes, except scale-up-only paths under
        # scale_up=fluid; everything else (those, local copies, empty messages) is fluid
        packet_flows, packet_bytes = info.network_flows, info.network_bytes
        if scale_up == "fluid":
            packet_flows -= info.scale_up_net_flows
            packet_bytes -= info.scale_up_net_bytes
        if int(summary.get("flows", packet_flows)) != packet_flows:
            raise BackendError(
                f"htsim: the driver started {summary.get('flows')} transport flows, but the"
                f" input has {packet_flows} packet flows (internal error)")
        flows, nbytes = flow_totals(trace)
        wall = time.perf_counter() - t0
        # start-up: writing the input, starting the driver, reading it and building the
        # network (up to its first progress line); replay: its event loop, timed by the driver
        startup = (replay_started - t0) if replay_started is not None else (
            t2 - t0 - sim_wall)
        stats = {
            "wall_s": wall,
            "startup_s": max(0.0, min(startup, wall - sim_wall)),
            "replay_s": sim_wall,
            "packet_flows": packet_flows,
            "packet_bytes": packet_bytes,
            "fluid_flows": flows - packet_flows,
            "fluid_bytes": nbytes - packet_bytes,
            "driver_wall_s": t2 - t1,
            "input_write_s": t1 - t0,
            "events": ev,
            "events_per_s": ev / sim_wall if sim_wall > 0 else float("nan"),
            "protocol": protocol,
            "flows": int(summary.get("flows", 0)),
            "scale_up": scale_up,
            "fluid_recomputes": int(summary.get("fluid_recomputes", 0)),
            "link_events": int(summary.get("link_events", 0)),
            "reroutes": int(summary.get("reroutes", 0)),
            "routes": info.routes,
            "sim_ns": int(summary.get("sim_ps", 0)) / 1000.0,
        }
        if transport is not None:
            stats["transport"] = transport_label(transport)
        timeline = Timeline(backend=self.name, frame=frame, stats=stats, link_stats=queues)
        timeline.check_complete(trace)
        return timeline
