"""The ns-3 side of a replay: runs inside the worker process only (imports ns-3 and cppyy).

Builds the network from the prepared arrays (nodes, point-to-point cables, queue discs, pair
addresses, host routes, persistent connections), loads the DAG into the C++ engine and runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from xsim_adapters.backend_api import NATIVE_INCLUDE_DIR, PROGRESS_INTERVAL_S

TRANSPORT_CODE = {"dctcp": 0, "tcp": 1, "udp": 2}
#: Environment variable naming the file descriptor the worker writes progress lines to.
PROGRESS_FD_ENV = "XSIM_NS3_PROGRESS_FD"
_ENGINE_SOURCE = Path(__file__).with_name("engine.cpp")


#: The ns-3 modules engine.cpp includes: only their libraries and headers are loaded (their
#: dependencies, e.g. stats and bridge, come with the libraries). The wheel's own loader
#: (``from ns import ns``) parses every module's headers (wifi, lte, ...), 10.5 CPU s per worker
#: against 2.3 for these five (measured on the 2-core CI machine, ns3 3.44 wheel).
ENGINE_MODULES = ("core", "network", "traffic-control", "internet", "point-to-point")


def _wheel_prefix() -> Path | None:
    """The ns3 wheel's install prefix (holding ``include/`` and ``lib64/`` or ``lib/``)."""
    import importlib.util

    spec = importlib.util.find_spec("ns3")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / "include" / "ns3").is_dir():
            return Path(loc)
    return None


def _module_library(prefix: Path, module: str) -> Path | None:
    for libdir in ("lib64", "lib"):
        found = sorted((prefix / libdir).glob(f"libns3*-{module}.so"))
        if found:
            return found[0]
    return None


def _load_engine_modules() -> bool:
    """Load the ENGINE_MODULES libraries, then their headers, into cppyy; False (nothing
    loaded) when the wheel's layout is not the one expected, so the caller uses the wheel's
    own loader. Libraries first, so the headers' static initializers find their symbols."""
    import cppyy
    import libcppyy

    prefix = _wheel_prefix()
    libs = [_module_library(prefix, m) for m in ENGINE_MODULES] if prefix else [None]
    if prefix is None or any(lib is None for lib in libs):
        return False
    libcppyy.AddSmartPtrType("Ptr")  # as the wheel's loader does
    cppyy.add_include_path(str(prefix / "include"))
    for lib in libs:
        cppyy.add_library_path(str(lib.parent))  # type: ignore[union-attr]
        cppyy.load_library(str(lib))
    for m in ENGINE_MODULES:
        cppyy.include(f"ns3/{m}-module.h")
    return True


def load_ns() -> Any:
    """Load ns-3 and define the engine once per process (cppdef twice is a redefinition);
    returns the engine's namespace (``xsim``)."""
    import cppyy

    if not hasattr(cppyy.gbl, "xsim") or not hasattr(cppyy.gbl.xsim, "Engine"):
        if not _load_engine_modules():
            from ns import ns  # noqa: F401  (the wheel's loader: every module)
        cppyy.add_include_path(str(_ENGINE_SOURCE.parent))  # engine_whatif.h beside it
        cppyy.add_include_path(str(NATIVE_INCLUDE_DIR))  # xsim/maxmin.hpp, shared with the core
        cppyy.cppdef(_ENGINE_SOURCE.read_text())
    return cppyy.gbl.xsim


def _i64(a: np.ndarray) -> np.ndarray:
    # cppyy cannot turn an empty buffer into a pointer: pad (the length is passed separately).
    return np.ascontiguousarray(a if len(a) else np.zeros(1), dtype=np.int64)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a if len(a) else np.zeros(1), dtype=np.float64)


