"""HtsimBackend: write the driver input, run the driver, read per-op times into a Timeline."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xsim_adapters._proc import owned_tempdir
from xsim_adapters.backends.base import Backend, Timeline
from xsim_adapters.errors import BackendError, BackendUnavailable
from xsim_adapters.topology.model import Topology
from xsim_adapters.trace.schema import Trace

from ._driver import find_driver, run_driver
from ._input import write_input
from ._output import read_summary, read_times

PROTOCOLS = ("roce", "ndp", "eqds")
SCALE_UP_MODES = ("fluid", "packet")
KNOWN_OPTIONS = (
    "driver", "protocol", "scale_up", "mtu", "queue_bytes", "cwnd_pkts", "seed", "wall_limit_s",
    "work_dir",
)


def _positive_int(options: Mapping[str, Any], key: str, minimum: int = 1) -> int | None:
    if options.get(key) is None:
        return None
    v = options[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise BackendError(f"htsim: option {key} must be an integer >= {minimum} (got {v!r})")
    return v


class HtsimBackend(Backend):
    """Packet-level replay on htsim through the project's own C++ driver.

    Options (all optional): ``protocol`` (``roce`` default, ``ndp`` or ``eqds``), ``scale_up``
    (``fluid`` default: a flow whose whole path is scale-up links is a max-min fair share of
    those links in the driver, as in the flow and ns-3 backends; ``packet``: every flow is
    packets), ``mtu`` (bytes, default 9000), ``queue_bytes`` (switch queue capacity; default
    deep for RoCE, 15 packets for NDP and EQDS),
    ``cwnd_pkts`` (NDP/EQDS initial window; default 1.5x the route's bandwidth-delay product),
    ``seed`` (default 1), ``wall_limit_s`` (stop the driver after this many wall seconds),
    ``driver`` (path of the driver binary), ``work_dir`` (keep input and output files there).
    """

    name = "htsim"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        path, reason = find_driver()
        return (path is not None), reason

    def run(self, trace: Trace, topology: Topology, options: Mapping[str, Any]) -> Timeline:
        """Replay ``trace`` on ``topology``; times in the Timeline are nanoseconds."""
        options = dict(options or {})
        driver, reason = find_driver(options.get("driver"))
        if driver is None:
            raise BackendUnavailable(reason)
        protocol = options.get("protocol") or "roce"
        if protocol not in PROTOCOLS:
            raise BackendError(
                f"htsim: option protocol must be one of {', '.join(PROTOCOLS)} (got {protocol!r})"
            )
        scale_up = options.get("scale_up") or "fluid"
        if scale_up not in SCALE_UP_MODES:
            raise BackendError(
                f"htsim: option scale_up must be one of {', '.join(SCALE_UP_MODES)}"
                f" (got {scale_up!r})"
            )
        events = getattr(topology, "events", None)
        if events is not None and len(events):
            raise BackendError(
                f"htsim: the topology has {len(events)} timed link events (network.events);"
                " the htsim driver does not model link changes during a run: use the flow or"
                " ns3 backend for this plan"
            )
        argv_opts = ["--protocol", protocol, "--scale-up", scale_up]
        for key, flag, minimum in (
            ("mtu", "--mtu", 256), ("queue_bytes", "--queue-bytes", 1),
            ("cwnd_pkts", "--cwnd-pkts", 1), ("seed", "--seed", 0),
        ):
            v = _positive_int(options, key, minimum)
            if v is not None:
                argv_opts += [flag, str(v)]
        wall_limit = options.get("wall_limit_s")
        if wall_limit is not None and not (isinstance(wall_limit, int | float) and wall_limit > 0):
            raise BackendError(
                f"htsim: option wall_limit_s must be > 0 seconds (got {wall_limit!r})"
            )

        t0 = time.perf_counter()
        work = options.get("work_dir")
        # Named with this pid and stamped: one left by a SIGKILLed run is removed next time.
        with owned_tempdir("xsim-htsim-") as tmp:
            d = Path(work) if work else Path(tmp)
            d.mkdir(parents=True, exist_ok=True)
            info = write_input(trace, topology, d / "input.txt")
            t1 = time.perf_counter()
            argv = [str(driver), str(d / "input.txt"), "--out", str(d / "times.csv"),
                    "--summary", str(d / "summary.json"), *argv_opts]
            run_driver(argv, wall_limit)
            t2 = time.perf_counter()
            frame = read_times(d / "times.csv", trace.num_ops)
            summary = read_summary(d / "summary.json")
        sim_wall = float(summary.get("sim_wall_s", 0.0))
        ev = int(summary.get("events", 0))
        stats = {
            "wall_s": time.perf_counter() - t0,
            "driver_wall_s": t2 - t1,
            "input_write_s": t1 - t0,
            "events": ev,
            "events_per_s": ev / sim_wall if sim_wall > 0 else float("nan"),
            "protocol": protocol,
            "flows": int(summary.get("flows", 0)),
            "scale_up": scale_up,
            "fluid_flows": int(summary.get("fluid_flows", 0)),
            "fluid_recomputes": int(summary.get("fluid_recomputes", 0)),
            "routes": info.routes,
            "sim_ns": int(summary.get("sim_ps", 0)) / 1000.0,
        }
        timeline = Timeline(backend=self.name, frame=frame, stats=stats)
        timeline.check_complete(trace)
        return timeline