def replay(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray,
                                                                          dict[str, Any]]:
    """Build, run, and return (start_ns, end_ns, stats); unfinished ops have NaN times."""
    t_import = time.perf_counter()
    xsim = load_ns()
    import_s = time.perf_counter() - t_import
    opts = meta["options"]
    transport = TRANSPORT_CODE[opts["transport"]]

    t_build = time.perf_counter()
    xsim.Configure(transport, int(meta["socket_buffer_bytes"]), int(opts["min_rto_us"]),
                   int(opts["seed"]), int(opts["del_ack_count"]),
                   int(opts["del_ack_timeout_us"]))
    xsim.CreateNodes(int(meta["num_nodes"]))
    eng = xsim.Engine()
    qdisc = 0 if opts["transport"] == "dctcp" else 1
    # UDP sends no ACKs and paces each pair at its bottleneck: its NIC queue stays a FIFO.
    host_fq = int(opts["host_queue"] == "fq" and opts["transport"] != "udp")
    ca, cb = arrays["cable_a"], arrays["cable_b"]
    ab, ba = arrays["cable_bps_ab"], arrays["cable_bps_ba"]
    delay, mtu = arrays["cable_delay_ns"], arrays["cable_mtu"]
    host_a, host_b = arrays["cable_host_a"], arrays["cable_host_b"]
    for i in range(len(ca)):
        eng.AddCable(int(ca[i]), int(cb[i]), float(ab[i]), float(ba[i]), int(delay[i]),
                     int(mtu[i]), int(opts["device_queue_packets"]), qdisc,
                     int(opts["queue_packets"]), float(opts["ecn_k_packets"]),
                     int(host_a[i]), int(host_b[i]), host_fq)
    for c, s, v in zip(arrays["addr_cable"], arrays["addr_side"], arrays["addr_value"],
                       strict=True):
        eng.AddPairAddress(int(c), int(s), int(v))
    if len(arrays["route_cable"]):
        eng.AddRoutes(len(arrays["route_cable"]), _i64(arrays["route_cable"]),
                      _i64(arrays["route_side"]), _i64(arrays["route_addr"]))
    for i in range(len(arrays["conn_src"])):
        eng.AddConn(int(arrays["conn_src"][i]), int(arrays["conn_dst"][i]),
                    int(arrays["conn_daddr"][i]),
                    int(arrays["conn_port"][i]), transport, int(arrays["conn_mtu"][i]),
                    float(arrays["conn_pace_bps"][i]))
    n = len(arrays["kind"])
    kind, dur, nbytes, conn = (_i64(arrays[k]) for k in ("kind", "dur", "bytes", "conn"))
    sptr, sidx, pending = (_i64(arrays[k]) for k in ("sptr", "sidx", "pending"))
    eng.LoadDag(n, kind, dur, nbytes, conn, len(sidx), sptr, sidx, pending)
    fcap, fptr, flinks = _f64(arrays["fluid_cap"]), _i64(arrays["fluid_ptr"]), _i64(
        arrays["fluid_links"])
    eng.LoadFluid(len(fcap), fcap, len(flinks), fptr, flinks, _f64(arrays["fluid_lat"]))
    for at, fluid, index, side, value in zip(
        arrays["event_at_ns"], arrays["event_fluid"], arrays["event_index"], arrays["event_side"],
        arrays["event_value"], strict=True,
    ):
        eng.AddLinkEvent(int(at), int(fluid), int(index), int(side), float(value))
    _load_whatif(eng, arrays, n)
    build_s = time.perf_counter() - t_build
    # The parent's end of a pipe (see _backend.Ns3Backend._spawn): the engine reports progress.
    fd = int(os.environ.get(PROGRESS_FD_ENV, "-1"))
    eng.SetProgress(fd, PROGRESS_INTERVAL_S)

    t_run = time.perf_counter()
    sim_now = int(xsim.RunSimulation(eng, float(opts["sim_limit_ns"])))
    run_s = time.perf_counter() - t_run
    start = np.empty(n, np.float64)
    end = np.empty(n, np.float64)
    eng.Results(start, end)
    events = int(xsim.EventCount())
    stats = {
        "import_s": import_s,
        "build_s": build_s,
        "run_s": run_s,
        "events": events,
        "events_per_s": events / run_s if run_s > 0 else 0.0,
        "packets_received": int(eng.PacketsReceived()),
        "fluid_recomputes": int(eng.fluidRecomputes),
        "tcp_timeouts": int(eng.TcpTimeouts()),
        "queue_drops": int(eng.queueDrops),
        "sim_time_ns": sim_now,
        "engine_error": str(eng.error),
        "ops_done": int(eng.done),
        "reroutes_applied": int(eng.reroute.applied),
        "queue_stats": _queue_stats(eng, len(ca), float(sim_now)),
    }
    return start, end, stats


def _load_whatif(eng: Any, arrays: dict[str, np.ndarray], n: int) -> None:
    """Interval slowdowns and reroutes (xsim_ns3/_whatif.py), when the input has them."""
    if len(arrays.get("slow_rank", ())):
        off = arrays["slow_offsets"]
        eng.slow.Load(n, _i64(arrays["slow_rank"]), len(off) - 1, _i64(off),
                      _f64(arrays["slow_lo"]), _f64(arrays["slow_hi"]),
                      _f64(arrays["slow_factor"]))
    hops, moves = len(arrays.get("reroute_at_ns", ())), len(arrays.get("freroute_at_ns", ()))
    if hops or moves:
        eng.reroute.Load(n, _i64(arrays["fluid_pair"]), hops, _i64(arrays["reroute_at_ns"]),
                         _i64(arrays["reroute_cable"]), _i64(arrays["reroute_side"]),
                         _i64(arrays["reroute_addr"]), moves, _i64(arrays["freroute_at_ns"]),
                         _i64(arrays["freroute_pair"]), _i64(arrays["freroute_ptr"]),
                         _i64(arrays["freroute_links"]), _f64(arrays["freroute_lat"]))


def _queue_stats(eng: Any, cables: int, end_ns: float) -> dict[str, np.ndarray]:
    """Per cable end (index 2 * cable + side): the queue disc's peak and mean bytes, drops
    (packets and bytes) and ECN marks over the run."""
    out = {k: np.zeros(max(1, 2 * cables), np.float64)
           for k in ("peak_bytes", "mean_bytes", "drops", "drop_bytes", "marks")}
    if cables:
        eng.queues.Stats(end_ns, out["peak_bytes"], out["mean_bytes"], out["drops"],
                         out["drop_bytes"], out["marks"])
    return {k: v[:2 * cables] for k, v in out.items()}
